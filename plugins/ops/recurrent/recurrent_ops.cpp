// Recurrent layers: RNN, GRU, LSTM, with every option of the ONNX spec (directions, activation
// lists with their alphas and betas, clip, sequence_lens, initial states, layout 0 and 1,
// GRU's linear_before_reset, LSTM's peepholes and input_forget).
//
// The input projection of all time steps is one matrix product; only the recurrent product runs
// step by step. Roles: X is an activation, W and R are weights quantized per channel along axis 1
// (one channel per row of the stacked gates, so every gate of every direction gets its own
// scales); biases, peepholes and states stay float, as no backend has an integer recurrent kernel
// that would read them quantized.

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <functional>

#include "opset_lift.h"
#include "ops_common.h"
#include "sparsebit/sdk/plugin.h"

namespace sparsebit::ops {
namespace {

using Activation = std::function<at::Tensor(const at::Tensor&)>;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return s;
}

// An ONNX recurrent activation by name; alpha and beta come from activation_alpha/beta, which
// are consumed in order by the activations that take them (as ONNX Runtime reads them).
struct ActivationSpec {
  const char* name;
  int params;  // 0: none, 1: alpha, 2: alpha and beta
  double alpha, beta;
};

const ActivationSpec kActivations[] = {
    {"relu", 0, 0, 0},           {"tanh", 0, 0, 0},
    {"sigmoid", 0, 0, 0},        {"affine", 2, 1.0, 0.0},
    {"leakyrelu", 1, 0.01, 0},   {"thresholdedrelu", 1, 1.0, 0},
    {"scaledtanh", 2, 1.0, 1.0}, {"hardsigmoid", 2, 0.2, 0.5},
    {"elu", 1, 1.0, 0},          {"softsign", 0, 0, 0},
    {"softplus", 0, 0, 0},
};

Activation make_activation(const std::string& name, double a, double b) {
  if (name == "relu") return [](const at::Tensor& x) { return at::relu(x); };
  if (name == "tanh") return [](const at::Tensor& x) { return at::tanh(x); };
  if (name == "sigmoid") return [](const at::Tensor& x) { return at::sigmoid(x); };
  if (name == "affine") return [a, b](const at::Tensor& x) { return x * a + b; };
  if (name == "leakyrelu") return [a](const at::Tensor& x) { return at::where(x >= 0, x, x * a); };
  if (name == "thresholdedrelu") return [a](const at::Tensor& x) { return at::where(x > a, x, at::zeros_like(x)); };
  if (name == "scaledtanh") return [a, b](const at::Tensor& x) { return at::tanh(x * b) * a; };
  if (name == "hardsigmoid") return [a, b](const at::Tensor& x) { return at::clamp(x * a + b, 0.0, 1.0); };
  if (name == "elu") return [a](const at::Tensor& x) { return at::where(x >= 0, x, (at::exp(x) - 1) * a); };
  if (name == "softsign") return [](const at::Tensor& x) { return x / (x.abs() + 1); };
  return [](const at::Tensor& x) { return at::softplus(x); };
}

struct Cell {
  std::int64_t gates;                            // 1 (RNN), 3 (GRU), 4 (LSTM)
  std::vector<std::string> default_activations;  // per direction
};

class QRecurrent final : public NodeQModule {
 public:
  QRecurrent(const OpContext& c, Cell cell) : NodeQModule(c), cell_(std::move(cell)) {
    const Node& n = c.node;
    hidden_ = n.attr_int("hidden_size", 0);
    layout_ = n.attr_int("layout", 0);
    clip_ = n.has_attr("clip") ? n.attr_float("clip", 0) : -1;
    linear_before_reset_ = n.attr_int("linear_before_reset", 0) != 0;
    input_forget_ = n.attr_int("input_forget", 0) != 0;
    const std::string direction = n.attr_string("direction", "forward");
    if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
      throw Error(describe() + ": direction '" + direction + "' is not one of forward, reverse, bidirectional");
    reverse_ = direction == "reverse";
    directions_ = direction == "bidirectional" ? 2 : 1;
    if (layout_ != 0 && layout_ != 1) throw Error(describe() + ": layout must be 0 or 1");
    if (c.node.has_attr("clip") && clip_ <= 0) throw Error(describe() + ": clip must be positive");

    const std::size_t per_dir = cell_.default_activations.size();
    std::vector<std::string> names;
    if (n.has_attr("activations")) {
      const Attribute& a = n.attributes.at("activations");
      if (a.kind != Attribute::Kind::kStrings)
        throw Error(describe() + ": attribute activations must be a list of strings, got " + a.kind_name());
      for (const auto& s : a.strings) names.push_back(lower(s));
    }
    if (names.empty())
      for (std::int64_t d = 0; d < directions_; ++d)
        names.insert(names.end(), cell_.default_activations.begin(), cell_.default_activations.end());
    if (names.size() != per_dir * static_cast<std::size_t>(directions_))
      throw Error(describe() + ": activations lists " + std::to_string(names.size()) + " functions, expected " +
                  std::to_string(per_dir * directions_) + " (" + std::to_string(per_dir) + " per direction)");
    const auto alphas = n.attr_floats("activation_alpha"), betas = n.attr_floats("activation_beta");
    std::size_t ai = 0, bi = 0;
    for (const auto& name : names) {
      const ActivationSpec* spec = nullptr;
      for (const auto& s : kActivations)
        if (name == s.name) spec = &s;
      if (!spec)
        throw Error(describe() + ": activation '" + name +
                    "' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
                    "HardSigmoid, Elu, Softsign, Softplus");
      double a = spec->alpha, b = spec->beta;
      if (spec->params >= 1 && ai < alphas.size()) a = alphas[ai++];
      if (spec->params >= 2 && bi < betas.size()) b = betas[bi++];
      activations_.push_back(make_activation(name, a, b));
    }
  }

  std::vector<InputSpec> input_specs() const override {
    return {{InputRole::kActivation, 0}, {InputRole::kWeight, 1}, {InputRole::kWeight, 1}};
  }

  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& in) override {
    auto opt = [&](std::size_t i) { return i < in.size() && in[i].defined() ? in[i] : at::Tensor(); };
    at::Tensor x = in.at(0), w = in.at(1), r = in.at(2), bias = opt(3), lens = opt(4), h0 = opt(5);
    at::Tensor c0 = cell_.gates == 4 ? opt(6) : at::Tensor(), peep = cell_.gates == 4 ? opt(7) : at::Tensor();
    if (x.dim() != 3) throw Error(describe() + ": X must be 3-D, got rank " + std::to_string(x.dim()));
    if (layout_ == 1) x = x.transpose(0, 1);  // [seq, batch, input] from here on
    const std::int64_t seq = x.size(0), batch = x.size(1), g = cell_.gates;
    const std::int64_t hidden = hidden_ > 0 ? hidden_ : w.size(1) / g;
    check_shape(w, {directions_, g * hidden, x.size(2)}, "W");
    check_shape(r, {directions_, g * hidden, hidden}, "R");
    if (bias.defined()) check_shape(bias, {directions_, 2 * g * hidden}, "B");
    if (peep.defined()) check_shape(peep, {directions_, 3 * hidden}, "P");
    auto state = [&](at::Tensor s, const char* what) {
      if (!s.defined()) return at::zeros({directions_, batch, hidden}, x.options());
      if (layout_ == 1) s = s.transpose(0, 1);
      check_shape(s, {directions_, batch, hidden}, what);
      return s;
    };
    h0 = state(h0, "initial_h");
    if (g == 4) c0 = state(c0, "initial_c");
    std::vector<std::int64_t> lengths;
    if (lens.defined()) {
      lengths = int_list(lens, node(), "sequence_lens");
      if (static_cast<std::int64_t>(lengths.size()) != batch)
        throw Error(describe() + ": sequence_lens has " + std::to_string(lengths.size()) + " entries for a batch of " +
                    std::to_string(batch));
      for (auto l : lengths)
        if (l < 0 || l > seq)
          throw Error(describe() + ": sequence_lens holds " + std::to_string(l) + ", outside 0.." +
                      std::to_string(seq));
    }

    std::vector<at::Tensor> ys, hs, cs;
    for (std::int64_t d = 0; d < directions_; ++d) {
      const bool backwards = reverse_ || d == 1;
      at::Tensor order = time_order(seq, batch, lengths, backwards, x.device());
      at::Tensor xd = order.defined() ? at::take_along_dim(x, order.unsqueeze(-1), 0) : x;
      Direction dir{w[d], r[d], bias.defined() ? bias[d] : at::Tensor(), peep.defined() ? peep[d] : at::Tensor(),
                    std::vector<Activation>(activations_.begin() + d * cell_.default_activations.size(),
                                            activations_.begin() + (d + 1) * cell_.default_activations.size())};
      auto [y, h, c] = run(xd, dir, h0[d], g == 4 ? c0[d] : at::Tensor(), lengths, hidden);
      if (order.defined()) y = at::take_along_dim(y, order.unsqueeze(-1), 0);  // the order is its own inverse
      ys.push_back(y);
      hs.push_back(h);
      if (g == 4) cs.push_back(c);
    }
    at::Tensor y = at::stack(ys, 1);  // [seq, dirs, batch, hidden]
    at::Tensor yh = at::stack(hs, 0);
    if (layout_ == 1) {
      y = y.permute({2, 0, 1, 3});
      yh = yh.transpose(0, 1);
    }
    std::vector<at::Tensor> out{y.contiguous(), yh.contiguous()};
    if (g == 4) {
      at::Tensor yc = at::stack(cs, 0);
      out.push_back((layout_ == 1 ? yc.transpose(0, 1) : yc).contiguous());
    }
    return out;
  }

 private:
  struct Direction {
    at::Tensor w, r, b, p;
    std::vector<Activation> f;
  };

  void check_shape(const at::Tensor& t, std::vector<std::int64_t> want, const char* what) const {
    if (t.sizes() != at::IntArrayRef(want))
      throw Error(describe() + ": " + what + " has shape " + c10::str(t.sizes()) + ", expected " +
                  c10::str(at::IntArrayRef(want)));
  }

  // For a backward direction: time index per (step, batch) that reads each sequence from its last
  // valid step to its first, padding steps kept in place. Undefined for a plain forward pass.
  static at::Tensor time_order(std::int64_t seq, std::int64_t batch, const std::vector<std::int64_t>& lengths,
                               bool backwards, at::Device device) {
    if (!backwards) return {};
    at::Tensor t = at::arange(seq, at::kLong).unsqueeze(1).expand({seq, batch});
    at::Tensor len = lengths.empty() ? at::full({batch}, seq, at::kLong) : at::tensor(lengths, at::kLong);
    return at::where(t < len, len - 1 - t, t).to(device);
  }

  at::Tensor clip(const at::Tensor& x) const { return clip_ > 0 ? at::clamp(x, -clip_, clip_) : x; }

  std::tuple<at::Tensor, at::Tensor, at::Tensor> run(const at::Tensor& x, const Direction& d, at::Tensor h,
                                                     at::Tensor c, const std::vector<std::int64_t>& lengths,
                                                     std::int64_t hidden) const {
    const std::int64_t seq = x.size(0), g = cell_.gates;
    at::Tensor xw = at::matmul(x, d.w.t());  // [seq, batch, g * hidden]
    at::Tensor wb, rb;
    if (d.b.defined()) {
      wb = d.b.narrow(0, 0, g * hidden);
      rb = d.b.narrow(0, g * hidden, g * hidden);
      xw = xw + wb;
    }
    at::Tensor valid;  // [seq, batch, 1]: step t of sequence b is inside its length
    if (!lengths.empty())
      valid = (at::arange(seq, at::kLong).unsqueeze(1) < at::tensor(lengths, at::kLong).unsqueeze(0))
                  .unsqueeze(-1)
                  .to(x.device());
    at::Tensor pi, po, pf;
    if (d.p.defined()) {
      auto p = d.p.split(hidden);
      pi = p[0], po = p[1], pf = p[2];
    }
    std::vector<at::Tensor> ys;
    ys.reserve(seq);
    for (std::int64_t t = 0; t < seq; ++t) {
      at::Tensor hn, cn;
      if (g == 1) {
        at::Tensor pre = xw[t] + at::matmul(h, d.r.t());
        if (rb.defined()) pre = pre + rb;
        hn = d.f[0](clip(pre));
      } else if (g == 3) {  // gates z, r, h
        auto xg = xw[t].split(hidden, -1);
        auto rw = d.r.split(hidden, 0);
        std::vector<at::Tensor> rbs = rb.defined() ? rb.split(hidden) : std::vector<at::Tensor>{};
        auto rec = [&](int k, const at::Tensor& hh) {
          at::Tensor v = at::matmul(hh, rw[k].t());
          return rbs.empty() ? v : v + rbs[k];
        };
        at::Tensor z = d.f[0](clip(xg[0] + rec(0, h)));
        at::Tensor rr = d.f[0](clip(xg[1] + rec(1, h)));
        at::Tensor cand = linear_before_reset_ ? xg[2] + rr * rec(2, h) : xg[2] + rec(2, rr * h);
        at::Tensor hh = d.f[1](clip(cand));
        hn = (1 - z) * hh + z * h;
      } else {  // gates i, o, f, c
        at::Tensor pre = xw[t] + at::matmul(h, d.r.t());
        if (rb.defined()) pre = pre + rb;
        auto p = pre.split(hidden, -1);
        at::Tensor i = d.f[0](clip(pi.defined() ? p[0] + pi * c : p[0]));
        at::Tensor f = input_forget_ ? 1 - i : d.f[0](clip(pf.defined() ? p[2] + pf * c : p[2]));
        at::Tensor cc = d.f[1](clip(p[3]));
        cn = f * c + i * cc;
        at::Tensor o = d.f[0](clip(po.defined() ? p[1] + po * cn : p[1]));
        hn = o * d.f[2](cn);
      }
      if (valid.defined()) {  // past a sequence's end: state kept, output zero
        hn = at::where(valid[t], hn, h);
        if (g == 4) cn = at::where(valid[t], cn, c);
        ys.push_back(at::where(valid[t], hn, at::zeros_like(hn)));
      } else {
        ys.push_back(hn);
      }
      h = hn;
      if (g == 4) c = cn;
    }
    at::Tensor y = seq > 0 ? at::stack(ys, 0) : at::zeros({0, x.size(1), hidden}, x.options());
    return {y, h, c};
  }

  Cell cell_;
  std::int64_t hidden_ = 0, layout_ = 0, directions_ = 1;
  double clip_ = -1;
  bool reverse_ = false, linear_before_reset_ = false, input_forget_ = false;
  std::vector<Activation> activations_;
};

void register_all(Registrar& r) {
  auto cell = [&r](const char* op, Cell cell) {
    r.add_op_factory(op, "", [cell](const OpContext& c) -> std::unique_ptr<QModule> {
      return std::make_unique<QRecurrent>(c, cell);
    });
  };
  cell("RNN", Cell{1, {"tanh"}});
  cell("GRU", Cell{3, {"sigmoid", "tanh"}});
  cell("LSTM", Cell{4, {"sigmoid", "tanh", "tanh"}});
  for (const char* op : {"RNN", "GRU", "LSTM"}) r.add_op_traits<SameMeaning<>>(op);
}

}  // namespace
}  // namespace sparsebit::ops

SPARSEBIT_PLUGIN("sparsebit.ops.recurrent", SPARSEBIT_PLUGIN_VERSION, sparsebit::ops::register_all)
