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
// while no weight has changed since they last matched (version counters and addresses are
// compared), so a checkpoint load, a weight average swapped in or any other in-place change brings
// the cast back. Where the optimizer does not write them, every step casts: inside a replayed CUDA
// graph the weights change with no version counter moving.
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

  /// Says that the optimizer writes every mirror with its weight (or no longer does). Off at first.
  void set_mirrors_written_by_optimizer(bool written) {
    mirrors_written_by_optimizer_ = written;
    mirrored_masters_.clear();
  }
  bool mirrors_written_by_optimizer() const { return mirrors_written_by_optimizer_; }

  /// Casts the float32 weights into the mirrors, unless the optimizer writes the mirrors and no
  /// weight changed since they last matched. InUse calls it; with the optimizer writing the
  /// mirrors, so must the caller before each replay of a captured step (whose capture found the
  /// mirrors matching and left the cast out).
  void refresh();

  /// The optimizer has just written every weight and, rounded, its mirror: they match until a
  /// weight changes again. Nothing, unless the optimizer is said to write the mirrors.
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
  bool mirrors_written_by_optimizer_ = false;
  std::vector<MasterState> mirrored_masters_;  // with mirrors_written_by_optimizer_: when they last matched
};

}  // namespace ltrain::amp
