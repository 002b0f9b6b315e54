#pragma once
// Autocast's weight casts, done once per step for the whole model.
//
// Under autocast every convolution and linear layer casts its float32 weight (and the linear's
// bias) to fp16/bf16 in the forward pass, an operator and an autograd node per weight, and the
// backward pass casts each weight's fp16/bf16 gradient back to float32, another node per weight:
// for ResNet-50, 113 host-side operators and as many small kernels per step. Here the same values
// come from one multi-tensor copy into persistent low-precision "mirrors" that the layers use for
// the step, and one multi-tensor copy of the mirrors' gradients into the float32 gradients after
// each backward pass. The arithmetic is autocast's: the layers see the same rounded weights, and
// the float32 gradients hold the same rounded-up low-precision gradients (summed in float32 over
// accumulated micro-batches, as autograd sums them).
//
// Where the optimizer writes the mirrors itself as it updates the weights (ltrain's fused SGD
// kernel: optim::Optimizer::write_low_precision_copies), the cast at the start of the next step is
// skipped: 3 kernels and 0.06 ms a ResNet-50 step on an H200. The mirrors are then trusted only
// while no weight has changed since (their version counters and addresses are compared), so a
// checkpoint load, a weight average swapped in or any other in-place change brings the cast back.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace ltrain::amp {

class LowPrecisionWeights {
 public:
  /// Mirrors in `dtype` for every Conv2d weight and every Linear weight and bias in `model`
  /// (the parameters autocast casts), with the same sizes and strides (channels_last stays so).
  LowPrecisionWeights(torch::nn::Module& model, torch::ScalarType dtype);
  LowPrecisionWeights(const LowPrecisionWeights&) = delete;
  LowPrecisionWeights& operator=(const LowPrecisionWeights&) = delete;

  /// While alive, the layers compute with the mirrors, freshly cast from the float32 weights.
  /// Keep it alive over the forward and backward passes of a step (checkpointed segments are
  /// recomputed in the backward pass); the layers get their float32 weights back on exit.
  class InUse {
   public:
    explicit InUse(LowPrecisionWeights& weights);
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    LowPrecisionWeights& weights_;
  };

  /// Casts the float32 weights into the mirrors unless they already hold them: InUse does, and so
  /// must the caller before replaying a captured step (which skips InUse's cast when the mirrors
  /// matched at capture).
  void refresh();

  /// The optimizer has just written every weight and, rounded, its mirror: they match until a
  /// weight changes again.
  void note_mirrors_written();

  /// After a micro-batch's backward pass: the float32 gradients become the mirrors' gradients
  /// (`first_micro_batch`) or add them, and the mirrors' gradients are dropped.
  void collect_gradients(bool first_micro_batch);

  /// The low-precision mirror of float32 parameter `master`, or an undefined tensor when it has
  /// none: the tensor whose gradient the backward pass computes in its place.
  torch::Tensor mirror_of(const torch::Tensor& master) const;

  /// Number of mirrored parameters.
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    torch::Tensor* layer_member;  // the layer's `weight` or `bias` member that its forward reads
    torch::Tensor master;         // the float32 parameter (what the optimizer updates)
    torch::Tensor mirror;         // its low-precision copy for the step; a leaf that takes gradients
    torch::Tensor master_grad;    // persistent float32 gradient buffer, set as master's .grad;
                                  // made by the first collect_gradients
  };
  /// What a master was when the mirrors last matched it.
  struct MasterState {
    int64_t version;
    const void* data;
    bool operator==(const MasterState& other) const { return version == other.version && data == other.data; }
  };
  std::vector<MasterState> masters_now() const;

  std::vector<Slot> slots_;
  std::vector<MasterState> mirrored_masters_;  // empty until the mirrors first match
};

}  // namespace ltrain::amp
