// ONNX Runtime's attention operators (domain com.microsoft): Attention, MultiHeadAttention,
// RotaryEmbedding and GroupQueryAttention, as contrib_ops.cpp says of the others.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "contrib_ops.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

/// [B, S, N * H] -> [B, N, S, H]
at::Tensor split_heads(const at::Tensor& x, std::int64_t heads) {
  return x.reshape({x.size(0), x.size(1), heads, -1}).permute({0, 2, 1, 3});
}
/// [B, N, S, H] -> [B, S, N * H]
at::Tensor merge_heads(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

/// The additive mask of a key padding mask for queries [B, S] over keys [B, T] (ONNX Runtime's
/// layouts of mask_index / key_padding_mask): [B] ends of the valid keys, [2B] ends then starts,
/// [B, T] or [B, S, T] with 0 for masked keys. Masked keys get `filter` added.
at::Tensor padding_bias(const at::Tensor& mask, std::int64_t batch, std::int64_t s, std::int64_t t, double filter,
                        const std::string& where) {
  const at::Tensor m = mask.to(at::kLong);
  const at::Tensor keys = at::arange(t, m.options()).reshape({1, t});
  at::Tensor keep;
  if (m.dim() == 1 && m.size(0) == batch) {
    keep = keys < m.reshape({batch, 1});
  } else if (m.dim() == 1 && m.size(0) == 2 * batch) {
    keep = (keys < m.narrow(0, 0, batch).reshape({batch, 1})) & (keys >= m.narrow(0, batch, batch).reshape({batch, 1}));
  } else if (m.dim() == 2 && m.size(0) == batch && m.size(1) == t) {
    keep = m != 0;
  } else if (m.dim() == 3 && m.size(0) == batch && m.size(1) == s && m.size(2) == t) {
    return ((m == 0).to(at::kFloat) * filter).unsqueeze(1);
  } else {
    throw Error(where + ": a mask of shape " + c10::str(mask.sizes()) +
                " is not one of [B], [2B], [B, T], [B, S, T] (B " + std::to_string(batch) + ", S " + std::to_string(s) +
                ", T " + std::to_string(t) + ")");
  }
  return ((~keep).to(at::kFloat) * filter).reshape({batch, 1, 1, t});
}

/// softmax(scale Q K^T + bias) V on [B, N, S, H] heads; `causal` hides keys after each query's
/// position (the past's length `past` ahead of the first query).
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, at::Tensor bias,
                  bool causal, std::int64_t past, double filter) {
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (causal) {
    const std::int64_t s = q.size(2), t = k.size(2);
    const at::Tensor later = at::arange(t, q.options().dtype(at::kLong)).reshape({1, t}) >
                             (at::arange(s, q.options().dtype(at::kLong)) + past).reshape({s, 1});
    const at::Tensor causal_bias = later.to(scores.scalar_type()) * filter;
    bias = bias.defined() ? bias + causal_bias : causal_bias;
  }
  if (bias.defined()) scores = scores + bias.to(scores.scalar_type());
  return at::matmul(at::softmax(scores, -1), v);
}

/// Attention: the self-attention of a BERT/GPT-2 layer with its packed QKV projection:
/// inputs input [B, S, D], weights [D, Dq + Dk + Dv], bias, mask_index, past [2, B, N, P, H],
/// attention_bias [B|1, N|1, S, T]; outputs [B, S, Dv] and present.
class QAttention final : public NodeQModule {
 public:
  explicit QAttention(const OpContext& c)
      : NodeQModule(c),
        heads_(c.node.attr_int("num_heads", 0)),
        causal_(c.node.attr_int("unidirectional", 0) != 0),
        sizes_(c.node.attr_ints("qkv_hidden_sizes")),
        scale_(c.node.attr_float("scale", 0.0)),
        filter_(c.node.attr_float("mask_filter_value", -10000.0)) {
    if (heads_ < 1) throw Error(describe() + ": num_heads must be a positive integer");
    if (!sizes_.empty() && sizes_.size() != 3) throw Error(describe() + ": qkv_hidden_sizes must have 3 values");
    if (c.node.attr_int("do_rotary", 0) != 0) throw Error(describe() + ": do_rotary = 1 is not supported");
  }
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, -1}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x = in.at(0);
    if (x.dim() != 3) throw Error(describe() + ": input must be [batch, sequence, hidden]");
    at::Tensor qkv = at::matmul(x, in.at(1));
    if (const at::Tensor& b = optional_input(in, 2); b.defined()) qkv = qkv + b;
    std::vector<std::int64_t> sizes = sizes_;
    if (sizes.empty()) sizes.assign(3, qkv.size(-1) / 3);
    if (sizes[0] + sizes[1] + sizes[2] != qkv.size(-1) || sizes[0] % heads_ || sizes[2] % heads_ ||
        sizes[0] != sizes[1])
      throw Error(describe() + ": the projection's " + std::to_string(qkv.size(-1)) +
                  " columns do not split into Q, K, V of qkv_hidden_sizes over " + std::to_string(heads_) + " heads");
    const auto parts = qkv.split_with_sizes(sizes, -1);
    at::Tensor q = split_heads(parts[0], heads_), k = split_heads(parts[1], heads_), v = split_heads(parts[2], heads_);
    std::int64_t past = 0;
    if (const at::Tensor& p = optional_input(in, 4); p.defined() && p.numel() > 0) {
      past = p.size(3);
      k = at::cat({p[0], k}, 2);
      v = at::cat({p[1], v}, 2);
    }
    const std::int64_t batch = x.size(0), s = x.size(1), t = k.size(2);
    at::Tensor bias;
    if (const at::Tensor& m = optional_input(in, 3); m.defined() && m.numel() > 0)
      bias = padding_bias(m, batch, s, t, filter_, describe()).to(q.device());
    if (const at::Tensor& ab = optional_input(in, 5); ab.defined() && ab.numel() > 0)
      bias = bias.defined() ? bias + ab : ab;
    const double scale = scale_ != 0 ? scale_ : 1.0 / std::sqrt(double(q.size(-1)));
    const at::Tensor out = merge_heads(attend(q, k, v, scale, bias, causal_, past, filter_));
    return {out, k.sizes() == v.sizes() ? at::stack({k, v}) : at::Tensor()};  // present only for equal heads
  }

 private:
  std::int64_t heads_;
  bool causal_;
  std::vector<std::int64_t> sizes_;
  double scale_, filter_;
};

/// MultiHeadAttention on projected query [B, S, D], key [B, T, D] and value [B, T, Dv] (or keys
/// and values already split into heads, [B, N, T, H]), with the projections' bias, a key padding
/// mask, attention_bias, past_key / past_value [B, N, P, H]; outputs [B, S, Dv], present_key,
/// present_value.
class QMultiHeadAttention final : public NodeQModule {
 public:
  explicit QMultiHeadAttention(const OpContext& c)
      : NodeQModule(c),
        heads_(c.node.attr_int("num_heads", 0)),
        causal_(c.node.attr_int("unidirectional", 0) != 0),
        scale_(c.node.attr_float("scale", 0.0)),
        filter_(c.node.attr_float("mask_filter_value", -10000.0)) {
    if (heads_ < 1) throw Error(describe() + ": num_heads must be a positive integer");
  }
  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kActivation, 0}, {InputRole::kActivation, 0}};
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    at::Tensor q = in.at(0);
    const at::Tensor& key = optional_input(in, 1);
    const at::Tensor& value = optional_input(in, 2);
    if (q.dim() != 3 || !key.defined() || !value.defined())
      throw Error(describe() +
                  ": query must be [batch, sequence, hidden] with key and value given (packed QKV is "
                  "not supported)");
    at::Tensor k = key, v = value;
    if (const at::Tensor& b = optional_input(in, 3); b.defined() && b.numel() > 0) {
      const std::int64_t d = q.size(-1);
      q = q + b.narrow(0, 0, d);
      if (k.dim() == 3) k = k + b.narrow(0, d, d);
      if (v.dim() == 3) v = v + b.narrow(0, 2 * d, b.size(0) - 2 * d);
    }
    q = split_heads(q, heads_);
    if (k.dim() == 3) k = split_heads(k, heads_);
    if (v.dim() == 3) v = split_heads(v, heads_);
    std::int64_t past = 0;
    const at::Tensor& past_k = optional_input(in, 6);
    const at::Tensor& past_v = optional_input(in, 7);
    if (past_k.defined() && past_k.numel() > 0 && past_v.defined()) {
      past = past_k.size(2);
      k = at::cat({past_k, k}, 2);
      v = at::cat({past_v, v}, 2);
    }
    const std::int64_t batch = q.size(0), s = q.size(2), t = k.size(2);
    at::Tensor bias;
    if (const at::Tensor& m = optional_input(in, 4); m.defined() && m.numel() > 0)
      bias = padding_bias(m, batch, s, t, filter_, describe()).to(q.device());
    if (const at::Tensor& ab = optional_input(in, 5); ab.defined() && ab.numel() > 0)
      bias = bias.defined() ? bias + ab : ab;
    const double scale = scale_ != 0 ? scale_ : 1.0 / std::sqrt(double(q.size(-1)));
    return {merge_heads(attend(q, k, v, scale, bias, causal_, past, filter_)), k, v};
  }

 private:
  std::int64_t heads_;
  bool causal_;
  double scale_, filter_;
};

/// RotaryEmbedding: the first rotary_embedding_dim values of each head turned by the angles of
/// cos_cache / sin_cache [max position, dim / 2] at each token's position (position_ids [B, S],
/// or [1]: an offset for positions 0..S-1), as halves (x1, x2) or interleaved pairs.
class QRotaryEmbedding final : public NodeQModule {
 public:
  explicit QRotaryEmbedding(const OpContext& c)
      : NodeQModule(c),
        interleaved_(c.node.attr_int("interleaved", 0) != 0),
        heads_(c.node.attr_int("num_heads", 0)),
        dim_(c.node.attr_int("rotary_embedding_dim", 0)),
        scale_(c.node.attr_float("scale", 1.0)) {
    if (c.node.attr_int("is_packed_batching", 0) != 0) throw Error(describe() + ": packed batching is not supported");
  }
  std::vector<InputSpec> input_specs() const override { return {}; }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& x_in = in.at(0);
    const at::Tensor& cos_cache = in.at(2);
    const at::Tensor& sin_cache = in.at(3);
    at::Tensor x;  // [B, S, N, H]
    if (x_in.dim() == 4) {
      x = x_in.permute({0, 2, 1, 3});
    } else if (x_in.dim() == 3) {
      const std::int64_t heads = heads_ > 0 ? heads_ : x_in.size(-1) / (2 * cos_cache.size(1));
      if (heads < 1 || x_in.size(-1) % heads)
        throw Error(describe() + ": hidden size " + std::to_string(x_in.size(-1)) + " does not split into heads");
      x = x_in.reshape({x_in.size(0), x_in.size(1), heads, -1});
    } else {
      throw Error(describe() + ": input must be [B, S, hidden] or [B, N, S, H]");
    }
    const std::int64_t batch = x.size(0), s = x.size(1), head = x.size(3);
    const std::int64_t dim = dim_ > 0 ? dim_ : std::min(head, 2 * cos_cache.size(1));
    // A partial rotation reads caches of exactly dim / 2 angles (what ONNX Runtime computes with).
    if (dim > head || dim % 2 || cos_cache.size(1) * 2 < dim || (dim < head && cos_cache.size(1) * 2 != dim))
      throw Error(describe() + ": rotary_embedding_dim " + std::to_string(dim) + " does not fit heads of " +
                  std::to_string(head) + " with caches of " + std::to_string(cos_cache.size(1)) +
                  " angles (a partial rotation needs caches of rotary_embedding_dim / 2 angles)");
    const at::Tensor ids = in.at(1).to(at::kLong);
    const at::Tensor positions = ids.numel() == 1 ? (at::arange(s, ids.options()) + ids.reshape({})).expand({batch, s})
                                                  : ids.reshape({batch, s});
    const std::int64_t half = dim / 2;
    // [B, S, 1, dim / 2]
    const at::Tensor cos = cos_cache.narrow(1, 0, half)
                               .index_select(0, positions.reshape({-1}).to(cos_cache.device()))
                               .reshape({batch, s, 1, half})
                               .to(x.scalar_type()),
                     sin = sin_cache.narrow(1, 0, half)
                               .index_select(0, positions.reshape({-1}).to(sin_cache.device()))
                               .reshape({batch, s, 1, half})
                               .to(x.scalar_type());
    const at::Tensor rot = x.narrow(3, 0, dim) * scale_;
    at::Tensor a, b;  // the two members of each rotated pair
    if (interleaved_) {
      const at::Tensor pairs = rot.reshape({batch, s, x.size(2), half, 2});
      a = pairs.select(4, 0);
      b = pairs.select(4, 1);
    } else {
      a = rot.narrow(3, 0, half);
      b = rot.narrow(3, half, half);
    }
    const at::Tensor ra = a * cos - b * sin, rb = a * sin + b * cos;
    const at::Tensor turned =
        interleaved_ ? at::stack({ra, rb}, 4).reshape({batch, s, x.size(2), dim}) : at::cat({ra, rb}, 3);
    at::Tensor y = dim < head ? at::cat({turned, x.narrow(3, dim, head - dim)}, 3) : turned;
    return {x_in.dim() == 4 ? y.permute({0, 2, 1, 3}).contiguous() : y.reshape(x_in.sizes())};
  }

 private:
  bool interleaved_;
  std::int64_t heads_, dim_;
  double scale_;
};

/// x [B, N, S, H] turned at positions [B, S] by caches [P, H / 2] (RotaryEmbedding's rule over the
/// whole head).
at::Tensor rotate_heads(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_cache,
                        const at::Tensor& sin_cache, bool interleaved) {
  const std::int64_t batch = x.size(0), s = x.size(2), half = x.size(3) / 2;
  auto angles = [&](const at::Tensor& cache) {
    return cache.narrow(1, 0, half)
        .index_select(0, positions.reshape({-1}).to(cache.device()))
        .reshape({batch, 1, s, half})
        .to(x.scalar_type());
  };
  const at::Tensor cos = angles(cos_cache), sin = angles(sin_cache);
  at::Tensor a, b;
  if (interleaved) {
    const at::Tensor pairs = x.reshape({batch, x.size(1), s, half, 2});
    a = pairs.select(4, 0);
    b = pairs.select(4, 1);
  } else {
    a = x.narrow(3, 0, half);
    b = x.narrow(3, half, half);
  }
  const at::Tensor ra = a * cos - b * sin, rb = a * sin + b * cos;
  return interleaved ? at::stack({ra, rb}, 4).reshape(x.sizes()) : at::cat({ra, rb}, 3);
}

/// GroupQueryAttention: causal attention whose kv_num_heads key/value heads each serve
/// num_heads / kv_num_heads query heads; query [B, S, N * H], key and value [B, S, Nk * H],
/// past_key / past_value [B, Nk, P, H] (separate from the present), seqlens_k [B] (each
/// sequence's last valid key), total_sequence_length; optional rotary embedding of query and key
/// (do_rotary with cos_cache / sin_cache), a sliding window (local_window_size) and a soft cap.
class QGroupQueryAttention final : public NodeQModule {
 public:
  explicit QGroupQueryAttention(const OpContext& c)
      : NodeQModule(c),
        heads_(c.node.attr_int("num_heads", 0)),
        kv_heads_(c.node.attr_int("kv_num_heads", 0)),
        scale_(c.node.attr_float("scale", 0.0)),
        softcap_(c.node.attr_float("softcap", 0.0)),
        window_(c.node.attr_int("local_window_size", -1)),
        rotary_(c.node.attr_int("do_rotary", 0) != 0),
        interleaved_(c.node.attr_int("rotary_interleaved", 0) != 0) {
    if (heads_ < 1 || kv_heads_ < 1 || heads_ % kv_heads_)
      throw Error(describe() + ": num_heads must be a positive multiple of kv_num_heads");
    if (c.node.attr_int("smooth_softmax", 0) != 0) throw Error(describe() + ": smooth_softmax is not supported");
  }
  std::vector<InputSpec> input_specs() const override {
    return reading_on_host({{InputRole::kActivation, 0}, {InputRole::kActivation, 0}, {InputRole::kActivation, 0}},
                           {6});
  }
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    const at::Tensor& query = in.at(0);
    const at::Tensor& key = optional_input(in, 1);
    const at::Tensor& value = optional_input(in, 2);
    if (query.dim() != 3 || !key.defined() || !value.defined())
      throw Error(describe() +
                  ": query, key and value must be [batch, sequence, hidden] (packed QKV is not supported)");
    at::Tensor q = split_heads(query, heads_), k = split_heads(key, kv_heads_), v = split_heads(value, kv_heads_);
    const std::int64_t batch = q.size(0), s = q.size(2);
    const at::Tensor& past_k = optional_input(in, 3);
    const at::Tensor& past_v = optional_input(in, 4);
    const std::int64_t past = past_k.defined() ? past_k.size(2) : 0;
    const std::int64_t total = in.at(6).to(at::kCPU, at::kLong).reshape({-1})[0].item<std::int64_t>();
    if (past + s != total)
      throw Error(describe() + ": total_sequence_length " + std::to_string(total) + " is not the past's " +
                  std::to_string(past) + " plus " + std::to_string(s) +
                  " new tokens (a past buffer shared with the present is not supported)");
    const at::Tensor valid = in.at(5).to(at::kLong).reshape({batch, 1});  // last valid key per sequence
    if (rotary_) {
      const at::Tensor positions = (at::arange(s, valid.options()) + past).expand({batch, s});
      q = rotate_heads(q, positions, in.at(7), in.at(8), interleaved_);
      k = rotate_heads(k, positions, in.at(7), in.at(8), interleaved_);
    }
    if (past > 0) {
      k = at::cat({past_k, k}, 2);
      v = at::cat({past_v, v}, 2);
    }
    const std::int64_t t = k.size(2), group = heads_ / kv_heads_;
    const at::Tensor keys = at::arange(t, valid.options()).reshape({1, 1, t});
    const at::Tensor at_query = (at::arange(s, valid.options()) + past).reshape({1, s, 1});
    at::Tensor hidden = (keys > at_query) | (keys > valid.reshape({batch, 1, 1}));
    if (window_ > 0) hidden = hidden | (keys <= at_query - window_);
    at::Tensor scores = at::matmul(q, k.repeat_interleave(group, 1).transpose(-1, -2)) *
                        (scale_ != 0 ? scale_ : 1.0 / std::sqrt(double(q.size(-1))));
    if (softcap_ > 0) scores = at::tanh(scores / softcap_) * softcap_;
    scores = scores.masked_fill(hidden.unsqueeze(1), -std::numeric_limits<float>::infinity());
    const at::Tensor out = at::matmul(at::softmax(scores, -1), v.repeat_interleave(group, 1));
    return {merge_heads(out), k, v};
  }

 private:
  std::int64_t heads_, kv_heads_;
  double scale_, softcap_;
  std::int64_t window_;
  bool rotary_, interleaved_;
};

}  // namespace

void register_attention_ops(Registrar& r) {
  r.add_op<QAttention>("Attention", kMs);
  r.add_op<QMultiHeadAttention>("MultiHeadAttention", kMs);
  r.add_op<QRotaryEmbedding>("RotaryEmbedding", kMs);
  r.add_op<QGroupQueryAttention>("GroupQueryAttention", kMs);
}

}  // namespace sparsebit::ops
