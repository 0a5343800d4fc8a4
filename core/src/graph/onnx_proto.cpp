// ONNX protobuf <-> IR: tensors (all storage forms, 4-bit packing, external data), attributes and
// value infos.

#include "graph/onnx_proto.h"

#include <ATen/ATen.h>

#include <boost/uuid/detail/sha1.hpp>

#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "base/limits.h"
#include "base/mapped_file.h"
#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace fs = std::filesystem;
using proto::kInt4;
using proto::kUint4;

std::string shape_text(const std::vector<Dim>& shape) {
  std::string dims;
  for (const auto& d : shape)
    dims += (dims.empty() ? "" : ", ") + (d.value >= 0 ? std::to_string(d.value) : d.param.empty() ? "?" : d.param);
  return "[" + dims + "]";
}

std::string onnx_type_name(std::int32_t t) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return "float";
    case onnx::TensorProto::UINT8: return "uint8";
    case onnx::TensorProto::INT8: return "int8";
    case onnx::TensorProto::UINT16: return "uint16";
    case onnx::TensorProto::INT16: return "int16";
    case onnx::TensorProto::INT32: return "int32";
    case onnx::TensorProto::INT64: return "int64";
    case onnx::TensorProto::STRING: return "string";
    case onnx::TensorProto::BOOL: return "bool";
    case onnx::TensorProto::FLOAT16: return "float16";
    case onnx::TensorProto::DOUBLE: return "double";
    case onnx::TensorProto::UINT32: return "uint32";
    case onnx::TensorProto::UINT64: return "uint64";
    case onnx::TensorProto::BFLOAT16: return "bfloat16";
    case kUint4: return "uint4";
    case kInt4: return "int4";
    case 17: return "float8e4m3fn";
    case 18: return "float8e4m3fnuz";
    case 19: return "float8e5m2";
    case 20: return "float8e5m2fnuz";
    default: return "type#" + std::to_string(t);
  }
}

bool proto::is_float8_type(std::int32_t t) { return t == kFloat8E4M3FN || t == kFloat8E5M2; }

bool proto::is_narrow_type(std::int32_t t) {
  return t == kInt4 || t == kUint4 || t == onnx::TensorProto::UINT16 || is_float8_type(t);
}

at::ScalarType proto::scalar_type_of(std::int32_t t, const std::string& what) {
  switch (t) {
    case onnx::TensorProto::FLOAT: return at::kFloat;
    case onnx::TensorProto::UINT8: return at::kByte;
    case onnx::TensorProto::INT8: return at::kChar;
    case onnx::TensorProto::INT16: return at::kShort;
    case onnx::TensorProto::INT32: return at::kInt;
    case onnx::TensorProto::INT64: return at::kLong;
    case onnx::TensorProto::BOOL: return at::kBool;
    case onnx::TensorProto::FLOAT16: return at::kHalf;
    case onnx::TensorProto::DOUBLE: return at::kDouble;
    case onnx::TensorProto::BFLOAT16: return at::kBFloat16;
    case 18:
    case 20:
      throw Error(what + " has element type " + onnx_type_name(t) +
                  ", which the executor does not read (of the float8 types it reads float8e4m3fn and float8e5m2)");
    default:
      throw Error(what + " has element type " + onnx_type_name(t) +
                  ", which the executor does not support (LibTorch has no such dtype)");
  }
}

std::int32_t onnx_type_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return onnx::TensorProto::FLOAT;
    case at::kByte: return onnx::TensorProto::UINT8;
    case at::kChar: return onnx::TensorProto::INT8;
    case at::kShort: return onnx::TensorProto::INT16;
    case at::kInt: return onnx::TensorProto::INT32;
    case at::kLong: return onnx::TensorProto::INT64;
    case at::kBool: return onnx::TensorProto::BOOL;
    case at::kHalf: return onnx::TensorProto::FLOAT16;
    case at::kDouble: return onnx::TensorProto::DOUBLE;
    case at::kBFloat16: return onnx::TensorProto::BFLOAT16;
    default: throw Error(std::string("no ONNX element type for ") + c10::toString(t));
  }
}

namespace {

// The ATen type a TensorProto's values are held in: float8 values as their codes.
at::ScalarType storage_type_of(std::int32_t t, const std::string& what) {
  return proto::is_float8_type(t) ? at::kByte : proto::scalar_type_of(t, what);
}

// Copies typed repeated-field storage into a new tensor of `shape`.
template <class Src>
at::Tensor from_field(const Src& field, at::ScalarType storage, at::ScalarType target,
                      const std::vector<std::int64_t>& shape) {
  using T = typename Src::value_type;
  at::Tensor t = at::empty({static_cast<std::int64_t>(field.size())}, at::TensorOptions().dtype(storage));
  if (field.size() > 0) std::memcpy(t.data_ptr(), field.data(), field.size() * sizeof(T));
  return t.to(target).reshape(shape);
}

// int4/uint4: two values a byte, low nibble first, widened to int8/uint8 (sign-extended).
at::Tensor unpack_4bit(const onnx::TensorProto& p, const std::vector<std::int64_t>& shape, std::int64_t numel,
                       const std::string& what) {
  const bool is_signed = p.data_type() == kInt4;
  std::string bytes;
  if (p.has_raw_data()) {
    bytes = p.raw_data();
  } else {
    for (auto v : p.int32_data()) bytes.push_back(static_cast<char>(v & 0xFF));
  }
  if (bytes.size() != static_cast<std::size_t>((numel + 1) / 2))
    throw Error(what + " holds " + std::to_string(bytes.size()) + " bytes of packed 4-bit data, its shape needs " +
                std::to_string((numel + 1) / 2));
  at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(is_signed ? at::kChar : at::kByte));
  for (std::int64_t i = 0; i < numel; ++i) {
    int nibble = (static_cast<unsigned char>(bytes[static_cast<std::size_t>(i / 2)]) >> (4 * (i % 2))) & 0xF;
    if (is_signed && nibble >= 8) nibble -= 16;
    if (is_signed) t.data_ptr<std::int8_t>()[i] = static_cast<std::int8_t>(nibble);
    else t.data_ptr<std::uint8_t>()[i] = static_cast<std::uint8_t>(nibble);
  }
  return t.reshape(shape);
}

/// SHA-1 of a file as 40 lowercase hex digits (ONNX's external-data checksum), read in chunks.
std::string sha1_of_file(const fs::path& file) {
  boost::uuids::detail::sha1 h;
  std::ifstream in(file, std::ios::binary);
  std::string chunk(1 << 20, '\0');
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    h.process_bytes(chunk.data(), static_cast<std::size_t>(in.gcount()));
  }
  boost::uuids::detail::sha1::digest_type d;
  h.get_digest(d);
  std::ostringstream os;
  for (auto word : d) os << std::hex << std::setw(8) << std::setfill('0') << word;
  return os.str();
}

struct ExternalSpan {
  fs::path file;
  std::int64_t offset = 0, length = 0;
};

/// Where a tensor's external data lies (`expected` bytes), confined to the model's folder: the
/// location must be relative, without "..", and must not resolve (through symlinks) outside the
/// folder; offset, length and checksum are checked against the file before anything is read.
ExternalSpan locate_external_data(const onnx::TensorProto& p, const fs::path& base_dir, std::int64_t expected,
                                  const std::string& what) {
  std::string location, checksum;
  std::int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = limits::parse_size(kv.value(), what + ": external data offset");
    else if (kv.key() == "length") length = limits::parse_size(kv.value(), what + ": external data length");
    else if (kv.key() == "checksum") checksum = kv.value();
  }
  const fs::path rel(location);
  bool dotdot = false;
  for (const auto& part : rel) dotdot = dotdot || part == "..";
  if (location.empty() || rel.is_absolute() || dotdot || location.find('\0') != std::string::npos) {
    throw Error(what + ": external data location '" + location +
                "' must be a relative path inside the model's folder (no absolute paths, no '..')");
  }
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(base_dir.empty() ? fs::path(".") : base_dir, ec);
  const fs::path file = fs::weakly_canonical(folder / rel, ec);
  const auto [end, unused] = std::mismatch(folder.begin(), folder.end(), file.begin(), file.end());
  if (ec || end != folder.end()) {
    throw Error(what + ": external data location '" + location + "' resolves to " + file.string() +
                ", outside the model's folder " + folder.string() + " (a symlink?); refusing to read it");
  }
  if (!fs::exists(file, ec)) throw Error(what + ": external data file " + file.string() + " does not exist");
  if (!fs::is_regular_file(file, ec))
    throw Error(what + ": external data file " + file.string() + " is " +
                (fs::is_directory(file, ec) ? "a folder" : "a device, pipe or socket") + ", not a file");
  const auto size = static_cast<std::int64_t>(fs::file_size(file, ec));
  if (length < 0) length = expected;
  if (length != expected) {
    throw Error(what + ": external data length " + std::to_string(length) + " does not match its shape (" +
                std::to_string(expected) + " bytes)");
  }
  if (ec || offset > size || length > size - offset) {
    throw Error(what + ": external data file " + file.string() + " (" + std::to_string(size) +
                " bytes) is shorter than offset " + std::to_string(offset) + " + length " + std::to_string(length));
  }
  if (!checksum.empty()) {
    // The spec's checksum covers the whole file, which tensors usually share: hash it once.
    static thread_local std::map<std::string, std::string> hashed;
    const std::string key = file.string() + "@" + std::to_string(size);
    auto it = hashed.find(key);
    if (it == hashed.end()) it = hashed.emplace(key, sha1_of_file(file)).first;
    if (it->second != checksum) {
      throw Error(what + ": external data file " + file.string() +
                  " does not match its SHA-1 checksum (changed or corrupt)");
    }
  }
  return {file, offset, length};
}

/// Tensors at least this large are mapped rather than read (Note [Mapped weights]).
constexpr std::int64_t kMapBytes = 1 << 20;

at::Tensor external_tensor(const onnx::TensorProto& p, const fs::path& base_dir, const std::vector<std::int64_t>& shape,
                           std::int64_t numel, at::ScalarType st, const std::string& what) {
  const ExternalSpan span =
      locate_external_data(p, base_dir, numel * static_cast<std::int64_t>(c10::elementSize(st)), what);
  note_file_read(span.file.string());  // Note [Files a run read]
  if (span.length >= kMapBytes)
    if (at::Tensor t = map_tensor(span.file, span.offset, shape, st); t.defined()) return t;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
  std::ifstream in(span.file, std::ios::binary);
  if (!in) throw Error(what + ": cannot open external data file " + span.file.string());
  in.seekg(span.offset);
  in.read(static_cast<char*>(t.data_ptr()), span.length);
  if (in.gcount() != span.length)
    throw Error(what + ": could not read " + std::to_string(span.length) + " bytes from " + span.file.string());
  return t;
}

/// A tensor of a type held packed or narrowed (int4, uint4, uint16) whose bytes lie in an
/// external-data file: the same tensor with them in place.
onnx::TensorProto with_external_bytes(const onnx::TensorProto& p, const fs::path& base_dir, std::int64_t expected,
                                      const std::string& what) {
  const ExternalSpan span = locate_external_data(p, base_dir, expected, what);
  note_file_read(span.file.string());  // Note [Files a run read]
  std::string bytes(static_cast<std::size_t>(span.length), '\0');
  std::ifstream in(span.file, std::ios::binary);
  if (!in) throw Error(what + ": cannot open external data file " + span.file.string());
  in.seekg(span.offset);
  in.read(bytes.data(), span.length);
  if (in.gcount() != span.length)
    throw Error(what + ": could not read " + std::to_string(span.length) + " bytes from " + span.file.string());
  onnx::TensorProto inline_copy;
  inline_copy.set_data_type(p.data_type());
  *inline_copy.mutable_dims() = p.dims();
  inline_copy.set_raw_data(std::move(bytes));
  return inline_copy;
}

}  // namespace

namespace proto {

at::Tensor take_tensor_from_proto(onnx::TensorProto& p, const fs::path& base_dir, const std::string& what) {
  const bool plain = p.data_type() != kInt4 && p.data_type() != kUint4 && p.data_type() != onnx::TensorProto::UINT16 &&
                     p.data_location() != onnx::TensorProto::EXTERNAL && p.has_raw_data();
  if (!plain) return tensor_from_proto(p, base_dir, what);
  std::vector<std::int64_t> shape(p.dims().begin(), p.dims().end());
  const std::int64_t numel = limits::checked_numel(shape, 1, what);
  const at::ScalarType st = storage_type_of(p.data_type(), what);
  if (numel == 0 || p.raw_data().size() != static_cast<std::size_t>(numel) * c10::elementSize(st))
    return tensor_from_proto(p, base_dir, what);  // the same checks and messages
  // The bytes become the tensor's storage: loading holds each weight once, not twice. (A
  // string's heap buffer is aligned for any scalar type.)
  std::string* bytes = p.release_raw_data();
  return at::from_blob(
      bytes->data(), shape, [bytes](void*) { delete bytes; }, at::TensorOptions().dtype(st));
}

at::Tensor tensor_from_proto(const onnx::TensorProto& p, const fs::path& base_dir, const std::string& what) {
  std::vector<std::int64_t> shape(p.dims().begin(), p.dims().end());
  const std::int64_t numel = limits::checked_numel(shape, 1, what);
  const bool packed = p.data_type() == kInt4 || p.data_type() == kUint4;
  if ((packed || p.data_type() == onnx::TensorProto::UINT16) && p.data_location() == onnx::TensorProto::EXTERNAL)
    return tensor_from_proto(with_external_bytes(p, base_dir, packed ? (numel + 1) / 2 : numel * 2, what), base_dir,
                             what);
  if (packed) return unpack_4bit(p, shape, numel, what);
  if (p.data_type() == onnx::TensorProto::UINT16) {  // no LibTorch dtype: widened to int32
    // Sizes are checked before the allocation; raw data, when present, is the data.
    const bool raw = p.has_raw_data();
    if (raw ? p.raw_data().size() != static_cast<std::size_t>(numel) * 2 : p.int32_data_size() != numel)
      throw Error(what + ": wrong uint16 data size");
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(at::kInt));
    if (raw) {
      for (std::int64_t i = 0; i < numel; ++i)
        t.data_ptr<std::int32_t>()[i] = static_cast<unsigned char>(p.raw_data()[2 * i]) |
                                        (static_cast<unsigned char>(p.raw_data()[2 * i + 1]) << 8);
    } else {
      for (std::int64_t i = 0; i < numel; ++i) t.data_ptr<std::int32_t>()[i] = p.int32_data(static_cast<int>(i));
    }
    return t.reshape(shape);
  }
  const at::ScalarType st = storage_type_of(p.data_type(), what);
  const std::size_t elem = c10::elementSize(st);

  if (p.data_location() == onnx::TensorProto::EXTERNAL) return external_tensor(p, base_dir, shape, numel, st, what);
  if (const std::string* raw = p.has_raw_data() ? &p.raw_data() : nullptr) {
    if (raw->size() != static_cast<std::size_t>(numel) * elem) {
      throw Error(what + " holds " + std::to_string(raw->size()) + " bytes of data, but its shape " +
                  c10::str(at::IntArrayRef(shape)) + " of " + onnx_type_name(p.data_type()) + " needs " +
                  std::to_string(numel * static_cast<std::int64_t>(elem)) + " (truncated or corrupt file?)");
    }
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
    if (numel > 0) std::memcpy(t.data_ptr(), raw->data(), raw->size());
    return t;
  }
  at::Tensor t;
  switch (p.data_type()) {
    case onnx::TensorProto::FLOAT: t = from_field(p.float_data(), at::kFloat, st, {-1}); break;
    case onnx::TensorProto::DOUBLE: t = from_field(p.double_data(), at::kDouble, st, {-1}); break;
    case onnx::TensorProto::INT64: t = from_field(p.int64_data(), at::kLong, st, {-1}); break;
    case onnx::TensorProto::FLOAT16:
    case onnx::TensorProto::BFLOAT16: {
      // Stored as the 16-bit patterns in int32 fields.
      at::Tensor bits = from_field(p.int32_data(), at::kInt, at::kShort, {-1});
      t = at::empty({bits.numel()}, at::TensorOptions().dtype(st));
      if (bits.numel() > 0) std::memcpy(t.data_ptr(), bits.data_ptr(), static_cast<std::size_t>(bits.numel()) * 2);
      break;
    }
    default: t = from_field(p.int32_data(), at::kInt, st, {-1}); break;
  }
  if (t.numel() != numel) {
    throw Error(what + " holds " + std::to_string(t.numel()) + " values, but its shape " +
                c10::str(at::IntArrayRef(shape)) + " needs " + std::to_string(numel));
  }
  return t.reshape(shape);
}

void tensor_to_proto(const at::Tensor& t_in, const std::string& name, onnx::TensorProto* p, std::int32_t narrow_type) {
  at::Tensor t = t_in.detach().to(at::kCPU).contiguous();
  p->set_name(name);
  for (auto d : t.sizes()) p->add_dims(d);
  if (narrow_type == onnx::TensorProto::UINT16) {
    at::Tensor v = t.to(at::kInt).reshape({-1});
    std::string bytes(static_cast<std::size_t>(v.numel()) * 2, '\0');
    for (std::int64_t i = 0; i < v.numel(); ++i) {
      const auto u = static_cast<std::uint16_t>(v.data_ptr<std::int32_t>()[i]);
      bytes[static_cast<std::size_t>(2 * i)] = static_cast<char>(u & 0xFF);
      bytes[static_cast<std::size_t>(2 * i + 1)] = static_cast<char>(u >> 8);
    }
    p->set_data_type(narrow_type);
    p->set_raw_data(bytes);
    return;
  }
  if (narrow_type == kInt4 || narrow_type == kUint4) {
    // Pack two 4-bit values a byte, low nibble first.
    at::Tensor v = t.to(at::kInt).reshape({-1});
    const std::int64_t n = v.numel();
    std::string bytes(static_cast<std::size_t>((n + 1) / 2), '\0');
    for (std::int64_t i = 0; i < n; ++i)
      bytes[static_cast<std::size_t>(i / 2)] |=
          static_cast<char>((v.data_ptr<std::int32_t>()[i] & 0xF) << (4 * (i % 2)));
    p->set_data_type(narrow_type);
    p->set_raw_data(bytes);
    return;
  }
  // Float8 codes (FLOAT8E4M3FN, FLOAT8E5M2) are held as uint8 bit patterns: stored as they are.
  const bool float8 = (narrow_type == 17 || narrow_type == 19) && t.scalar_type() == at::kByte;
  p->set_data_type(float8 ? narrow_type : onnx_type_of(t.scalar_type()));
  p->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
}

Attribute attribute_from_proto(const onnx::AttributeProto& a, const fs::path& base, const std::string& where) {
  switch (a.type()) {
    case onnx::AttributeProto::FLOAT: return Attribute::of_float(a.f());
    case onnx::AttributeProto::INT: return Attribute::of_int(a.i());
    case onnx::AttributeProto::STRING: return Attribute::of_string(a.s());
    case onnx::AttributeProto::TENSOR:
      return Attribute::of_tensor(tensor_from_proto(a.t(), base, where + " attribute '" + a.name() + "'"));
    case onnx::AttributeProto::FLOATS: return Attribute::of_floats({a.floats().begin(), a.floats().end()});
    case onnx::AttributeProto::INTS: return Attribute::of_ints({a.ints().begin(), a.ints().end()});
    case onnx::AttributeProto::STRINGS: {
      Attribute r;
      r.kind = Attribute::Kind::kStrings;
      r.strings.assign(a.strings().begin(), a.strings().end());
      return r;
    }
    default: {
      Attribute r;
      r.kind = Attribute::Kind::kOpaque;
      r.opaque = a.SerializeAsString();
      return r;
    }
  }
}

void attribute_to_proto(const std::string& key, const Attribute& a, onnx::AttributeProto* p) {
  if (a.kind == Attribute::Kind::kOpaque) {
    p->ParseFromString(a.opaque);
    return;
  }
  p->set_name(key);
  switch (a.kind) {
    case Attribute::Kind::kFloat:
      p->set_type(onnx::AttributeProto::FLOAT);
      p->set_f(static_cast<float>(a.f));
      break;
    case Attribute::Kind::kInt:
      p->set_type(onnx::AttributeProto::INT);
      p->set_i(a.i);
      break;
    case Attribute::Kind::kString:
      p->set_type(onnx::AttributeProto::STRING);
      p->set_s(a.s);
      break;
    case Attribute::Kind::kTensor:
      p->set_type(onnx::AttributeProto::TENSOR);
      tensor_to_proto(a.t, "", p->mutable_t());
      break;
    case Attribute::Kind::kFloats:
      p->set_type(onnx::AttributeProto::FLOATS);
      for (double f : a.floats) p->add_floats(static_cast<float>(f));
      break;
    case Attribute::Kind::kInts:
      p->set_type(onnx::AttributeProto::INTS);
      for (auto i : a.ints) p->add_ints(i);
      break;
    case Attribute::Kind::kStrings:
      p->set_type(onnx::AttributeProto::STRINGS);
      for (auto& s : a.strings) p->add_strings(s);
      break;
    case Attribute::Kind::kOpaque: break;
    case Attribute::Kind::kGraph: throw Error("internal: subgraph attributes are written by write_nodes()");
  }
}

ValueInfo value_info_from_proto(const onnx::ValueInfoProto& v) {
  ValueInfo out;
  out.name = v.name();
  out.doc_string = v.doc_string();
  if (v.type().has_tensor_type()) {
    const auto& tt = v.type().tensor_type();
    out.elem_type = tt.elem_type();
    if (tt.has_shape()) {
      out.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        Dim dim;
        if (d.has_dim_value()) dim.value = d.dim_value();
        else if (d.has_dim_param()) dim.param = d.dim_param();
        out.shape.push_back(dim);
      }
    }
  }
  return out;
}

void value_info_to_proto(const ValueInfo& v, onnx::ValueInfoProto* p) {
  p->set_name(v.name);
  if (!v.doc_string.empty()) p->set_doc_string(v.doc_string);
  auto* tt = p->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(v.elem_type);
  if (v.has_shape) {
    auto* shape = tt->mutable_shape();
    for (const auto& d : v.shape) {
      auto* dim = shape->add_dim();
      if (d.value >= 0) dim->set_dim_value(d.value);
      else if (!d.param.empty()) dim->set_dim_param(d.param);
    }
  }
}

}  // namespace proto
}  // namespace sparsebit
