#include "ltrain/optim/optimizer.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/ops/adamw.h"
#include "ltrain/ops/gradient_kernels.h"

namespace ltrain::optim {
namespace {

using ops::AdamwBackend;
using ops::SgdBackend;

/// torch.optim.SGD (dampening 0, not maximizing), stepped by ops::sgd_step on the backend
/// ops::sgd_backend chose.
class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, const OptimizerOptions& options, const torch::Device& device,
      SgdBackend backend)
      : Optimizer(std::move(groups), device, backend != SgdBackend::portable),
        momentum_(options.momentum),
        nesterov_(options.nesterov),
        backend_(backend) {
    for (const auto& group : groups_) {
      for (size_t i = 0; i < group.params.size(); ++i) {
        params_.push_back(group.params[i]);
        weight_decays_.push_back(group.weight_decay);
        if (momentum_ == 0.0) continue;
        momentum_buffers_.emplace_back("momentum_buffer/" + group.names[i], torch::zeros_like(group.params[i]));
        buffers_.push_back(momentum_buffers_.back().second);
      }
    }
    ahead_.resize(params_.size());
  }

  void step(const amp::ScalerState& scaler, const std::vector<torch::Tensor>& given) override {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor> all_gradients = given.empty() ? gradients() : given;
    const std::vector<size_t> rest = not_stepped_ahead(all_gradients);
    if (rest.empty()) return;
    const auto pick = [&rest](const auto& all) { return picked(all, rest); };
    ops::sgd_step(backend_, pick(params_), pick(all_gradients), pick(buffers_), pick(weight_decays_), momentum_,
                  nesterov_, lr_, scaler.grad_scale, scaler.found_inf, pick(low_precision_copies_));
  }

  bool step_parameter(const torch::Tensor& param, const torch::Tensor& gradient,
                      const amp::ScalerState& scaler) override {
    if (backend_ != SgdBackend::ltrain) return false;
    const std::optional<size_t> found = index_of(param);
    if (!found) return false;
    // A mark left set is a step that ended before its step() (an exception in its backward pass),
    // or a weight the pass uses twice, whose summed gradient step() then refuses: written anew.
    const size_t i = *found;
    const auto own = [i](const std::vector<torch::Tensor>& all) {
      return all.empty() ? all : std::vector<torch::Tensor>{all[i]};
    };
    torch::NoGradGuard no_grad;
    ops::sgd_step(backend_, {params_[i]}, {gradient}, own(buffers_), {weight_decays_[i]}, momentum_, nesterov_, lr_,
                  scaler.grad_scale, scaler.found_inf, own(low_precision_copies_));
    ahead_[i] = {gradient.data_ptr(), gradient._version()};
    return true;
  }

  const char* step_kernel() const override {
    switch (backend_) {
      case SgdBackend::ltrain: return "fused (ltrain's SGD kernel)";
      case SgdBackend::libtorch: return "fused (LibTorch's SGD kernel)";
      case SgdBackend::portable: break;
    }
    return "portable";
  }
  bool takes_low_precision_gradients() const override { return backend_ == SgdBackend::ltrain; }
  bool write_low_precision_copies(std::vector<torch::Tensor> copies) override {
    if (backend_ != SgdBackend::ltrain) return false;
    if (copies.size() != params_.size())
      throw std::logic_error("write_low_precision_copies: needs one entry per parameter");
    low_precision_copies_ = std::move(copies);
    return true;
  }

  NamedTensors state() const override { return momentum_buffers_; }

 private:
  /// A parameter's update ahead of the step (step_parameter): where the gradient it read lies,
  /// and that gradient's version then (which autograd's .grad, a detached alias, shares); null
  /// where the step updates the parameter. Not a reference to the tensor: autograd takes a
  /// gradient as the .grad only where nothing else holds it, and copies it otherwise.
  struct SteppedAhead {
    const void* gradient_data = nullptr;
    int64_t version = 0;
  };

  /// The index in params_ of `param`, or of the parameter whose low-precision copy it is (by
  /// where it lies: autograd may hand back a saved tensor as another handle to the same data).
  std::optional<size_t> index_of(const torch::Tensor& param) const {
    const void* data = param.data_ptr();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i].data_ptr() == data) return i;
      if (!low_precision_copies_.empty() && low_precision_copies_[i].defined() &&
          low_precision_copies_[i].data_ptr() == data)
        return i;
    }
    return std::nullopt;
  }

  /// The indices of the parameters that step_parameter left to this step, in order; forgets the
  /// others. A parameter updated ahead must have had its whole gradient then: `gradients` (the
  /// step's) holds that very tensor, unchanged since (autograd adds a second use's gradient to it
  /// in place, which moves its version). std::logic_error otherwise: the update read too little.
  std::vector<size_t> not_stepped_ahead(const std::vector<torch::Tensor>& gradients) {
    std::vector<size_t> rest;
    for (size_t i = 0; i < params_.size(); ++i) {
      SteppedAhead ahead = std::exchange(ahead_[i], SteppedAhead{});
      if (ahead.gradient_data == nullptr) {
        rest.push_back(i);
        continue;
      }
      const bool same = gradients[i].defined() && gradients[i].data_ptr() == ahead.gradient_data &&
                        gradients[i]._version() == ahead.version;
      if (!same)
        throw std::logic_error("SGD: a parameter updated ahead of the step got more gradient after its update");
    }
    return rest;
  }

  /// all[i] for each i of `indices` (all itself when it is empty: no momentum, no copies).
  template <typename T>
  static std::vector<T> picked(const std::vector<T>& all, const std::vector<size_t>& indices) {
    if (all.empty() || indices.size() == all.size()) return all;
    std::vector<T> some(indices.size());
    for (size_t k = 0; k < indices.size(); ++k) some[k] = all[indices[k]];
    return some;
  }

  double momentum_;
  bool nesterov_;
  std::vector<torch::Tensor> params_;   // every group's, in group order
  std::vector<double> weight_decays_;   // each parameter's group's
  NamedTensors momentum_buffers_;       // one per parameter, in group order (none without momentum)
  std::vector<torch::Tensor> buffers_;  // the same tensors, as the kernel takes them
  std::vector<torch::Tensor> low_precision_copies_;  // empty, or one per parameter (write_low_precision_copies)
  std::vector<SteppedAhead> ahead_;                  // one per parameter
  SgdBackend backend_;
};

/// torch.optim.AdamW (amsgrad off), stepped by ops::adamw_step on the backend ops::adamw_backend
/// chose. The step count lives on the device so that bias corrections need no host value; a
/// skipped step does not count.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const OptimizerOptions& options, const torch::Device& device,
        AdamwBackend backend)
      : Optimizer(std::move(groups), device, backend != AdamwBackend::portable),
        beta1_(options.betas[0]),
        beta2_(options.betas[1]),
        eps_(options.eps),
        step_count_(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device))),
        backend_(backend) {
    for (const auto& group : groups_) {
      GroupMoments& moments = moments_.emplace_back();
      for (size_t i = 0; i < group.params.size(); ++i) {
        exp_avg_.emplace_back("exp_avg/" + group.names[i], torch::zeros_like(group.params[i]));
        exp_avg_sq_.emplace_back("exp_avg_sq/" + group.names[i], torch::zeros_like(group.params[i]));
        moments.exp_avg.push_back(exp_avg_.back().second);
        moments.exp_avg_sq.push_back(exp_avg_sq_.back().second);
      }
    }
  }

  void step(const amp::ScalerState& scaler, const std::vector<torch::Tensor>& given) override {
    torch::NoGradGuard no_grad;
    const std::vector<torch::Tensor> grads = given.empty() ? gradients() : given;
    step_count_.add_(1.0);
    auto first = grads.begin();  // the group's first parameter's gradient
    for (size_t g = 0; g < groups_.size(); ++g) {
      const ParamGroup& group = groups_[g];
      const auto end = first + static_cast<std::ptrdiff_t>(group.params.size());
      ops::adamw_step(backend_, group.params, std::vector<torch::Tensor>(first, end), moments_[g].exp_avg,
                      moments_[g].exp_avg_sq, step_count_, lr_, {beta1_, beta2_, eps_, group.weight_decay},
                      scaler.grad_scale, scaler.found_inf);
      first = end;
    }
    if (scaler.found_inf.defined()) step_count_.sub_(scaler.found_inf.reshape({}));
  }

  const char* step_kernel() const override {
    return backend_ == AdamwBackend::libtorch ? "fused (LibTorch's AdamW kernel)" : "portable";
  }

  NamedTensors state() const override {
    NamedTensors out{{"step", step_count_}};
    out.insert(out.end(), exp_avg_.begin(), exp_avg_.end());
    out.insert(out.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
    return out;
  }

 private:
  struct GroupMoments {  // a group's moments, the tensors of exp_avg_ and exp_avg_sq_, as the step takes them
    std::vector<torch::Tensor> exp_avg;
    std::vector<torch::Tensor> exp_avg_sq;
  };

  double beta1_;
  double beta2_;
  double eps_;
  torch::Tensor step_count_;  // 0-dim float32 on the device
  NamedTensors exp_avg_;      // one per parameter, in group order
  NamedTensors exp_avg_sq_;
  std::vector<GroupMoments> moments_;  // one per group
  AdamwBackend backend_;
};

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, const torch::Device& device, bool fused)
    : groups_(std::move(groups)),
      lr_(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device))),
      fused_(fused) {}

void Optimizer::zero_grad(bool set_to_none) {
  torch::NoGradGuard no_grad;
  for (const auto& group : groups_) {
    for (const auto& param : group.params) {
      if (!param.grad().defined()) continue;
      if (set_to_none) param.mutable_grad().reset();
      else param.mutable_grad().zero_();
    }
  }
}

std::vector<torch::Tensor> Optimizer::gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& group : groups_)
    for (const auto& param : group.params) grads.push_back(param.grad());
  return grads;
}

void Optimizer::load_state(const NamedTensors& saved) {
  NamedTensors current = state();
  if (saved.size() != current.size())
    throw DataError(fmt::format("checkpoint optimizer state has {} tensors, this optimizer {}: was it saved with another "
                                "optim.name or model?",
                                saved.size(), current.size()));
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : current) {
    const torch::Tensor* stored = find_tensor(saved, name);
    if (!stored) throw DataError(fmt::format("checkpoint optimizer state lacks \"{}\"", name));
    if (stored->sizes() != tensor.sizes())
      throw DataError(fmt::format("checkpoint optimizer state \"{}\" has shape {}, expected {}", name,
                                  fmt::join(stored->sizes(), "x"), fmt::join(tensor.sizes(), "x")));
    tensor.copy_(*stored);
  }
}

std::vector<ParamGroup> make_param_groups(const NamedTensors& named_parameters, double weight_decay,
                                          bool no_decay_norm_and_bias) {
  ParamGroup decay{{}, {}, weight_decay};
  ParamGroup no_decay{{}, {}, 0.0};
  for (const auto& [name, param] : named_parameters) {
    if (!param.requires_grad()) continue;
    ParamGroup& group = no_decay_norm_and_bias && param.dim() <= 1 ? no_decay : decay;
    group.names.push_back(name);
    group.params.push_back(param);
  }
  std::vector<ParamGroup> groups;
  for (auto* group : {&decay, &no_decay})
    if (!group->params.empty()) groups.push_back(std::move(*group));
  return groups;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const NamedTensors& named_parameters) {
  if (named_parameters.empty()) throw std::invalid_argument("make_optimizer: no parameters");
  const torch::Device device = named_parameters.front().second.device();
  auto groups = make_param_groups(named_parameters, options.weight_decay, options.no_decay_norm_and_bias);
  switch (options.name) {
    case config::OptimizerKind::sgd:
      return std::make_unique<Sgd>(std::move(groups), options, device, ops::sgd_backend(device, options.fused));
    case config::OptimizerKind::adamw:
      return std::make_unique<AdamW>(std::move(groups), options, device, ops::adamw_backend(device, options.fused));
  }
  throw std::invalid_argument("make_optimizer: unknown optimizer");
}

}  // namespace ltrain::optim
