// The latency step's helper (core/src/pipeline/latency.cpp): times models in ONNX Runtime (CPU
// provider, graph optimizations 'all', as deployed) on the same inputs, every session in this one
// process, run round-robin so that machine noise hits them alike.
//   node ort_timing.mjs ONNXRUNTIME_NODE_DIR RUNS THREADS[,THREADS...] MODEL... -- NAME=FILE.npy...
// Prints one JSON line per thread count: {"threads", "ms": [median per model], "beats_second":
// [rounds in which each model ran faster than the second model]} (RUNS rounds after 3 warm-up
// runs of each model). The float model comes first, the export second, candidates after them.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [runtimeDir, runsArg, threadsArg, ...rest] = process.argv.slice(2);
const split = rest.indexOf('--');
const models = split < 0 ? rest : rest.slice(0, split);
const inputs = split < 0 ? [] : rest.slice(split + 1);
const ort = (await import(pathToFileURL(path.join(runtimeDir, 'dist', 'index.js')).href)).default;

const NPY = { '<f4': ['float32', Float32Array], '<f8': ['float64', Float64Array], '|u1': ['uint8', Uint8Array],
  '|i1': ['int8', Int8Array], '<i4': ['int32', Int32Array], '<i8': ['int64', BigInt64Array], '|b1': ['bool', Uint8Array] };
function readNpy(file) {
  const bytes = fs.readFileSync(file);
  const headerLength = bytes.readUInt16LE(8);
  const header = bytes.subarray(10, 10 + headerLength).toString('latin1');
  const descr = /'descr': *'([^']+)'/.exec(header)[1];
  const shape = /'shape': *\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  const [type, Ctor] = NPY[descr] ?? (() => { throw new Error(`${file}: unsupported dtype ${descr}`); })();
  const data = bytes.subarray(10 + headerLength);
  const copy = new Uint8Array(data.length);
  copy.set(data);
  return new ort.Tensor(type, new Ctor(copy.buffer, 0, data.length / Ctor.BYTES_PER_ELEMENT), shape);
}

const feeds = {};
for (const spec of inputs) {
  const at = spec.indexOf('=');
  feeds[spec.slice(0, at)] = readNpy(spec.slice(at + 1));
}
// The process that asked, whose end ends this one (a helper left timing for minutes would
// outlive an interrupted `sparsebit`).
const parent = Number(process.env.SPARSEBIT_PARENT_PID ?? 0);
const parentGone = () => { try { process.kill(parent, 0); return false; } catch { return true; } };
const runs = Number(runsArg);
const median = (t) => [...t].sort((a, b) => a - b)[Math.floor(t.length / 2)];
for (const threads of threadsArg.split(',').map(Number)) {
  // No spinning: the sessions share the cores, and an idle pool spinning would slow the others.
  const options = { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    extra: { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } } };
  const sessions = [];
  for (const m of models) sessions.push(await ort.InferenceSession.create(m, options));
  for (const s of sessions) for (let i = 0; i < 3; ++i) await s.run(feeds);
  const times = sessions.map(() => []);
  const beats = sessions.map(() => 0);
  for (let r = 0; r < runs; ++r) {
    if (parent && parentGone()) process.exit(3);
    // Each round in another order, so that no model always follows the same one.
    const order = sessions.map((_, k) => (k + r) % sessions.length);
    const round = [];
    for (const k of order) {
      const t0 = performance.now();
      await sessions[k].run(feeds);
      round[k] = performance.now() - t0;
    }
    round.forEach((t, k) => { times[k].push(t); if (t < round[1]) ++beats[k]; });
  }
  console.log(JSON.stringify({ threads, ms: times.map(median), beats_second: beats }));
  for (const s of sessions) await s.release();
}
