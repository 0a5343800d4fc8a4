#include "sparsebit/core/onnx_io.h"

#include <ATen/ATen.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/sdk/error.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {

namespace fs = std::filesystem;

namespace {
constexpr std::int32_t kUint4 = 21, kInt4 = 22;  // TensorProto.DataType numbers (opset 21)
}  // namespace

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
    default: return "type#" + std::to_string(t);
  }
}

namespace {

at::ScalarType scalar_type_of(std::int32_t t, const std::string& what) {
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
    default:
      throw Error(what + " has element type " + onnx_type_name(t) +
                  ", which the executor does not support (LibTorch has no such dtype)");
  }
}

}  // namespace

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

at::Tensor tensor_from_proto(const onnx::TensorProto& p, const fs::path& base_dir, const std::string& what) {
  std::vector<std::int64_t> shape(p.dims().begin(), p.dims().end());
  std::int64_t numel = 1;
  for (auto d : shape) {
    if (d < 0) throw Error(what + " has a negative dimension");
    numel *= d;
  }
  if (p.data_type() == kInt4 || p.data_type() == kUint4) return unpack_4bit(p, shape, numel, what);
  if (p.data_type() == onnx::TensorProto::UINT16) {  // no LibTorch dtype: widened to int32
    at::Tensor t = at::empty({numel}, at::TensorOptions().dtype(at::kInt));
    if (p.has_raw_data()) {
      if (p.raw_data().size() != static_cast<std::size_t>(numel) * 2) throw Error(what + ": wrong uint16 data size");
      for (std::int64_t i = 0; i < numel; ++i)
        t.data_ptr<std::int32_t>()[i] = static_cast<unsigned char>(p.raw_data()[2 * i]) |
                                        (static_cast<unsigned char>(p.raw_data()[2 * i + 1]) << 8);
    } else {
      if (p.int32_data_size() != numel) throw Error(what + ": wrong uint16 data size");
      for (std::int64_t i = 0; i < numel; ++i) t.data_ptr<std::int32_t>()[i] = p.int32_data(static_cast<int>(i));
    }
    return t.reshape(shape);
  }
  const at::ScalarType st = scalar_type_of(p.data_type(), what);
  const std::size_t elem = c10::elementSize(st);

  std::string external;
  const std::string* raw = nullptr;
  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    std::int64_t offset = 0, length = -1;
    for (const auto& kv : p.external_data()) {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    }
    if (location.empty() || fs::path(location).is_absolute() || location.find("..") != std::string::npos) {
      throw Error(what + ": external data location '" + location +
                  "' must be a relative path inside the model's folder");
    }
    fs::path file = base_dir / location;
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(what + ": cannot open external data file " + file.string());
    if (length < 0) length = numel * static_cast<std::int64_t>(elem);
    external.resize(static_cast<std::size_t>(length));
    in.seekg(offset);
    in.read(external.data(), length);
    if (in.gcount() != length) {
      throw Error(what + ": external data file " + file.string() + " is shorter than offset " +
                  std::to_string(offset) + " + length " + std::to_string(length));
    }
    raw = &external;
  } else if (p.has_raw_data()) {
    raw = &p.raw_data();
  }

  if (raw) {
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

void tensor_to_proto(const at::Tensor& t_in, const std::string& name, onnx::TensorProto* p, std::int32_t narrow_type = 0) {
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
      bytes[static_cast<std::size_t>(i / 2)] |= static_cast<char>((v.data_ptr<std::int32_t>()[i] & 0xF) << (4 * (i % 2)));
    p->set_data_type(narrow_type);
    p->set_raw_data(bytes);
    return;
  }
  p->set_data_type(onnx_type_of(t.scalar_type()));
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
    case Attribute::Kind::kFloat: p->set_type(onnx::AttributeProto::FLOAT); p->set_f(static_cast<float>(a.f)); break;
    case Attribute::Kind::kInt: p->set_type(onnx::AttributeProto::INT); p->set_i(a.i); break;
    case Attribute::Kind::kString: p->set_type(onnx::AttributeProto::STRING); p->set_s(a.s); break;
    case Attribute::Kind::kTensor: p->set_type(onnx::AttributeProto::TENSOR); tensor_to_proto(a.t, "", p->mutable_t()); break;
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

std::int64_t default_opset_of(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return 0;
}

// Constant node -> tensor (its value attribute in any of the spec's forms).
at::Tensor constant_value(const Node& n) {
  if (n.has_attr("value")) return n.attr_tensor("value");
  if (n.has_attr("value_float")) return at::scalar_tensor(n.attr_float("value_float", 0), at::kFloat);
  if (n.has_attr("value_int")) return at::scalar_tensor(n.attr_int("value_int", 0), at::kLong);
  if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    return at::tensor(std::vector<float>(v.begin(), v.end()), at::kFloat);
  }
  if (n.has_attr("value_ints")) return at::tensor(n.attr_ints("value_ints"), at::kLong);
  throw Error(n.describe() + ": Constant with a sparse or string value is not supported");
}

/// Checks a node against its ONNX schema (input/output counts, attribute names, kinds and
/// required attributes) and the element types of its inputs whose type the file states
/// (initializers, graph inputs) against the schema's type constraints. Nodes of other domains
/// and opsets newer than the installed ONNX knows are left to their plugins.
void verify_node(const onnx::NodeProto& np, const Node& n, std::int64_t opset,
                 const std::map<std::string, std::int32_t>& known_types, const std::string& name) {
  if (!(np.domain().empty() || np.domain() == "ai.onnx") || opset > onnx_library_max_opset()) return;
  const auto* schema = onnx::OpSchemaRegistry::Schema(np.op_type(), static_cast<int>(opset), "");
  if (!schema) return;
  const std::string spec = np.op_type() + "-" + std::to_string(schema->SinceVersion());
  try {
    schema->Verify(np);
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (auto cut = why.find("==>"); cut != std::string::npos) why = why.substr(0, cut);
    while (!why.empty() && (why.back() == ' ' || why.back() == '\n' || why.back() == '.')) why.pop_back();
    throw Error(name + ": " + n.describe() + " does not follow the ONNX spec of " + spec + ": " + why +
                ". Fix or re-export the model");
  }
  const auto& formals = schema->inputs();
  for (int i = 0; i < np.input_size() && !formals.empty(); ++i) {
    auto t = known_types.find(np.input(i));
    if (np.input(i).empty() || t == known_types.end()) continue;
    const auto& formal = formals[std::min<std::size_t>(static_cast<std::size_t>(i), formals.size() - 1)];
    const std::string type = "tensor(" + onnx_type_name(t->second) + ")";
    bool allowed = false;
    for (const auto* allowed_type : formal.GetTypes()) allowed = allowed || *allowed_type == type;
    if (!allowed) {
      throw Error(name + ": " + n.describe() + ": input " + std::to_string(i) + " ('" + np.input(i) + "', " + formal.GetName() +
                  ") is " + onnx_type_name(t->second) + ", which " + spec + " does not accept");
    }
  }
}

Model model_from_proto(onnx::ModelProto& proto, const std::string& name, const ImportOptions& options) {
  if (!proto.has_graph()) throw Error(name + ": the ONNX model has no graph");
  Model model;
  model.meta.source_path = name;
  model.meta.source_opset = default_opset_of(proto);
  if (model.meta.source_opset == 0) {
    throw Error(name + ": the model imports no opset of the default ONNX domain; is it an ONNX model?");
  }
  if (options.min_opset > 0 && model.meta.source_opset < options.min_opset) {
    sdk::log_info(name + ": converting from opset " + std::to_string(model.meta.source_opset) + " to " +
                  std::to_string(options.min_opset) + " with ONNX's version converter");
    try {
      // Some adapters (Softmax 12->13) need the shapes of their inputs.
      onnx::shape_inference::InferShapes(proto);
    } catch (const std::exception& e) {
      sdk::log_debug(name + ": shape inference before opset conversion failed: " + e.what());
    }
    try {
      proto = onnx::version_conversion::ConvertVersion(proto, static_cast<int>(options.min_opset));
    } catch (const std::exception& e) {
      throw Error(name + ": ONNX's version converter could not lift the model from opset " +
                  std::to_string(model.meta.source_opset) + " to " + std::to_string(options.min_opset) + ": " +
                  e.what() + ". Re-export the model at opset " + std::to_string(options.min_opset) +
                  " or newer");
    }
  }

  const fs::path base = fs::path(name).parent_path();
  Graph& g = model.graph;
  for (const auto& o : proto.opset_import()) g.opset_imports[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  const auto& gp = proto.graph();
  for (const auto& init : gp.initializer()) {
    g.initializers[init.name()] = tensor_from_proto(init, base, name + ": initializer '" + init.name() + "'");
    if (init.data_type() == kInt4 || init.data_type() == kUint4 || init.data_type() == onnx::TensorProto::UINT16)
      g.narrow_types[init.name()] = init.data_type();
  }
  if (gp.sparse_initializer_size() > 0) throw Error(name + ": sparse initializers are not supported");
  for (const auto& in : gp.input()) {
    if (!g.initializers.count(in.name())) g.inputs.push_back(value_info_from_proto(in));
  }
  for (const auto& out : gp.output()) g.outputs.push_back(value_info_from_proto(out));

  std::map<std::string, std::int32_t> known_types;  // element types the file states
  for (const auto& init : gp.initializer()) known_types[init.name()] = init.data_type();
  for (const auto& in : gp.input())
    if (in.type().has_tensor_type() && !known_types.count(in.name())) known_types[in.name()] = in.type().tensor_type().elem_type();
  const std::int64_t opset = g.default_opset();

  std::set<std::string> used_names;
  std::size_t index = 0;
  for (const auto& np : gp.node()) {
    Node n;
    n.op_type = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    n.name = np.name().empty() ? n.op_type + "_" + std::to_string(index) : np.name();
    ++index;
    if (!used_names.insert(n.name).second) {  // names must be unique for globs and messages
      std::string base_name = n.name;
      for (int k = 1; !used_names.insert(n.name).second; ++k) n.name = base_name + "_" + std::to_string(k);
    }
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    n.doc_string = np.doc_string();
    verify_node(np, n, opset, known_types, name);
    for (const auto& a : np.attribute()) n.attributes[a.name()] = attribute_from_proto(a, base, name + ": " + n.describe());
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1) {
      g.initializers[n.outputs[0]] = constant_value(n);
      continue;
    }
    g.append(std::move(n));
  }
  try {
    g.topological_sort();
    g.validate();
  } catch (const Error& e) {
    throw Error(name + ": " + e.what());
  }

  for (const auto& kv : proto.metadata_props()) model.meta.metadata_props[kv.key()] = kv.value();
  // Keep model-level fields; nodes and tensors live in the IR from now on.
  // The graph's bulk moves out first, so that the copy is of the small remainder only.
  auto* pg = proto.mutable_graph();
  onnx::GraphProto bulk;
  bulk.mutable_node()->Swap(pg->mutable_node());
  bulk.mutable_initializer()->Swap(pg->mutable_initializer());
  bulk.mutable_input()->Swap(pg->mutable_input());
  bulk.mutable_output()->Swap(pg->mutable_output());
  model.meta.skeleton = proto.SerializeAsString();
  return model;
}

std::int64_t min_ir_version_for(std::int64_t opset) {
  if (opset >= 21) return 10;
  if (opset >= 19) return 9;
  if (opset >= 14) return 8;
  return 7;
}

}  // namespace

std::int64_t onnx_library_max_opset() {
  const auto& map = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = map.find("");
  return it == map.end() ? 0 : it->second.second;
}

namespace {
std::string read_all(std::ifstream& in) {
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::string bytes(size > 0 ? static_cast<std::size_t>(size) : 0, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return bytes;
}
}  // namespace

Model load_onnx_from_bytes(const std::string& bytes, const std::string& name, const ImportOptions& options) {
  onnx::ModelProto proto;
  if (bytes.empty()) throw Error(name + ": the file is empty, not an ONNX model");
  if (!proto.ParseFromString(bytes)) {
    throw Error(name + ": not a valid ONNX model (protobuf parsing failed: the file is truncated, "
                       "corrupt, or of another format)");
  }
  return model_from_proto(proto, name, options);
}

Model load_onnx(const std::string& path, const ImportOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path + ": no such file");
  if (fs::is_directory(path, ec)) throw Error(path + ": is a folder, expected an .onnx file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be opened for reading");
  std::string bytes = read_all(in);
  return load_onnx_from_bytes(bytes, path, options);
}

std::string serialize_onnx(const Graph& graph, const ModelMeta& meta, const ExportOptions& options) {
  onnx::ModelProto proto;
  if (!meta.skeleton.empty() && !proto.ParseFromString(meta.skeleton)) throw Error("internal: bad model skeleton");
  if (proto.ir_version() == 0) proto.set_ir_version(7);
  if (proto.producer_name().empty()) proto.set_producer_name("sparsebit");
  proto.clear_opset_import();
  for (const auto& kv : graph.opset_imports) {
    auto* o = proto.add_opset_import();
    o->set_domain(kv.first);
    o->set_version(kv.second);
  }
  const std::int64_t opset = graph.default_opset();
  proto.set_ir_version(std::max<std::int64_t>(proto.ir_version(), min_ir_version_for(opset)));
  for (const auto& [key, value] : options.metadata_props) {
    auto* props = proto.mutable_metadata_props();
    auto it = std::find_if(props->begin(), props->end(), [&](const onnx::StringStringEntryProto& e) { return e.key() == key; });
    onnx::StringStringEntryProto* entry = it != props->end() ? &*it : proto.add_metadata_props();
    entry->set_key(key);
    entry->set_value(value);
  }

  auto* gp = proto.mutable_graph();
  if (gp->name().empty()) gp->set_name("graph");
  for (const auto& v : graph.inputs) value_info_to_proto(v, gp->add_input());
  for (const auto& v : graph.outputs) value_info_to_proto(v, gp->add_output());
  for (const auto& kv : graph.initializers) {
    auto narrow = graph.narrow_types.find(kv.first);
    tensor_to_proto(kv.second, kv.first, gp->add_initializer(), narrow == graph.narrow_types.end() ? 0 : narrow->second);
  }
  std::set<std::string> names;
  for (const auto* n : graph.nodes()) {
    auto* np = gp->add_node();
    np->set_name(n->name);
    np->set_op_type(n->op_type);
    if (!n->domain.empty()) np->set_domain(n->domain);
    for (auto& s : n->inputs) np->add_input(s);
    for (auto& s : n->outputs) {
      np->add_output(s);
      names.insert(s);
    }
    if (!n->doc_string.empty()) np->set_doc_string(n->doc_string);
    for (const auto& kv : n->attributes) attribute_to_proto(kv.first, kv.second, np->add_attribute());
  }
  // Drop shape annotations of tensors that no longer exist.
  auto* vi = gp->mutable_value_info();
  for (int i = vi->size() - 1; i >= 0; --i)
    if (!names.count(vi->Get(i).name())) vi->DeleteSubrange(i, 1);

  if (options.run_checker) {
    if (opset <= onnx_library_max_opset() && proto.ir_version() <= onnx::IR_VERSION) {
      try {
        onnx::checker::check_model(proto);
      } catch (const std::exception& e) {
        throw Error(std::string("the exported model fails ONNX's checker: ") + e.what());
      }
    } else {
      sdk::log_info("opset " + std::to_string(opset) + " is newer than the installed ONNX checker knows (" +
                    std::to_string(onnx_library_max_opset()) + "); the checker was skipped");
    }
  }
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) {
    throw Error("the model could not be serialized (protobuf limit is 2 GiB; larger models need external data)");
  }
  return bytes;
}

void save_onnx(const Graph& graph, const ModelMeta& meta, const std::string& path, const ExportOptions& options) {
  AtomicFile out(path);
  out.write(serialize_onnx(graph, meta, options));
  out.commit();
}

at::Tensor load_tensor_pb(const std::string& path, std::string* name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot be opened");
  std::string bytes = read_all(in);
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes)) throw Error(path + ": not a serialized onnx.TensorProto");
  if (name) *name = p.name();
  return tensor_from_proto(p, fs::path(path).parent_path(), path);
}

}  // namespace sparsebit
