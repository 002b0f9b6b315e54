#include "ltrain/models/activation_checkpoint.h"

#include <utility>

#include "ltrain/amp/autocast.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/models/resnet.h"

namespace ltrain::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// Copies of a segment's buffers (BatchNorm running mean/var and counters), written back on exit.
class BufferSnapshot {
 public:
  explicit BufferSnapshot(const BlockSegment& segment) {
    for (const auto& block : segment)
      for (const auto& buffer : block->buffers()) saved_.emplace_back(buffer, buffer.clone());
  }
  ~BufferSnapshot() {
    torch::NoGradGuard no_grad;
    for (auto& [live, copy] : saved_) live.copy_(copy);
  }
  BufferSnapshot(const BufferSnapshot&) = delete;
  BufferSnapshot& operator=(const BufferSnapshot&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> saved_;
};

/// Turns autocast's cast cache off for its lifetime.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : was_enabled_(compat::autocast_cache_enabled()) { compat::set_autocast_cache_enabled(false); }
  ~AutocastCacheOff() { compat::set_autocast_cache_enabled(was_enabled_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool was_enabled_;
};

class CheckpointedSegment : public torch::autograd::Function<CheckpointedSegment> {
 public:
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& x, const BlockSegment* segment) {
    const auto device_type = x.device().type();
    // The segment is owned by the model; the context keeps its address for the backward pass.
    context->saved_data["segment"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(segment));
    context->saved_data["autocast"] = compat::autocast_enabled(device_type);
    context->saved_data["autocast_dtype"] = static_cast<int64_t>(compat::autocast_dtype(device_type));
    context->save_for_backward({x});
    // Autograd is off inside Function::forward: the segment's activations are freed as it runs.
    // Autocast must not cache the weight casts made here: they carry no autograd history, and a
    // recomputation inside the same autocast region would reuse them and lose the weight gradients.
    const AutocastCacheOff no_cache;
    return run_segment(*segment, x);
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    const auto* segment = reinterpret_cast<const BlockSegment*>(static_cast<intptr_t>(context->saved_data["segment"].toInt()));
    const torch::Tensor x = context->get_saved_variables()[0].detach().requires_grad_(true);
    // The forward pass already updated the running statistics; the recomputation's update is
    // undone on leaving this function, after the backward below (which reads them).
    const BufferSnapshot running_statistics(*segment);
    torch::Tensor y;
    {
      const amp::AutocastGuard autocast(x.device().type(),
                                        static_cast<torch::ScalarType>(context->saved_data["autocast_dtype"].toInt()),
                                        context->saved_data["autocast"].toBool());
      const torch::AutoGradMode grad_mode(true);
      y = run_segment(*segment, x);
    }
    torch::autograd::backward({y}, {grad_outputs[0]});
    return {x.grad(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor run_segment(const BlockSegment& segment, torch::Tensor x) {
  BlockOutput output{std::move(x), {}};
  for (const auto& block : segment) output = block->forward_block(output);
  return std::move(output.y);
}

torch::Tensor checkpointed_segment(const BlockSegment& segment, const torch::Tensor& x) {
  return CheckpointedSegment::apply(x, &segment);
}

std::vector<BlockSegment> split_into_segments(const BlockSegment& blocks, int64_t segments) {
  std::vector<BlockSegment> out;
  if (segments <= 0 || blocks.empty()) return out;
  const size_t size = blocks.size() / static_cast<size_t>(segments);
  size_t start = 0;
  for (int64_t s = 0; s + 1 < segments && size > 0; ++s, start += size)
    out.emplace_back(blocks.begin() + static_cast<std::ptrdiff_t>(start),
                     blocks.begin() + static_cast<std::ptrdiff_t>(start + size));
  out.emplace_back(blocks.begin() + static_cast<std::ptrdiff_t>(start), blocks.end());
  return out;
}

}  // namespace ltrain::models
