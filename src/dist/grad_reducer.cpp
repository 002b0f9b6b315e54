#include "ltrain/dist/grad_reducer.h"

#include <utility>

namespace ltrain::dist {

GradientReducer::GradientReducer(Group& group, std::vector<GradientSource> sources, double bucket_mb,
                                 torch::ScalarType wire_dtype)
    : group_(group), sources_(std::move(sources)) {
  const auto bucket_bytes = static_cast<int64_t>(bucket_mb * 1024.0 * 1024.0);
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = bucket_bytes;  // start a new bucket with the first parameter
  for (size_t i = sources_.size(); i-- > 0;) {
    if (bytes >= bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += sources_[i].param.numel() * static_cast<int64_t>(c10::elementSize(wire_dtype));
  }
  for (const auto& members : groups) {
    Bucket bucket;
    int64_t offset = 0;
    for (size_t source : members) {
      bucket.slots.push_back(Slot{source, offset, false});
      offset += sources_[source].param.numel();
    }
    const auto options = sources_[members.front()].param.options();
    bucket.flat = torch::zeros({offset}, options.dtype(wire_dtype));
    bucket.grads = wire_dtype == torch::kFloat32 ? bucket.flat : torch::zeros({offset}, options.dtype(torch::kFloat32));
    buckets_.push_back(std::move(bucket));
  }
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t s = 0; s < buckets_[b].slots.size(); ++s) {
      torch::Tensor leaf = sources_[buckets_[b].slots[s].source].leaf;
      const unsigned handle =
          leaf.register_hook([this, b, s](const torch::Tensor& gradient) { on_gradient(b, s, gradient); });
      hooks_.emplace_back(leaf, handle);
    }
}

GradientReducer::~GradientReducer() {
  for (auto& [leaf, handle] : hooks_) leaf.remove_hook(handle);
}

torch::Tensor GradientReducer::slot_view(const torch::Tensor& flat, const Slot& slot) const {
  // With the parameter's own strides (channels_last weights stay so), so that the view can be
  // its .grad as it is: the optimizer's multi-tensor kernels want matching layouts.
  const torch::Tensor& param = sources_[slot.source].param;
  if (param.is_non_overlapping_and_dense())
    return flat.as_strided(param.sizes(), param.strides(), flat.storage_offset() + slot.offset);
  return flat.narrow(0, slot.offset, param.numel()).view(param.sizes());
}

void GradientReducer::arm(bool accumulated) {
  armed_ = true;
  accumulated_ = accumulated;
}

void GradientReducer::on_gradient(size_t bucket_index, size_t slot_index, const torch::Tensor& gradient) {
  if (!armed_) return;
  Bucket& bucket = buckets_[bucket_index];
  Slot& slot = bucket.slots[slot_index];
  if (slot.filled) return;
  torch::NoGradGuard no_grad;
  torch::Tensor view = slot_view(bucket.flat, slot);
  view.copy_(gradient);
  // Hooks run before the gradient is accumulated: .grad still holds the earlier micro-batches' sum.
  const torch::Tensor& earlier = sources_[slot.source].param.grad();
  if (accumulated_ && earlier.defined()) view.add_(earlier);
  slot.filled = true;
  if (++bucket.filled == bucket.slots.size()) send_ready();
}

void GradientReducer::send_ready() {
  while (next_to_send_ < buckets_.size() && buckets_[next_to_send_].filled == buckets_[next_to_send_].slots.size()) {
    Bucket& bucket = buckets_[next_to_send_++];
    bucket.pending = group_.all_reduce_sum({bucket.flat});
  }
}

void GradientReducer::finish() {
  if (!armed_) return;
  torch::NoGradGuard no_grad;
  // A parameter the backward pass did not reach sends what its .grad holds (or zeros), so that
  // every rank still sends every bucket.
  for (Bucket& bucket : buckets_)
    for (Slot& slot : bucket.slots) {
      if (slot.filled) continue;
      const torch::Tensor& grad = sources_[slot.source].param.grad();
      if (grad.defined()) {
        slot_view(bucket.flat, slot).copy_(grad);
      } else {
        slot_view(bucket.flat, slot).zero_();
      }
      slot.filled = true;
      ++bucket.filled;
    }
  send_ready();
  const double inverse_ranks = 1.0 / static_cast<double>(group_.size());
  for (Bucket& bucket : buckets_) {
    bucket.pending.wait();
    if (!bucket.grads.is_same(bucket.flat)) bucket.grads.copy_(bucket.flat);  // back to float32
    bucket.grads.mul_(inverse_ranks);  // one kernel per bucket
    // Each .grad becomes its slot of the bucket: no copy. The next step's zero_grad drops it.
    for (Slot& slot : bucket.slots) {
      sources_[slot.source].param.mutable_grad() = slot_view(bucket.grads, slot);
      slot.filled = false;
    }
    bucket.filled = 0;
  }
  next_to_send_ = 0;
  armed_ = false;
}

}  // namespace ltrain::dist
