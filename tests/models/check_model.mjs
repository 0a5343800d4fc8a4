// Checks one exported model against ONNX Runtime (CPU, all graph optimizations):
//   node check_model.mjs --name N --float F.onnx --qdq Q.onnx --input name=X.npy [--input name2=Y.npy ...]
//        --fp32 OURS_FP32.npy --sim OURS_SIMULATED.npy --report REPORT.json --result OUT.json
//        [--threads N]
// FP32 parity: max |ours - ORT| / max |ORT| over the first output, must be <= 1e-4.
// Passes: with --simplified (the model after `sparsebit simplify`), max |ORT(simplified) -
// ORT(original)| / max |ORT(original)|, must be <= 1e-5: every simplify pass keeps the function.
// QDQ parity: max |ORT(QDQ) - simulated| in output quantization steps (8 bits over the output's
// symmetric range, the rule of the Fashion-MNIST example) with ORT's graph optimizations at
// 'basic', where ORT runs the Q/DQ nodes as written. Must be <= max(1, 2 * noise floor): the
// noise floor is how far our own simulated output moves when the input is perturbed by 1e-6
// (relative), i.e. what float rounding differences alone do once they push a value across a
// rounding boundary of some 8-bit activation (--sim holds the outputs on the batch, then on the
// perturbed batches). At 'all' ORT swaps in fused integer kernels with their own approximations
// (QLinearSoftmax's lookup table, requantized QLinearMatMul, ...); that difference is reported,
// and the fused INT8 output must keep cosine >= 0.8 with the FP32 one (a gross-error guard).
// Also reports cosine(ORT INT8, ORT FP32) and the ORT latency of both models. Writes the row
// as JSON to --result and exits 1 when a check fails.
import fs from 'node:fs';
import ort from '../ort/node_modules/onnxruntime-node/dist/index.js';
import { readNpy } from '../ort/npy.mjs';

const args = process.argv.slice(2);
const opt = {};
const inputs = [];  // --input may repeat: one name=FILE.npy per model input
for (let i = 0; i < args.length; i += 2) {
  const key = args[i].replace(/^--/, '');
  if (key === 'input') inputs.push(args[i + 1]);
  else opt[key] = args[i + 1];
}
for (const k of ['name', 'float', 'qdq', 'fp32', 'sim', 'report', 'result'])
  if (!opt[k]) throw new Error(`missing --${k}`);
if (inputs.length === 0) throw new Error('missing --input');

const feeds = {};
for (const spec of inputs) {
  const [inputName, inputFile] = spec.split('=');
  const x = readNpy(inputFile);
  feeds[inputName] = new ort.Tensor(x.type, x.data, x.shape);
}

async function run(model, level = 'all') {
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: Number(opt.threads ?? 2), interOpNumThreads: 1, graphOptimizationLevel: level,
  });
  let out = (await session.run(feeds))[session.outputNames[0]];
  // Latency: median of a few runs after the first.
  const times = [];
  for (let i = 0; i < 3; ++i) {
    const t0 = performance.now();
    out = (await session.run(feeds))[session.outputNames[0]];
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return { data: Float64Array.from(out.data, Number), ms: times[1] };
}

const ortFp = await run(opt.float);
const ortQ = await run(opt.qdq);
const ortSimplified = opt.simplified ? await run(opt.simplified) : null;
const ortQBasic = await run(opt.qdq, 'basic');
const ours = Float64Array.from(readNpy(opt.fp32).data, Number);
const simAll = Float64Array.from(readNpy(opt.sim).data, Number);
const n = ortFp.data.length;
const sim = simAll.subarray(0, n);
for (const [what, a] of [['our FP32 output', ours.subarray(0, ortFp.data.length)], ['our simulated output', sim], ['ORT QDQ output', ortQ.data]])
  if (a.length !== ortFp.data.length) throw new Error(`${opt.name}: ${what} has ${a.length} values, ORT FP32 ${ortFp.data.length}`);

let fpDiff = 0; let fpMax = 0; let qDiff = 0; let qBasicDiff = 0; let simMax = 0; let dot = 0; let nq = 0; let nf = 0;
let noise = 0; let simplifiedDiff = 0;
for (let i = 0; i < ortFp.data.length; ++i) {
  for (let k = n; k + n <= simAll.length; k += n) noise = Math.max(noise, Math.abs(simAll[k + i] - sim[i]));
  fpDiff = Math.max(fpDiff, Math.abs(ours[i] - ortFp.data[i]));
  fpMax = Math.max(fpMax, Math.abs(ortFp.data[i]));
  if (ortSimplified) simplifiedDiff = Math.max(simplifiedDiff, Math.abs(ortSimplified.data[i] - ortFp.data[i]));
  qDiff = Math.max(qDiff, Math.abs(ortQ.data[i] - sim[i]));
  qBasicDiff = Math.max(qBasicDiff, Math.abs(ortQBasic.data[i] - sim[i]));
  simMax = Math.max(simMax, Math.abs(sim[i]));
  dot += ortQ.data[i] * ortFp.data[i]; nq += ortQ.data[i] ** 2; nf += ortFp.data[i] ** 2;
}
const report = JSON.parse(fs.readFileSync(opt.report, 'utf8'));
const step = (2 * simMax) / 255;
const row = {
  model: opt.name,
  nodes: report.nodes,
  quantized_inputs: report.quantized_inputs.filter((s) => s.enabled && !s.fake_fused).length,
  import_ms: report.import_ms,
  calibration_s: report.calibration?.seconds,
  fp32_rel_error: fpMax > 0 ? fpDiff / fpMax : fpDiff,
  simplified_rel_error: ortSimplified ? (fpMax > 0 ? simplifiedDiff / fpMax : simplifiedDiff) : null,
  qdq_steps: step > 0 ? qBasicDiff / step : qBasicDiff,
  noise_floor_steps: step > 0 ? noise / step : noise,
  qdq_steps_fused: step > 0 ? qDiff / step : qDiff,
  cosine_int8_fp32: dot / Math.sqrt(nq * nf),
  ort_fp32_ms: ortFp.ms,
  ort_int8_ms: ortQ.ms,
};
fs.writeFileSync(opt.result, `${JSON.stringify(row, null, 2)}\n`);
console.log(JSON.stringify(row));
let failed = false;
if (!(row.fp32_rel_error <= 1e-4)) { console.log(`FAIL ${opt.name}: FP32 differs from ONNX Runtime by ${row.fp32_rel_error} (relative)`); failed = true; }
if (ortSimplified && !(row.simplified_rel_error <= 1e-5)) {
  console.log(`FAIL ${opt.name}: the simplified model differs from the original by ${row.simplified_rel_error} (relative)`);
  failed = true;
}
const limit = Math.max(1, 2 * row.noise_floor_steps);
if (!(row.qdq_steps <= limit)) {
  console.log(`FAIL ${opt.name}: QDQ model differs from the simulation by ${row.qdq_steps} output steps (limit ${limit})`);
  failed = true;
}
if (!(row.cosine_int8_fp32 >= 0.8)) {
  console.log(`FAIL ${opt.name}: cosine(ORT INT8, ORT FP32) = ${row.cosine_int8_fp32} < 0.8`);
  failed = true;
}
process.exit(failed ? 1 : 0);
