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
  std::vector<Slot> slots_;
};

}  // namespace ltrain::amp
