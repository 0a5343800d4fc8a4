// The latency step's helper (core/src/pipeline/latency.cpp): times the float model and its export
// in ONNX Runtime (CPU provider, graph optimizations 'all', as deployed) on the same inputs, both
// sessions in this one process, interleaved run by run so machine noise hits both alike.
//   node ort_timing.mjs ONNXRUNTIME_NODE_DIR FLOAT.onnx EXPORT.onnx RUNS THREADS[,THREADS...] NAME=FILE.npy...
// Prints one JSON line per thread count: {"threads", "float_ms", "export_ms"} (medians of RUNS
// runs after 3 warm-up runs each).
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [runtimeDir, floatModel, exportModel, runsArg, threadsArg, ...inputs] = process.argv.slice(2);
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
const runs = Number(runsArg);
const median = (t) => t.sort((a, b) => a - b)[Math.floor(t.length / 2)];
for (const threads of threadsArg.split(',').map(Number)) {
  // No spinning: two sessions share the cores, and an idle pool spinning would slow the other.
  const options = { intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: 'all',
    extra: { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } } };
  const sessions = [await ort.InferenceSession.create(floatModel, options),
    await ort.InferenceSession.create(exportModel, options)];
  for (const s of sessions) for (let i = 0; i < 3; ++i) await s.run(feeds);
  const times = [[], []];
  for (let r = 0; r < runs; ++r) {
    for (let k = 0; k < 2; ++k) {
      const t0 = performance.now();
      await sessions[k].run(feeds);
      times[k].push(performance.now() - t0);
    }
  }
  console.log(JSON.stringify({ threads, float_ms: median(times[0]), export_ms: median(times[1]) }));
  for (const s of sessions) await s.release();
}
