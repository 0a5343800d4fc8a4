// ONNX Runtime (npm onnxruntime-node, CPU) FP32 inference over a calibration folder, the
// baseline the calibration time is compared with: the same samples, batched as Sparsebit
// batches them (samples stacked along a new axis 0 when the model's first input dimension is
// symbolic, one sample at a time otherwise), all cores, all graph optimizations. The benchmark
// times it as a whole process (start, reading the samples, running), as it times Sparsebit.
//   node bench/cpu_speed/ort_fp32.mjs MODEL.onnx DIR [--batch 32] [--count 64] [--threads N]
// DIR holds one .npy per sample (sorted by name); single-input models only.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import ort from '../../tests/ort/node_modules/onnxruntime-node/dist/index.js';
import { readNpy } from '../../tests/ort/npy.mjs';

const args = process.argv.slice(2);
const positional = [];
let batch = 32, count = 64, threads = os.availableParallelism();
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--batch') batch = Number(args[++i]);
  else if (args[i] === '--count') count = Number(args[++i]);
  else if (args[i] === '--threads') threads = Number(args[++i]);
  else positional.push(args[i]);
}
if (positional.length !== 2) throw new Error('usage: ort_fp32.mjs MODEL.onnx DIR [--batch N] [--count N] [--threads N]');
const [model, dir] = positional;
const files = fs.readdirSync(dir).filter((f) => f.endsWith('.npy')).sort().slice(0, count);
if (files.length === 0) throw new Error(`${dir}: no .npy files`);
const session = await ort.InferenceSession.create(model, { intraOpNumThreads: threads, interOpNumThreads: 1,
  graphOptimizationLevel: 'all' });
const name = session.inputNames[0];
// Consecutive samples of one shape are stacked up to --batch (samples of many widths, as OCR
// lines are, run in runs of equal width). onnxruntime-node does not expose input shapes: a
// model whose batch is fixed at 1 says so by rejecting a stacked batch, and then runs sample by
// sample.
const samples = files.map((f) => readNpy(path.join(dir, f)));
let stack = batch > 1;
for (let start = 0; start < samples.length;) {
  let n = 1;
  const same = (a, b) => a.shape.length === b.shape.length && a.shape.every((d, k) => d === b.shape[k]);
  while (stack && n < batch && start + n < samples.length && same(samples[start + n], samples[start])) ++n;
  const xs = samples.slice(start, start + n);
  const per = xs[0].data.length;
  const data = new xs[0].data.constructor(per * n);
  xs.forEach((x, k) => data.set(x.data, k * per));
  try {
    await session.run({ [name]: new ort.Tensor(xs[0].type, data, [n, ...xs[0].shape]) });
  } catch (e) {
    if (!stack || n === 1 || start > 0) throw e;
    stack = false;  // fixed batch of 1: retry sample by sample
    continue;
  }
  start += n;
}
console.log(JSON.stringify({ model, samples: files.length, threads }));
