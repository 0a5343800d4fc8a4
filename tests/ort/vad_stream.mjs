// Streams a recording through a Silero-style voice-activity detector in ONNX Runtime (CPU), as
// an application runs it: chunks of 512 samples at 16 kHz, the state output fed back as the next
// chunk's state input. Writes the speech probability of every chunk, and with --states the
// state each chunk received (the calibration data's states, tests/real_models/vad.py).
//   node vad_stream.mjs MODEL.onnx AUDIO.npy PROBS.npy [--states STATES.npy] [--optimization LEVEL]
import ort from 'onnxruntime-node';
import { readNpy, writeNpy } from './npy.mjs';

const [model, audioPath, output, ...rest] = process.argv.slice(2);
let statesPath = null; let optimization = 'all';
for (let i = 0; i < rest.length; ++i) {
  if (rest[i] === '--states') statesPath = rest[++i];
  else if (rest[i] === '--optimization') optimization = rest[++i];
  else throw new Error(`unknown argument ${rest[i]}`);
}
const chunk = 512; const stateSize = 2 * 128;
const session = await ort.InferenceSession.create(model, { intraOpNumThreads: 2, interOpNumThreads: 1, graphOptimizationLevel: optimization });
for (const name of ['input', 'state', 'sr'])
  if (!session.inputNames.includes(name)) throw new Error(`${model}: no input '${name}' (inputs: ${session.inputNames})`);
const audio = readNpy(audioPath).data;
const chunks = Math.floor(audio.length / chunk);
const probs = new Float32Array(chunks);
const states = new Float32Array(chunks * stateSize);
let state = new ort.Tensor('float32', new Float32Array(stateSize), [2, 1, 128]);
const sr = new ort.Tensor('int64', BigInt64Array.from([16000n]), []);
for (let k = 0; k < chunks; ++k) {
  states.set(state.data, k * stateSize);
  const input = new ort.Tensor('float32', audio.slice(k * chunk, (k + 1) * chunk), [1, chunk]);
  const out = await session.run({ input, state, sr });
  probs[k] = out[session.outputNames[0]].data[0];
  state = out[session.outputNames[1]];
}
writeNpy(output, probs, [chunks]);
if (statesPath) writeNpy(statesPath, states, [chunks, 2, 1, 128]);
