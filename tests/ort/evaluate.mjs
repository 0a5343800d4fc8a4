// Evaluates an exported QDQ classifier in ONNX Runtime on IDX images and labels, compares its
// outputs with Sparsebit's simulated outputs, and prints the FP32 / simulated INT8 / ONNX
// Runtime INT8 table.
//   node evaluate.mjs MODEL.onnx IMAGES.idx[.gz] LABELS.idx[.gz] --report R.json --sim SIM.npy
//        [--max-steps K] [--max-drop POINTS] [--threads N] [--count N]
// With --max-steps / --max-drop it exits 1 when ONNX Runtime's outputs differ from the
// simulation by more than K output quantization steps, or accuracy drops by more than POINTS.
// --count N evaluates the first N images only (and compares them with the first N simulated rows).
import fs from 'node:fs';
import ort from 'onnxruntime-node';
import { readIdx, readNpy } from './npy.mjs';

const [model, imagesPath, labelsPath, ...rest] = process.argv.slice(2);
const opt = {};
for (let i = 0; i < rest.length; i += 2) opt[rest[i].replace(/^--/, '')] = rest[i + 1];
const threads = Number(opt.threads ?? 1);

const images = readIdx(imagesPath);
const labels = readIdx(labelsPath).data;
const n = Math.min(images.shape[0], Number(opt.count ?? images.shape[0]));
const per = images.data.length / images.shape[0];
const session = await ort.InferenceSession.create(model, {
  intraOpNumThreads: threads, interOpNumThreads: 1, graphOptimizationLevel: opt.optimization ?? 'all',
});
const inputName = session.inputNames[0];
const outputName = session.outputNames[0];
const report = opt.report ? JSON.parse(fs.readFileSync(opt.report, 'utf8')) : null;
const dims = report?.input_shape ?? null;

let correct = 0; const batch = 500; let classes = 0;
const ortOut = [];
for (let s = 0; s < n; s += batch) {
  const m = Math.min(batch, n - s);
  const x = new Float32Array(m * per);
  for (let i = 0; i < m * per; ++i) x[i] = images.data[s * per + i] / 255;
  const shape = [m, 1, ...images.shape.slice(1)];
  const y = (await session.run({ [inputName]: new ort.Tensor('float32', x, dims ? [m, ...dims.slice(1)] : shape) }))[outputName];
  classes = y.dims[1];
  for (let i = 0; i < m; ++i) {
    let best = 0;
    for (let c = 1; c < classes; ++c) if (y.data[i * classes + c] > y.data[i * classes + best]) best = c;
    if (best === labels[s + i]) ++correct;
  }
  ortOut.push(y.data);
}
const ortAcc = correct / n;

let failures = 0;
const rows = [];
const ev = report?.evaluation;
if (ev?.fp32_accuracy !== undefined) {
  rows.push(['FP32 (Sparsebit executor)', ev.fp32_accuracy]);
  rows.push(['INT8 simulated (Sparsebit)', ev.int8_simulated_accuracy]);
}
rows.push(['INT8 QDQ in ONNX Runtime', ortAcc]);
console.log(`\nFashion-MNIST test set, ${n} images\n`);
console.log('model                          top-1 accuracy');
for (const [name, acc] of rows) console.log(`${name.padEnd(30)} ${(100 * acc).toFixed(2).padStart(8)}%`);

if (opt.sim) {
  const sim = readNpy(opt.sim);
  if (sim.data.length < n * classes) throw new Error(`${opt.sim}: ${sim.data.length} values, expected ${n * classes}`);
  let maxAbs = 0; let k = 0; let amax = 0;
  for (const chunk of ortOut) for (const v of chunk) { maxAbs = Math.max(maxAbs, Math.abs(v - sim.data[k])); amax = Math.max(amax, Math.abs(sim.data[k])); ++k; }
  // One quantization step of the output tensor: 8-bit symmetric over the observed range.
  const step = (2 * amax) / 255;
  const steps = maxAbs / step;
  console.log(`\nlargest |ONNX Runtime - simulated| output difference: ${maxAbs.toExponential(3)} = ${steps.toFixed(3)} output quantization steps (step ${step.toExponential(3)})`);
  if (opt['max-steps'] !== undefined && steps > Number(opt['max-steps'])) {
    console.log(`FAIL: more than ${opt['max-steps']} output quantization step(s)`);
    ++failures;
  }
}
if (opt['max-drop'] !== undefined && ev?.fp32_accuracy !== undefined && n === images.shape[0]) {
  const drop = 100 * (ev.fp32_accuracy - ortAcc);
  console.log(`accuracy change FP32 -> ONNX Runtime INT8: ${(-drop).toFixed(2)} points`);
  if (drop > Number(opt['max-drop'])) {
    console.log(`FAIL: accuracy dropped by more than ${opt['max-drop']} points`);
    ++failures;
  }
}
process.exit(failures ? 1 : 0);
