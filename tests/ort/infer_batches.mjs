// Runs a model in ONNX Runtime (CPU) over a stacked [N, ...] .npy input in batches and writes
// the first output, or its argmax over the last axis (a recognizer's character ids).
//   node infer_batches.mjs MODEL.onnx INPUT.npy OUT.npy [--argmax] [--batch B] [--threads T]
//        [--optimization disabled|basic|extended|all]  (basic: Q/DQ run as written, no integer kernels)
import ort from 'onnxruntime-node';
import { readNpy, writeNpy } from './npy.mjs';

const [model, input, output, ...rest] = process.argv.slice(2);
let argmax = false; let batch = 16; let threads = 2; let optimization = 'all';
for (let i = 0; i < rest.length; ++i) {
  if (rest[i] === '--argmax') argmax = true;
  else if (rest[i] === '--batch') batch = Number(rest[++i]);
  else if (rest[i] === '--threads') threads = Number(rest[++i]);
  else if (rest[i] === '--optimization') optimization = rest[++i];
  else throw new Error(`unknown argument ${rest[i]}`);
}
const session = await ort.InferenceSession.create(model, { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: optimization });
const x = readNpy(input);
const n = x.shape[0]; const per = x.data.length / n;
const parts = []; let outShape = null;
for (let s = 0; s < n; s += batch) {
  const b = Math.min(batch, n - s);
  const t = new ort.Tensor('float32', x.data.subarray(s * per, (s + b) * per), [b, ...x.shape.slice(1)]);
  const y = (await session.run({ [session.inputNames[0]]: t }))[session.outputNames[0]];
  if (argmax) {
    const k = y.dims[y.dims.length - 1]; const rows = y.data.length / k;
    const ids = new Int32Array(rows);
    for (let r = 0; r < rows; ++r) {
      let best = 0;
      for (let j = 1; j < k; ++j) if (y.data[r * k + j] > y.data[r * k + best]) best = j;
      ids[r] = best;
    }
    parts.push(ids);
    outShape = y.dims.slice(1, -1);
  } else {
    parts.push(y.data); outShape = y.dims.slice(1);
  }
}
const total = parts.reduce((a, p) => a + p.length, 0);
const all = argmax ? new Int32Array(total) : new Float32Array(total);
let o = 0;
for (const p of parts) { all.set(p, o); o += p.length; }
writeNpy(output, all, [n, ...outShape]);
