#pragma once
// SGD and AdamW with torch.optim's arithmetic, driven by device-resident state: the learning
// rate (and AdamW's step count) are 0-dim tensors on the parameters' device, so a step needs no
// host value and no host sync. The host writes the LR before each step with set_lr().
#include <array>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "ltrain/amp/scaler_state.h"
#include "ltrain/config/enums.h"
#include "ltrain/core/named_tensors.h"

namespace ltrain::optim {

/// What an optimizer reads: the optim section's keys of the same names. The learning rate is not
/// among them (the schedule writes it before each step, Optimizer::set_lr), nor are the engine's
/// accumulation_steps, clip_grad_norm and ema_decay. No defaults of its own:
/// engine::optimizer_options fills every field from config::OptimSection, the one place of the
/// defaults.
struct OptimizerOptions {
  config::OptimizerKind name;   ///< sgd (torch.optim.SGD) or adamw (torch.optim.AdamW)
  double momentum;              ///< SGD's momentum
  bool nesterov;                ///< SGD with Nesterov momentum
  double weight_decay;          ///< L2 penalty (SGD) or decoupled weight decay (AdamW)
  bool no_decay_norm_and_bias;  ///< no weight decay for parameters of at most one dimension
  std::array<double, 2> betas;  ///< AdamW's beta1 and beta2
  double eps;                   ///< AdamW's epsilon
  bool fused;                   ///< on CUDA, one fused kernel for the whole step where there is one
};

/// Parameters that share a weight decay.
struct ParamGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;
  double weight_decay = 0.0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  /// One update of every parameter, with the LR held in lr(). The gradients are the parameters'
  /// .grad(), or `gradients` when given: one per parameter in group order (as gradients() lists
  /// them), float32, or fp16/bf16 where takes_low_precision_gradients(). With a scaler state,
  /// the gradients are divided by grad_scale first and nothing changes when found_inf is 1.
  virtual void step(const amp::ScalerState& scaler = {}, const std::vector<torch::Tensor>& gradients = {}) = 0;

  /// True when the step runs a fused multi-tensor kernel (CUDA): step_kernel() says whose.
  bool fused() const { return fused_; }
  /// What runs the step, for the log: "portable", or the fused kernel's owner.
  virtual const char* step_kernel() const = 0;
  /// True when step() reads fp16/bf16 gradients of float32 parameters as they are, with no
  /// float32 copy (ltrain's fused SGD kernel).
  virtual bool takes_low_precision_gradients() const { return false; }
  /// Asks every later step to also write each updated parameter, rounded, into its fp16/bf16
  /// copy: `copies` holds one per parameter in group order, undefined where there is none.
  /// Returns true where the step does so (ltrain's fused SGD kernel); otherwise keeps nothing.
  virtual bool write_low_precision_copies(std::vector<torch::Tensor> copies) {
    (void)copies;
    return false;
  }

  /// Updates one parameter ahead of the step, now, on the current stream: `param` (or its fp16/bf16
  /// copy, write_low_precision_copies) from `gradient` as step() would, with the same arithmetic.
  /// The next step() leaves it out. False where this optimizer cannot (then step() updates it):
  /// the base class never can; ltrain's fused SGD kernel can.
  virtual bool step_parameter(const torch::Tensor& param, const torch::Tensor& gradient,
                              const amp::ScalerState& scaler) {
    (void)param, (void)gradient, (void)scaler;
    return false;
  }

  /// Optimizer state by name, e.g. "momentum_buffer/layer1.0.conv1.weight" (for checkpoints).
  virtual NamedTensors state() const = 0;
  /// Copies `state` (as returned by state()) into this optimizer; missing or misshapen entries
  /// are errors that name them.
  void load_state(const NamedTensors& state);

  /// Clears every gradient: `set_to_none` drops them (the next backward writes fresh ones, with
  /// no zeroing kernels: PyTorch's default); otherwise they are zeroed in place and keep their
  /// addresses (what a captured step needs).
  void zero_grad(bool set_to_none);
  /// Every parameter's gradient (undefined before the first backward), in group order.
  std::vector<torch::Tensor> gradients() const;
  /// Writes the learning rate for the next step (a device fill, no sync).
  void set_lr(double lr) { lr_.fill_(lr); }
  /// The learning rate: 0-dim float32 on the parameters' device.
  const torch::Tensor& lr() const { return lr_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

 protected:
  Optimizer(std::vector<ParamGroup> groups, const torch::Device& device, bool fused);
  std::vector<ParamGroup> groups_;
  torch::Tensor lr_;
  bool fused_;
};

/// Splits named parameters into decay / no-decay groups: with `no_decay_norm_and_bias`, every
/// parameter with at most one dimension (BatchNorm weights and biases, all biases) gets no decay.
std::vector<ParamGroup> make_param_groups(const NamedTensors& named_parameters, double weight_decay,
                                          bool no_decay_norm_and_bias);

/// The optimizer `options.name` names, over `named_parameters` (all on one device). With
/// `options.fused` and CUDA parameters, the step is one fused kernel: for SGD the first backend
/// ops::sgd_backend finds (ltrain's kernel, else LibTorch's), LibTorch's for AdamW, where this
/// LibTorch has them.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const NamedTensors& named_parameters);

}  // namespace ltrain::optim
