#include "ltrain/amp/low_precision_weights.h"

#include "ltrain/core/torch_compat.h"

namespace ltrain::amp {

LowPrecisionWeights::LowPrecisionWeights(torch::nn::Module& model, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  auto mirror = [&](torch::Tensor* member) {
    if (!member->defined()) return;
    const torch::Tensor& master = *member;
    // empty_like keeps sizes and strides: the multi-tensor copies need them equal pairwise.
    slots_.push_back({member, master, torch::empty_like(master, master.options().dtype(dtype)).requires_grad_(true),
                      torch::Tensor()});
  };
  for (const auto& module : model.modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      mirror(&conv->weight);
    } else if (auto* linear = module->as<torch::nn::Linear>()) {
      mirror(&linear->weight);
      mirror(&linear->bias);
    }
  }
}

std::vector<LowPrecisionWeights::MasterState> LowPrecisionWeights::masters_now() const {
  std::vector<MasterState> states;
  states.reserve(slots_.size());
  for (const Slot& slot : slots_) states.push_back({slot.master._version(), slot.master.data_ptr()});
  return states;
}

void LowPrecisionWeights::refresh() {
  std::vector<MasterState> now;
  if (mirrors_written_by_optimizer_) {
    now = masters_now();
    if (now == mirrored_masters_) return;
  }
  std::vector<torch::Tensor> mirrors, masters;
  for (auto& slot : slots_) {
    mirrors.push_back(slot.mirror);
    masters.push_back(slot.master);
  }
  torch::NoGradGuard no_grad;
  compat::foreach_copy(mirrors, masters);  // one cast for the whole model
  if (mirrors_written_by_optimizer_) mirrored_masters_ = std::move(now);  // the copy changed no master
}

void LowPrecisionWeights::note_mirrors_written() {
  if (mirrors_written_by_optimizer_) mirrored_masters_ = masters_now();
}

LowPrecisionWeights::InUse::InUse(LowPrecisionWeights& weights) : weights_(weights) {
  weights_.refresh();
  for (auto& slot : weights_.slots_) *slot.layer_member = slot.mirror;
}

LowPrecisionWeights::InUse::~InUse() {
  for (auto& slot : weights_.slots_) *slot.layer_member = slot.master;
}

void LowPrecisionWeights::collect_gradients(bool first_micro_batch) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> targets, gradients;
  for (auto& slot : slots_) {
    // Made on first use: a step that hands the optimizer the mirrors' own gradients never calls
    // this, and would otherwise hold 4 bytes a weight for nothing (100 MB for ResNet-50).
    if (!slot.master_grad.defined()) slot.master_grad = torch::zeros_like(slot.master);
    slot.master.mutable_grad() = slot.master_grad;  // the optimizer may have dropped it (set_to_none)
    torch::Tensor gradient = slot.mirror.grad();
    if (!gradient.defined()) {
      // A layer the forward pass did not use (never so in a ResNet's step) gets a zero gradient.
      if (first_micro_batch) slot.master_grad.zero_();
      continue;
    }
    slot.mirror.mutable_grad() = torch::Tensor();
    targets.push_back(slot.master_grad);
    gradients.push_back(std::move(gradient));
  }
  if (first_micro_batch) {
    compat::foreach_copy(targets, gradients);
  } else {
    for (size_t i = 0; i < targets.size(); ++i) targets[i].add_(gradients[i]);  // float32 += low precision
  }
}

torch::Tensor LowPrecisionWeights::mirror_of(const torch::Tensor& master) const {
  for (const Slot& slot : slots_)
    if (slot.master.is_same(master)) return slot.mirror;
  return {};
}

}  // namespace ltrain::amp
