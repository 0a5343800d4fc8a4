// Held-out perplexity of a byte-level language model in ONNX Runtime (npm onnxruntime-node,
// CPU): every window of DIR (one int64 .npy of T tokens each) runs as one sequence; positions
// 0..T-2 predict tokens 1..T-1. Prints {"model", "windows", "perplexity"} as JSON.
//   node bench/llm/ort_perplexity.mjs MODEL.onnx DIR [--batch 32] [--optimization all|basic]
// (basic for float8 Q/DQ, which ONNX Runtime 1.30 refuses to fuse at extended and above)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import ort from '../../tests/ort/node_modules/onnxruntime-node/dist/index.js';
import { readNpy } from '../../tests/ort/npy.mjs';

const args = process.argv.slice(2);
let batch = 32;
let optimization = 'all';
const positional = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--batch') batch = Number(args[++i]);
  else if (args[i] === '--optimization') optimization = args[++i];
  else positional.push(args[i]);
}
if (positional.length !== 2) throw new Error('usage: ort_perplexity.mjs MODEL.onnx DIR [--batch N]');
const [model, dir] = positional;
const files = fs.readdirSync(dir).filter((f) => f.endsWith('.npy')).sort();
const session = await ort.InferenceSession.create(model, { intraOpNumThreads: os.availableParallelism(),
  graphOptimizationLevel: optimization });
let nll = 0, count = 0;
for (let start = 0; start < files.length; start += batch) {
  const xs = files.slice(start, start + batch).map((f) => readNpy(path.join(dir, f)));
  const t = xs[0].shape[0];
  const data = new BigInt64Array(xs.length * t);
  xs.forEach((x, k) => data.set(x.data, k * t));
  const out = await session.run({ [session.inputNames[0]]: new ort.Tensor('int64', data, [xs.length, t]) });
  const logits = out[session.outputNames[0]];
  const v = logits.dims[2];
  for (let b = 0; b < xs.length; ++b) {
    for (let p = 0; p + 1 < t; ++p) {
      const row = logits.data.subarray((b * t + p) * v, (b * t + p + 1) * v);
      let max = -Infinity;
      for (const z of row) max = Math.max(max, z);
      let sum = 0;
      for (const z of row) sum += Math.exp(z - max);
      nll += Math.log(sum) + max - row[Number(data[b * t + p + 1])];
      ++count;
    }
  }
}
console.log(JSON.stringify({ model, windows: files.length, perplexity: Math.exp(nll / count) }));
