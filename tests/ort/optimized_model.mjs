// Writes the model ONNX Runtime (CPU) actually runs: the graph after its optimizations (QDQ
// fusions into QLinearConv, QGemm, ... included), as an ONNX file, for counting what it fused.
//   node optimized_model.mjs MODEL.onnx OUT.onnx [--optimization basic|extended|all] [--threads N]
import ort from 'onnxruntime-node';

const [model, out, ...rest] = process.argv.slice(2);
if (!model || !out) throw new Error('usage: optimized_model.mjs MODEL.onnx OUT.onnx [--optimization LEVEL]');
let optimization = 'all', threads = 1;
for (let i = 0; i < rest.length; i += 2) {
  if (rest[i] === '--optimization') optimization = rest[i + 1];
  else if (rest[i] === '--threads') threads = Number(rest[i + 1]);
  else throw new Error(`unknown argument ${rest[i]}`);
}
await ort.InferenceSession.create(model, {
  intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: optimization, optimizedModelFilePath: out,
});
