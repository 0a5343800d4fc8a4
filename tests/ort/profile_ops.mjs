// Time per op type of one model in ONNX Runtime (CPU), from its profiler: where an export spends
// its time after ONNX Runtime's fusions.
//   node profile_ops.mjs MODEL.onnx --input name=X.npy [--runs 20] [--threads 1]
// Prints one JSON line: {op_type: {count, ms}} per run (nodes and milliseconds per inference).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import ort from 'onnxruntime-node';
import { readNpy } from './npy.mjs';

const args = process.argv.slice(2);
let model = null, input = null, runs = 20, threads = 1;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--input') input = args[++i];
  else if (args[i] === '--runs') runs = Number(args[++i]);
  else if (args[i] === '--threads') threads = Number(args[++i]);
  else model = args[i];
}
if (!model || !input) throw new Error('usage: profile_ops.mjs MODEL.onnx --input name=X.npy [--runs N] [--threads N]');
const [name, file] = input.split('=');
const x = readNpy(file);
const feeds = { [name]: new ort.Tensor(x.type, x.data, x.shape) };
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sparsebit-profile-'));
const s = await ort.InferenceSession.create(model, { intraOpNumThreads: threads, interOpNumThreads: 1,
  graphOptimizationLevel: 'all', enableProfiling: true, profileFilePrefix: path.join(dir, 'p') });
for (let r = 0; r < runs + 3; ++r) await s.run(feeds);
s.endProfiling();
const events = JSON.parse(fs.readFileSync(path.join(dir, fs.readdirSync(dir)[0]), 'utf8'));
fs.rmSync(dir, { recursive: true, force: true });
const byOp = {};
for (const e of events) {
  if (e.cat !== 'Node' || !e.name.endsWith('_kernel_time')) continue;
  const op = e.args.op_name;
  byOp[op] ??= { count: 0, us: 0 };
  byOp[op].count += 1;
  byOp[op].us += e.dur;
}
const out = {};
for (const [op, v] of Object.entries(byOp).sort((a, b) => b[1].us - a[1].us))
  out[op] = { count: Math.round(v.count / (runs + 3)), ms: +(v.us / (runs + 3) / 1000).toFixed(3) };
console.log(JSON.stringify(out));
