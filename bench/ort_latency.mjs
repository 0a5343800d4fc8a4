// ONNX Runtime (npm onnxruntime-node, CPU) latency of several models on one input, the first
// model being the baseline, measured in the same process one after another, interleaved round
// by round so machine noise hits all of them alike:
//   node bench/ort_latency.mjs --input name=X.npy [--runs 30] [--threads 1] MODEL.onnx ...
// Prints one JSON line per model: median and p90 milliseconds and the ratio to the baseline.
import ort from '../tests/ort/node_modules/onnxruntime-node/dist/index.js';
import { readNpy } from '../tests/ort/npy.mjs';

const args = process.argv.slice(2);
const models = [];
let input = null, runs = 30, threads = 1;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--input') input = args[++i];
  else if (args[i] === '--runs') runs = Number(args[++i]);
  else if (args[i] === '--threads') threads = Number(args[++i]);
  else models.push(args[i]);
}
if (!input || models.length === 0) throw new Error('usage: ort_latency.mjs --input name=X.npy MODEL.onnx ...');
const [name, file] = input.split('=');
const x = readNpy(file);
const feeds = { [name]: new ort.Tensor(x.type, x.data, x.shape) };
const sessions = [];
for (const m of models) {
  // No spinning: several sessions live in one process, and idle pools spinning on the same
  // cores would slow whichever session runs.
  const s = await ort.InferenceSession.create(m, { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    extra: { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } } });
  for (let i = 0; i < 3; ++i) await s.run(feeds);  // warm-up
  sessions.push(s);
}
const times = models.map(() => []);
for (let r = 0; r < runs; ++r) {
  for (let k = 0; k < sessions.length; ++k) {
    const t0 = performance.now();
    await sessions[k].run(feeds);
    times[k].push(performance.now() - t0);
  }
}
const stats = times.map((t) => {
  t.sort((a, b) => a - b);
  return { median: t[Math.floor(t.length / 2)], p90: t[Math.floor(t.length * 0.9)] };
});
models.forEach((m, k) => console.log(JSON.stringify({ model: m, median_ms: stats[k].median, p90_ms: stats[k].p90,
  ratio_to_baseline: stats[k].median / stats[0].median })));
