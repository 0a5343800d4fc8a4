// Note [MatMulNBits export]
// ONNX Runtime runs weight-only 4-bit layers fastest as its contrib op com.microsoft.MatMulNBits
// (Note [MatMulNBits] in the quantization ops plugin has its semantics). After the QDQ export,
// a MatMul (weight [K, N]) or Gemm (transA = 0, alpha = beta = 1, weight [K, N] or, with
// transB, [N, K]; a bias of N values) whose weight is a DequantizeLinear of constant 4- or 8-bit
// integers in blocks along K becomes one MatMulNBits node: the codes laid out as [N, K] and
// made unsigned (signed q + 2^(bits-1) with that as the zero point), packed low bits first into
// [N, k_blocks, block_size * bits / 8] bytes (a ragged last block padded with its zero point),
// scales [N * k_blocks], zero points packed the same way unless they all equal the default
// 2^(bits-1). block_size must be a power of two of at least 16 (ONNX Runtime's rule); other
// layers keep their DequantizeLinear, each named in the log.

#include "sparsebit/core/matmul_nbits.h"

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "base/core_ops.h"
#include "base/log.h"
#include "sparsebit/sdk/log.h"

namespace sparsebit {
namespace {

/// codes [rows, count] (values below 2^bits) -> bytes [rows, count * bits / 8], low bits first.
at::Tensor pack(const at::Tensor& codes, std::int64_t bits) {
  const std::int64_t per_byte = 8 / bits;
  const at::Tensor c = codes.to(at::kInt).reshape({codes.size(0), -1, per_byte});
  at::Tensor bytes = at::zeros({c.size(0), c.size(1)}, at::kInt);
  for (std::int64_t j = 0; j < per_byte; ++j) bytes.bitwise_or_(at::bitwise_left_shift(c.select(2, j), j * bits));
  return bytes.to(at::kByte);
}

struct Candidate {
  Node* layer;
  Node* dq;
  std::int64_t k, n, bits, block;
  bool weight_kn;  // the integers are [K, N] (else [N, K])
  bool gemm;       // else a MatMul
};

std::string why_not(Graph& g, Node* layer, Candidate& c) {
  const bool gemm = layer->op_type == "Gemm";
  if (layer->domain != "" || (layer->op_type != "MatMul" && !gemm) || !layer->has_input(1)) return "skip";
  Node* dq = g.producer(layer->inputs[1]);
  if (!dq || !core_ops::is(*dq, core_ops::kDequantizeLinear) || !dq->has_attr("block_size")) return "skip";
  if (gemm && (layer->attr_int("transA", 0) != 0 || layer->attr_float("alpha", 1.0) != 1.0 ||
               layer->attr_float("beta", 1.0) != 1.0))
    return "a Gemm with transA, alpha or beta";
  auto q = g.initializers.find(dq->inputs[0]);
  if (q == g.initializers.end() || q->second.dim() != 2) return "its weight's integers are not a 2-D constant";
  if (!g.initializers.count(dq->inputs[1]) || (dq->has_input(2) && !g.initializers.count(dq->inputs[2])))
    return "its weight's scale or zero point is not a constant";
  c.layer = layer;
  c.gemm = gemm;
  c.dq = dq;
  c.weight_kn = !(gemm && layer->attr_int("transB", 0) != 0);
  const std::int64_t axis = dq->attr_int("axis", 1);
  if ((axis < 0 ? axis + 2 : axis) != (c.weight_kn ? 0 : 1)) return "its blocks do not run along K";
  c.k = q->second.size(c.weight_kn ? 0 : 1);
  c.n = q->second.size(c.weight_kn ? 1 : 0);
  c.block = dq->attr_int("block_size", 0);
  if (c.block < 16 || (c.block & (c.block - 1)) != 0)
    return "block_size " + std::to_string(c.block) + " (MatMulNBits needs a power of two >= 16)";
  const auto narrow = g.narrow_types.find(dq->inputs[0]);
  const at::ScalarType t = q->second.scalar_type();
  if (narrow != g.narrow_types.end() && (narrow->second == 21 || narrow->second == 22)) c.bits = 4;
  else if (narrow == g.narrow_types.end() && (t == at::kChar || t == at::kByte)) c.bits = 8;
  else return "its integers are neither 4- nor 8-bit";
  if (gemm && layer->has_input(2)) {
    auto bias = g.initializers.find(layer->inputs[2]);
    if (bias == g.initializers.end() || bias->second.numel() != c.n || bias->second.dim() != 1)
      return "a Gemm bias that is not a constant of N values";
  }
  return "";
}

void rewrite(Graph& g, const Candidate& c, std::int64_t accuracy_level) {
  const at::Tensor q = g.initializers.at(c.dq->inputs[0]);
  const bool is_signed = q.scalar_type() == at::kChar;
  const std::int64_t blocks = (c.k + c.block - 1) / c.block, half = std::int64_t{1} << (c.bits - 1);
  at::Tensor codes = (c.weight_kn ? q.t() : q).to(at::kLong);  // [N, K]
  at::Tensor scale = g.initializers.at(c.dq->inputs[1]).to(at::kFloat);
  scale = (c.weight_kn ? scale.t() : scale).contiguous();  // [N, blocks]
  at::Tensor zp =
      c.dq->has_input(2) ? g.initializers.at(c.dq->inputs[2]).to(at::kLong) : at::zeros_like(scale, at::kLong);
  zp = (c.weight_kn ? zp.t() : zp).contiguous();
  if (is_signed) {
    codes = codes + half;
    zp = zp + half;
  }
  if (blocks * c.block != c.k) {  // ragged last block: pad with its zero point
    const at::Tensor pad = zp.select(1, blocks - 1).unsqueeze(1).expand({c.n, blocks * c.block - c.k});
    codes = at::cat({codes, pad}, 1);
  }
  at::Tensor b = pack(codes, c.bits).reshape({c.n, blocks, c.block * c.bits / 8});

  const std::string base = c.layer->name.empty() ? g.unique_name("matmul_nbits") : c.layer->name;
  Node m;
  m.op_type = core_ops::kMatMulNBits;
  m.domain = "com.microsoft";
  m.name = g.unique_name(base + "_MatMulNBits");
  const std::string b_name = g.unique_name(base + "_B"), s_name = g.unique_name(base + "_scales");
  g.initializers[b_name] = b;
  g.initializers[s_name] = scale.reshape({-1});
  m.inputs = {c.layer->inputs[0], b_name, s_name};
  if (!at::all(zp == half).item<bool>()) {
    const std::int64_t per_byte = 8 / c.bits, padded = (blocks + per_byte - 1) / per_byte * per_byte;
    at::Tensor z = padded == blocks ? zp : at::cat({zp, at::full({c.n, padded - blocks}, half, at::kLong)}, 1);
    const std::string z_name = g.unique_name(base + "_zero_points");
    g.initializers[z_name] = pack(z, c.bits).reshape({-1});
    m.inputs.push_back(z_name);
  }
  if (c.gemm && c.layer->has_input(2)) {
    m.inputs.resize(5);  // zero_points and g_idx may stay empty
    m.inputs.push_back(c.layer->inputs[2]);
  }
  m.outputs = {c.layer->outputs[0]};
  m.attributes["K"] = Attribute::of_int(c.k);
  m.attributes["N"] = Attribute::of_int(c.n);
  m.attributes["bits"] = Attribute::of_int(c.bits);
  m.attributes["block_size"] = Attribute::of_int(c.block);
  m.attributes["accuracy_level"] = Attribute::of_int(accuracy_level);
  const Node* layer = c.layer;
  g.insert_before(layer, std::move(m));
  g.erase(layer);
}

}  // namespace

std::size_t to_matmul_nbits(Graph& g, std::int64_t accuracy_level) {
  std::vector<Candidate> todo;
  for (Node* n : g.nodes()) {
    Candidate c{};
    const std::string why = why_not(g, n, c);
    if (why.empty()) todo.push_back(c);
    else if (why != "skip") logs::info("{}", n->describe() + " keeps DequantizeLinear weights: " + why);
  }
  for (const Candidate& c : todo) rewrite(g, c, accuracy_level);
  if (!todo.empty()) {
    g.opset_imports["com.microsoft"] = 1;
    g.prune_dead();  // the DequantizeLinear nodes and integers no other layer reads
  }
  return todo.size();
}

}  // namespace sparsebit
