// Adam stepping all parameters of a group at once (Note [Fused Adam]).

#include "sparsebit/core/fused_adam.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
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

at::Tensor FusedAdam::step(LossClosure closure) {
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

}  // namespace sparsebit
