// Adam stepping all parameters of a group at once (Note [Fused Adam]).

#include "sparsebit/core/fused_adam.h"

#include "sparsebit/sdk/error.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

namespace sparsebit {

namespace {

// The optimizer's state is keyed by the parameter's TensorImpl: as a string in LibTorch 1.x,
// as the pointer in later versions.
template <class Map>
typename Map::key_type key_of(const Map&, const at::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;  // as LibTorch 1.x writes it
    address << p.unsafeGetTensorImpl();
    return address.str();
  } else {
    return reinterpret_cast<Key>(p.unsafeGetTensorImpl());
  }
}

}  // namespace

torch::optim::AdamParamState* adam_state(torch::optim::Adam& adam, const at::Tensor& p) {
  auto& states = adam.state();
  auto found = states.find(key_of(states, p));
  return found == states.end() ? nullptr : static_cast<torch::optim::AdamParamState*>(found->second.get());
}

at::Tensor FusedAdam::step(LossClosure closure) {
  if (counts_steps_on_device()) {
    if (closure) throw Error("FusedAdam: no closure while steps are counted on the device");
    step_on_device();
    return {};
  }
  for (auto& group : param_groups())
    if (static_cast<torch::optim::AdamOptions&>(group.options()).amsgrad()) return Adam::step(std::move(closure));
  c10::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable(true);
    loss = closure();
  }
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& o = static_cast<torch::optim::AdamOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    // Parameters by their step count (one count unless some skipped steps without gradient).
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
      std::vector<torch::optim::AdamParamState*> states;
    };
    std::map<std::int64_t, Lists> by_step;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "Adam does not support sparse gradients");
      auto key = key_of(states, p);
      auto found = states.find(key);
      if (found == states.end()) {
        auto fresh = std::make_unique<torch::optim::AdamParamState>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        found = states.emplace(key, std::move(fresh)).first;
      }
      auto& s = static_cast<torch::optim::AdamParamState&>(*found->second);
      Lists& l = by_step[s.step()];
      l.params.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avg.push_back(s.exp_avg());
      l.exp_avg_sq.push_back(s.exp_avg_sq());
      l.states.push_back(&s);
    }
    for (auto& [before, l] : by_step) {
      const std::int64_t step = before + 1;
      for (auto* s : l.states) s->step(step);
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
      std::vector<at::Tensor> grads =
          o.weight_decay() != 0 ? at::_foreach_add(l.grads, l.params, o.weight_decay()) : l.grads;
      at::_foreach_mul_(l.exp_avg, beta1);
      at::_foreach_add_(l.exp_avg, grads, 1 - beta1);
      at::_foreach_mul_(l.exp_avg_sq, beta2);
      at::_foreach_addcmul_(l.exp_avg_sq, grads, grads, 1 - beta2);
      std::vector<at::Tensor> denom = at::_foreach_sqrt(l.exp_avg_sq);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(l.params, l.exp_avg, denom, -(o.lr() / bias_correction1));
    }
  }
  return loss;
}

bool FusedAdam::count_steps_on_device() {
  if (counts_steps_on_device()) return true;
  auto& states = state();
  std::vector<at::Tensor> counts;
  for (auto& group : param_groups()) {
    if (static_cast<torch::optim::AdamOptions&>(group.options()).amsgrad()) return false;
    std::optional<std::int64_t> step;
    at::Device device = at::kCPU;
    for (auto& p : group.params()) {
      std::int64_t s = 0;
      if (auto found = states.find(key_of(states, p)); found != states.end())
        s = static_cast<torch::optim::AdamParamState&>(*found->second).step();
      if (step && *step != s) return false;
      step = s;
      device = p.device();
    }
    counts.push_back(at::full({}, double(step.value_or(0)), at::TensorOptions().dtype(at::kDouble).device(device)));
  }
  for (auto& group : param_groups())
    for (auto& p : group.params()) {
      auto key = key_of(states, p);
      if (states.find(key) != states.end()) continue;
      auto fresh = std::make_unique<torch::optim::AdamParamState>();
      fresh->step(0);
      fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      states.emplace(key, std::move(fresh));
    }
  device_steps_ = std::move(counts);
  return true;
}

void FusedAdam::sync_steps() {
  if (!counts_steps_on_device()) return;
  auto& states = state();
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    const auto step = static_cast<std::int64_t>(device_steps_[g].item<double>());
    for (auto& p : param_groups()[g].params())
      if (auto found = states.find(key_of(states, p)); found != states.end())
        static_cast<torch::optim::AdamParamState&>(*found->second).step(step);
  }
}

void FusedAdam::step_on_device() {
  c10::NoGradGuard no_grad;
  auto& states = state();
  for (std::size_t g = 0; g < param_groups().size(); ++g) {
    auto& group = param_groups()[g];
    const auto& o = static_cast<torch::optim::AdamOptions&>(group.options());
    const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
    std::vector<at::Tensor> params, grads, exp_avg, exp_avg_sq;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& s = static_cast<torch::optim::AdamParamState&>(*states.at(key_of(states, p)));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avg.push_back(s.exp_avg());
      exp_avg_sq.push_back(s.exp_avg_sq());
    }
    if (params.empty()) continue;
    // Adam's bias corrections from the count, in double on the device, then in the
    // parameters' type as the host path's scalars are.
    at::Tensor& count = device_steps_[g];
    count.add_(1);
    const at::Tensor bias_correction1 = 1 - at::pow(beta1, count);
    const at::Tensor bias_correction2 = 1 - at::pow(beta2, count);
    const at::Tensor step_size = (-o.lr() / bias_correction1).to(params[0].scalar_type());
    const at::Tensor bias_sqrt = bias_correction2.sqrt().to(params[0].scalar_type());
    if (o.weight_decay() != 0) grads = at::_foreach_add(grads, params, o.weight_decay());
    at::_foreach_mul_(exp_avg, beta1);
    at::_foreach_add_(exp_avg, grads, 1 - beta1);
    at::_foreach_mul_(exp_avg_sq, beta2);
    at::_foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2);
    // One 0-dim tensor per parameter: the list forms broadcast it (Python's capturable Adam
    // does the same with its per-parameter counts).
    std::vector<at::Tensor> denom = at::_foreach_sqrt(exp_avg_sq);
    at::_foreach_div_(denom, std::vector<at::Tensor>(params.size(), bias_sqrt));
    at::_foreach_add_(denom, o.eps());
    std::vector<at::Tensor> update = at::_foreach_div(exp_avg, denom);
    at::_foreach_mul_(update, std::vector<at::Tensor>(params.size(), step_size));
    at::_foreach_add_(params, update);
  }
}

}  // namespace sparsebit
