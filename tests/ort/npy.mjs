// Minimal .npy and IDX readers/writers for the ONNX Runtime harness.
import fs from 'node:fs';
import zlib from 'node:zlib';

const NPY_TYPES = {
  '<f4': ['float32', Float32Array], '<f8': ['float64', Float64Array], '|u1': ['uint8', Uint8Array],
  '|i1': ['int8', Int8Array], '<i4': ['int32', Int32Array], '<i8': ['int64', BigInt64Array],
  '|b1': ['bool', Uint8Array], '<f2': ['float16', Uint16Array],  // float16: the 16-bit patterns
};

export function readNpy(path) {
  const buf = fs.readFileSync(path);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${path}: not a .npy file`);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = major === 1 ? 10 : 12;
  const header = buf.toString('latin1', start, start + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  const [type, Ctor] = NPY_TYPES[descr] ?? (() => { throw new Error(`${path}: unsupported dtype ${descr}`); })();
  const offset = start + headerLen;
  const bytes = buf.subarray(offset);
  const copy = new Uint8Array(bytes.length);
  copy.set(bytes);
  return { type, shape, data: new Ctor(copy.buffer, 0, bytes.length / Ctor.BYTES_PER_ELEMENT) };
}

// `type`: the ONNX Runtime tensor's type, which tells float16 (16-bit patterns) from the rest.
export function writeNpy(path, array, shape, type) {
  const descr = type === 'float16' ? '<f2' : array instanceof Float32Array ? '<f4' : array instanceof BigInt64Array ? '<i8'
    : array instanceof Int32Array ? '<i4' : array instanceof Int8Array ? '|i1' : array instanceof Uint8Array ? '|u1' : null;
  if (!descr) throw new Error('writeNpy: unsupported array type');
  const shapeText = shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shapeText}, }`;
  const total = 10 + header.length + 1;
  header += ' '.repeat((64 - (total % 64)) % 64) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(header.length, 8);
  const tmp = `${path}.tmp-${process.pid}`;
  fs.writeFileSync(tmp, Buffer.concat([head, Buffer.from(header, 'latin1'), Buffer.from(array.buffer, array.byteOffset, array.byteLength)]));
  fs.renameSync(tmp, path);
}

export function readIdx(path) {
  let buf = fs.readFileSync(path);
  if (buf[0] === 0x1f && buf[1] === 0x8b) buf = zlib.gunzipSync(buf);
  if (buf[0] !== 0 || buf[1] !== 0 || buf[2] !== 0x08) throw new Error(`${path}: not a uint8 IDX file`);
  const ndim = buf[3];
  const shape = [];
  for (let i = 0; i < ndim; ++i) shape.push(buf.readUInt32BE(4 + 4 * i));
  return { shape, data: new Uint8Array(buf.buffer, buf.byteOffset + 4 + 4 * ndim, shape.reduce((a, b) => a * b, 1)) };
}
