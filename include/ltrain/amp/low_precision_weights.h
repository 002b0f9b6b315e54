#pragma once
// Autocast's weight casts, done once per step for the whole model.
//
// Under autocast every convolution and linear layer casts its float32 weight (and the linear's
// bias) to fp16/bf16 in the forward pass, an operator and an autograd node per weight, and the
// backward pass casts each weight's fp16/bf16 gradient back to float32, another node per weight:
// for ResNet-50, 113 host-side operators and as many small kernels per step. Here the same values
// come from one multi-tensor cast into persistent low-precision copies of the weights that the
// layers use for the step, and one multi-tensor copy of the copies' gradients into the float32
// gradients after each backward pass (or, where the optimizer reads fp16/bf16 gradients as they
// are, the copies' gradients handed to it directly: take_copy_gradients). The arithmetic is
// autocast's: the layers see the same rounded weights, and the float32 gradients hold the same
// rounded-up low-precision gradients (summed in float32 over accumulated micro-batches, as
// autograd sums them).
//
// Where the optimizer writes the copies itself as it updates the weights (ltrain's fused SGD
// kernel: optim::Optimizer::write_low_precision_copies), the cast at the start of the next step is
// skipped. The copies are then trusted only while no weight has changed since they last matched
// (version counters and addresses are compared), so a checkpoint load, a weight average swapped in
// or any other in-place change brings the cast back. Where the optimizer does not write them,
// every step casts: inside a replayed CUDA graph the weights change with no version counter moving.
//
// This class owns the protocol: which parameters have copies, when the copies are fresh, and where
// each parameter's gradient is. engine::TrainStep drives it once per step.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace ltrain::amp {

class LowPrecisionWeights {
 public:
  /// Copies in `dtype` of every Conv2d weight and every Linear weight and bias in `model` (the
  /// parameters autocast casts), with the same sizes and strides (channels_last stays so).
  /// `parameter_order` is the order copies() and take_copy_gradients() list the parameters in (the
  /// optimizer's); empty: model.parameters().
  LowPrecisionWeights(torch::nn::Module& model, torch::ScalarType dtype,
                      std::vector<torch::Tensor> parameter_order = {});
  LowPrecisionWeights(const LowPrecisionWeights&) = delete;
  LowPrecisionWeights& operator=(const LowPrecisionWeights&) = delete;

  /// While alive, the layers compute with the copies, freshly cast from the float32 weights.
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

  /// One per parameter in parameter order: its low-precision copy, or undefined where it has none.
  /// What the optimizer is offered to write with each update (write_low_precision_copies).
  const std::vector<torch::Tensor>& copies() const { return ordered_copies_; }

  /// Says that the optimizer writes every copy with its weight (or no longer does). Off at first.
  void set_copies_written_by_optimizer(bool written) {
    copies_written_by_optimizer_ = written;
    matched_masters_.clear();
  }
  bool copies_written_by_optimizer() const { return copies_written_by_optimizer_; }

  /// Casts the float32 weights into the copies, unless the optimizer writes the copies and no
  /// weight changed since they last matched. InUse calls it; with the optimizer writing the
  /// copies, so must the caller before each replay of a captured step (whose capture found the
  /// copies matching and left the cast out).
  void refresh();

  /// The optimizer has just written every weight and, rounded, its copy: they match until a
  /// weight changes again. Nothing, unless the optimizer is said to write the copies.
  void note_copies_written();

  /// After a micro-batch's backward pass: the float32 gradients become the copies' gradients
  /// (`first_micro_batch`) or add them, and the copies' gradients are dropped.
  void collect_gradients(bool first_micro_batch);

  /// Instead of collect_gradients, for an optimizer that reads fp16/bf16 gradients as they are:
  /// one gradient per parameter in parameter order, its copy's (fp16/bf16) or, where it has no
  /// copy, its own (float32), moved out so that the next backward pass writes fresh ones; zeros for
  /// a parameter the forward pass did not use.
  std::vector<torch::Tensor> take_copy_gradients();

  /// The low-precision copy of float32 parameter `master`, or an undefined tensor when it has
  /// none: the tensor whose gradient the backward pass computes in its place.
  torch::Tensor copy_of(const torch::Tensor& master) const;

  /// Number of parameters with a copy.
  size_t size() const { return slots_.size(); }

 private:
  struct Slot {
    torch::Tensor* layer_member;  // the layer's `weight` or `bias` member that its forward reads
    torch::Tensor master;         // the float32 parameter (what the optimizer updates)
    torch::Tensor copy;           // its low-precision copy for the step; a leaf that takes gradients
    torch::Tensor master_grad;    // persistent float32 gradient buffer, set as master's .grad;
                                  // made by the first collect_gradients
  };
  /// What a master was when the copies last matched it.
  struct MasterState {
    int64_t version;
    const void* data;
    bool operator==(const MasterState& other) const { return version == other.version && data == other.data; }
  };
  std::vector<MasterState> masters_now() const;

  std::vector<Slot> slots_;
  std::vector<torch::Tensor> ordered_parameters_;  // every parameter, in parameter order
  std::vector<torch::Tensor> ordered_copies_;      // their copies, undefined where none
  bool copies_written_by_optimizer_ = false;
  std::vector<MasterState> matched_masters_;  // with copies_written_by_optimizer_: when they last matched
};

}  // namespace ltrain::amp
