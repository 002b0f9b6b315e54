#pragma once
// A GradScaler with PyTorch's semantics and all of its state on the device, so that a step
// never reads a value on the host (and can be captured in a CUDA graph):
//   loss is multiplied by `scale` before backward; gradients are unscaled (or only checked, for
//   fused optimizers that unscale themselves) and `found_inf` set when any is inf/NaN; the
//   optimizer skips the step on the device when found_inf is 1; update() then backs the scale
//   off (x backoff_factor) after a bad step, or grows it (x growth_factor) after growth_interval
//   clean steps in a row.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "ltrain/amp/scaler_state.h"
#include "ltrain/core/named_tensors.h"

namespace ltrain::amp {

/// The GradScaler's settings: precision.loss_scale_init, _growth_factor, _backoff_factor and
/// _growth_interval, on with precision.mode fp16. No defaults of its own: engine::grad_scaler_options
/// fills every field from config::PrecisionSection, the one place of the defaults.
struct GradScalerOptions {
  bool enabled;             ///< off: the loss unscaled, no check, no skipped step
  double init_scale;        ///< the first scale
  double growth_factor;     ///< the scale's factor after growth_interval clean steps in a row
  double backoff_factor;    ///< the scale's factor after a step with inf/NaN gradients
  int64_t growth_interval;  ///< clean steps in a row before the scale grows
};

class GradScaler {
 public:
  GradScaler(const GradScalerOptions& options, const torch::Device& device);

  bool enabled() const { return options_.enabled; }

  /// The backward pass of `loss` (one element) with every gradient scaled: the gradients of
  /// loss * scale, bit for bit, with the scale handed to the pass as the loss's own gradient (no
  /// multiplication, forward or backward); loss.backward() when disabled.
  void backward(const torch::Tensor& loss) const;

  /// Multiplies every gradient by 1/scale and sets found_inf if any value is inf or NaN.
  void unscale(const std::vector<torch::Tensor>& grads);

  /// Sets found_inf if any gradient value is inf or NaN, leaving the gradients scaled (for
  /// optimizers that take the scale and unscale inside their own kernel): ops::find_inf. On the GPU
  /// the gradients may mix float32, fp16 and bf16 (ltrain's inf/NaN check kernel, where it runs).
  void check(const std::vector<torch::Tensor>& grads);

  /// What the optimizer step needs: the scale when the gradients are still scaled, and found_inf.
  ScalerState step_state(bool gradients_unscaled) const;

  /// After the optimizer step: backs off or grows the scale, counts a skipped step.
  void update();

  const torch::Tensor& scale() const { return scale_; }                 ///< [1] float32
  const torch::Tensor& found_inf() const { return found_inf_; }         ///< [1] float32, this step
  const torch::Tensor& skipped_steps() const { return skipped_steps_; }  ///< [1] int64, since start
  const torch::Tensor& consecutive_skips() const { return consecutive_skips_; }  ///< [1] int64

  /// scale, growth_tracker, skipped_steps, consecutive_skips: for checkpoints.
  NamedTensors state() const;
  void load_state(const NamedTensors& state);

 private:
  GradScalerOptions options_;
  torch::Tensor scale_;              // [1] float32
  torch::Tensor growth_tracker_;     // [1] int32: clean steps since the last change
  torch::Tensor found_inf_;          // [1] float32: 1 if this step's gradients are not finite
  torch::Tensor skipped_steps_;      // [1] int64
  torch::Tensor consecutive_skips_;  // [1] int64
};

}  // namespace ltrain::amp
