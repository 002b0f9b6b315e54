#include "ltrain/amp/low_precision_weights.h"

#include <utility>

#include "ltrain/core/torch_compat.h"

namespace ltrain::amp {

LowPrecisionWeights::LowPrecisionWeights(torch::nn::Module& model, torch::ScalarType dtype,
                                         std::vector<torch::Tensor> parameter_order)
    : ordered_parameters_(parameter_order.empty() ? model.parameters() : std::move(parameter_order)) {
  torch::NoGradGuard no_grad;
  auto add_copy = [&](torch::Tensor* member) {
    if (!member->defined()) return;
    const torch::Tensor& master = *member;
    // empty_like keeps sizes and strides: the multi-tensor copies need them equal pairwise.
    slots_.push_back({member, master, torch::empty_like(master, master.options().dtype(dtype)).requires_grad_(true),
                      torch::Tensor()});
  };
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      add_copy(&conv->weight);
    } else if (auto* linear = module->as<torch::nn::Linear>()) {
      add_copy(&linear->weight);
      add_copy(&linear->bias);
    }
  }
  ordered_copies_.reserve(ordered_parameters_.size());
  for (const torch::Tensor& parameter : ordered_parameters_) ordered_copies_.push_back(copy_of(parameter));
}

std::vector<LowPrecisionWeights::MasterState> LowPrecisionWeights::masters_now() const {
  std::vector<MasterState> states;
  states.reserve(slots_.size());
  for (const Slot& slot : slots_) states.push_back({slot.master._version(), slot.master.data_ptr()});
  return states;
}

void LowPrecisionWeights::refresh() {
  std::vector<MasterState> now;
  if (copies_written_by_optimizer_) {
    now = masters_now();
    if (now == matched_masters_) return;
  }
  std::vector<torch::Tensor> copies, masters;
  for (auto& slot : slots_) {
    copies.push_back(slot.copy);
    masters.push_back(slot.master);
  }
  torch::NoGradGuard no_grad;
  compat::foreach_copy(copies, masters);  // one cast for the whole model
  if (copies_written_by_optimizer_) matched_masters_ = std::move(now);  // the cast changed no master
}

void LowPrecisionWeights::note_copies_written() {
  if (copies_written_by_optimizer_) matched_masters_ = masters_now();
}

LowPrecisionWeights::InUse::InUse(LowPrecisionWeights& weights) : weights_(weights) {
  weights_.refresh();
  for (auto& slot : weights_.slots_) *slot.layer_member = slot.copy;
}

LowPrecisionWeights::InUse::~InUse() {
  for (auto& slot : weights_.slots_) *slot.layer_member = slot.master;
}

void LowPrecisionWeights::collect_gradients(bool first_micro_batch) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> targets, gradients;
  for (auto& slot : slots_) {
    // Made on first use: a step that hands the optimizer the copies' own gradients never calls
    // this, and would otherwise hold 4 bytes a weight for nothing (100 MB for ResNet-50).
    if (!slot.master_grad.defined()) slot.master_grad = torch::zeros_like(slot.master);
    slot.master.mutable_grad() = slot.master_grad;  // the optimizer may have dropped it (set_to_none)
    torch::Tensor gradient = slot.copy.grad();
    if (!gradient.defined()) {
      // A layer the forward pass did not use (never so in a ResNet's step) gets a zero gradient.
      if (first_micro_batch) slot.master_grad.zero_();
      continue;
    }
    slot.copy.mutable_grad() = torch::Tensor();
    targets.push_back(slot.master_grad);
    gradients.push_back(std::move(gradient));
  }
  if (first_micro_batch) {
    compat::foreach_copy(targets, gradients);
  } else {
    for (size_t i = 0; i < targets.size(); ++i) targets[i].add_(gradients[i]);  // float32 += low precision
  }
}

std::vector<torch::Tensor> LowPrecisionWeights::take_copy_gradients() {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> gradients;
  gradients.reserve(ordered_parameters_.size());
  for (size_t i = 0; i < ordered_parameters_.size(); ++i) {
    torch::Tensor& leaf = ordered_copies_[i].defined() ? ordered_copies_[i] : ordered_parameters_[i];
    torch::Tensor gradient = std::exchange(leaf.mutable_grad(), torch::Tensor());
    gradients.push_back(gradient.defined() ? gradient : torch::zeros_like(leaf));
  }
  return gradients;
}

torch::Tensor LowPrecisionWeights::copy_of(const torch::Tensor& master) const {
  for (const Slot& slot : slots_)
    if (slot.master.is_same(master)) return slot.copy;
  return {};
}

}  // namespace ltrain::amp
