// Runs an ONNX model in ONNX Runtime (CPU) on .npy inputs and writes each output as .npy.
//   node run_model.mjs MODEL.onnx --in name=file.npy ... [--out name=file.npy ...] [--threads N]
//                      [--compare name=expected.npy ... --atol A] [--optimization disabled|basic|extended|all]
// With --compare it exits 1 unless every compared output is within A (default 1e-5) of the file.
import ort from 'onnxruntime-node';
import { readNpy, writeNpy } from './npy.mjs';

const args = process.argv.slice(2);
const model = args[0];
const inputs = {}; const outputs = {}; const compare = {}; let threads = 1; let atol = 1e-5; let optimization = 'all';
for (let i = 1; i < args.length; i += 2) {
  const [name, file] = (args[i + 1] ?? '').split('=');
  if (args[i] === '--in') inputs[name] = file;
  else if (args[i] === '--out') outputs[name] = file;
  else if (args[i] === '--compare') compare[name] = file;
  else if (args[i] === '--atol') atol = Number(args[i + 1]);
  else if (args[i] === '--threads') threads = Number(args[i + 1]);
  else if (args[i] === '--optimization') optimization = args[i + 1];  // disabled | basic | extended | all
  else throw new Error(`unknown argument ${args[i]}`);
}
const session = await ort.InferenceSession.create(model, {
  intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: optimization,
});
const feeds = {};
for (const [name, file] of Object.entries(inputs)) {
  const a = readNpy(file);
  feeds[name] = new ort.Tensor(a.type, a.data, a.shape);
}
const result = await session.run(feeds);
for (const [name, file] of Object.entries(outputs)) {
  const t = result[name];
  if (!t) throw new Error(`model has no output '${name}' (outputs: ${Object.keys(result).join(', ')})`);
  writeNpy(file, t.data, t.dims, t.type);
}
let failed = false;
for (const [name, file] of Object.entries(compare)) {
  const got = result[name];
  const want = readNpy(file);
  if (!got || got.data.length !== want.data.length) {
    console.log(`${name}: ONNX Runtime gave ${got ? got.data.length : 0} values, ${file} has ${want.data.length}`);
    failed = true;
    continue;
  }
  let max = 0;
  for (let i = 0; i < want.data.length; ++i) max = Math.max(max, Math.abs(got.data[i] - want.data[i]));
  console.log(`${name}: max |ONNX Runtime - expected| = ${max.toExponential(3)} (tolerance ${atol})`);
  if (!(max <= atol)) failed = true;
}
process.exit(failed ? 1 : 0);
