// Checks a structurally pruned model in ONNX Runtime (CPU):
//   node check_prune.mjs --float F.onnx --pruned P.onnx --masked M.onnx --input name=X.npy
//        --result OUT.json [--threads N] [--runs N]
// The pruned model's first output must equal the masked model's (same shapes, removed channels
// zero) within 1e-5 of the masked output's largest magnitude. Reports the median latency of the
// float and the pruned model over --runs runs (default 10) after a warm-up, and their ratio.
import fs from 'node:fs';
import ort from '../ort/node_modules/onnxruntime-node/dist/index.js';
import { readNpy } from '../ort/npy.mjs';

const args = process.argv.slice(2);
const opt = {};
for (let i = 0; i < args.length; i += 2) opt[args[i].replace(/^--/, '')] = args[i + 1];
for (const k of ['float', 'pruned', 'masked', 'input', 'result']) if (!opt[k]) throw new Error(`missing --${k}`);
const [inputName, inputFile] = opt.input.split('=');
const x = readNpy(inputFile);
const feeds = { [inputName]: new ort.Tensor(x.type, x.data, x.shape) };
const runs = Number(opt.runs ?? 10);

async function run(model) {
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(opt.threads ?? 2), interOpNumThreads: 1, graphOptimizationLevel: 'all',
  });
  let out = (await session.run(feeds))[session.outputNames[0]];
  const times = [];
  for (let i = 0; i < runs; ++i) {
    const t0 = performance.now();
    out = (await session.run(feeds))[session.outputNames[0]];
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return { data: Float64Array.from(out.data, Number), ms: times[Math.floor(runs / 2)] };
}

const f = await run(opt.float);
const p = await run(opt.pruned);
const m = await run(opt.masked);
let scale = 1e-12, diff = 0;
for (let i = 0; i < m.data.length; ++i) {
  scale = Math.max(scale, Math.abs(m.data[i]));
  diff = Math.max(diff, Math.abs(p.data[i] - m.data[i]));
}
const row = { pruned_vs_masked: diff / scale, float_ms: f.ms, pruned_ms: p.ms, speedup: f.ms / p.ms,
              same_size: p.data.length === m.data.length };
fs.writeFileSync(opt.result, JSON.stringify(row, null, 2) + '\n');
console.log(JSON.stringify(row));
if (!row.same_size || !(row.pruned_vs_masked <= 1e-5)) {
  console.error(`pruned output differs from the masked model's: ${row.pruned_vs_masked}`);
  process.exit(1);
}
