#pragma once
// Gradient averaging over data-parallel ranks, overlapped with the backward pass, as
// torch.nn.parallel.DistributedDataParallel does: parameters are grouped into buckets of about
// distributed.bucket_mb in reverse order (the backward pass produces the last layers' gradients
// first); a hook on each gradient copies it into its bucket, and a full bucket is summed over
// ranks at once while the backward pass goes on. Buckets are sent in a fixed order, so every rank
// issues the same collectives in the same sequence. With accumulation only the step's last
// micro-batch sends: its hook adds the float32 gradient summed over the earlier ones.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "ltrain/dist/group.h"

namespace ltrain::dist {

/// One parameter as the backward pass sees it: `param` holds the float32 gradient the optimizer
/// reads (.grad); `leaf` is the tensor autograd computes the gradient of: the parameter itself,
/// or under autocast its low-precision copy (amp::LowPrecisionWeights).
struct GradientSource {
  torch::Tensor param;
  torch::Tensor leaf;
};

class GradientReducer {
 public:
  /// Gradients travel in `wire_dtype` (float32, or bfloat16/half to halve the bytes).
  GradientReducer(Group& group, std::vector<GradientSource> sources, double bucket_mb,
                  torch::ScalarType wire_dtype = torch::kFloat32);
  /// Removes the hooks: the model may outlive the reducer.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Call before the backward pass of the step's last micro-batch. `accumulated`: earlier
  /// micro-batches' gradients are in the parameters' .grad and count too.
  void arm(bool accumulated);
  /// Call after that backward pass (and after the copies' gradients are collected into the
  /// float32 ones): waits for every bucket and makes each .grad the mean over ranks, a view of
  /// its bucket (so the next step's accumulation must start from zero_grad).
  void finish();

  size_t bucket_count() const { return buckets_.size(); }

 private:
  struct Slot {
    size_t source;       // index into sources_
    int64_t offset = 0;  // in the bucket, in elements
    bool filled = false;
  };
  struct Bucket {
    torch::Tensor flat;   // [sum of numels] in the wire type, on the parameters' device: what is all-reduced
    torch::Tensor grads;  // [sum of numels] float32: the mean, viewed by each .grad (flat itself for float32)
    std::vector<Slot> slots;
    size_t filled = 0;
    Pending pending;
  };

  void on_gradient(size_t bucket, size_t slot, const torch::Tensor& gradient);
  /// `slot`'s part of `flat` (a bucket's flat or grads) with its parameter's sizes and strides.
  torch::Tensor slot_view(const torch::Tensor& flat, const Slot& slot) const;
  /// Sends every full bucket from the next unsent one on, in order.
  void send_ready();

  Group& group_;
  std::vector<GradientSource> sources_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;  // leaf, hook handle
  size_t next_to_send_ = 0;
  bool armed_ = false;
  bool accumulated_ = false;
};

}  // namespace ltrain::dist
