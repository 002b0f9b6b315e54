#include "ltrain/ops/batch_norm.h"

#if LTRAIN_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <utility>

#include "ltrain/kernels/batch_norm.h"
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {

#if !LTRAIN_WITH_CUDA

device::KernelFit ltrain_batch_norm_fit(const torch::Device&) { return {false, "a CPU build has no CUDA kernels"}; }

device::KernelFit ltrain_batch_norm_cluster_fit(const torch::Device& device) { return ltrain_batch_norm_fit(device); }

torch::Tensor ltrain_batch_norm(const torch::Tensor&, const torch::Tensor&, bool, const BatchNormParameters&,
                                torch::Tensor*, const torch::Tensor&) {
  return {};
}

std::string ltrain_batch_norm_reduction(const torch::Tensor&, bool, bool) { return {}; }

void set_batch_norm_dependent_launch(BatchNormDependentLaunch) {}

#else

namespace {

using kernels::BatchNormActivation;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// x [B,C,H,W] channels_last as the kernels' [rows, channels] matrix.
kernels::BatchNormShape shape_of(const torch::Tensor& x) { return {x.numel() / x.size(1), x.size(1)}; }

kernels::ElementType element_type(const torch::Tensor& x) {
  kernels::ElementType type{};
  element_type_of(x.scalar_type(), type);
  return type;
}

BatchNormActivation activation_of(int64_t code) { return static_cast<BatchNormActivation>(code); }

BatchNormActivation activation_of(bool relu, bool residual) {
  return !relu ? BatchNormActivation::none : residual ? BatchNormActivation::add_relu : BatchNormActivation::relu;
}

/// A gradient as the kernels read it: x's dtype, channels_last, 16-byte aligned.
torch::Tensor kernel_gradient(const torch::Tensor& gradient, const torch::Tensor& x) {
  torch::Tensor out = gradient.to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
  return vector_aligned(out) ? out : out.clone(at::MemoryFormat::ChannelsLast);
}

class LtrainBatchNorm : public torch::autograd::Function<LtrainBatchNorm> {
 public:
  /// `residual_or_x`: the residual for add_relu, x again otherwise (a custom function takes no
  /// undefined tensors); `activation`: a BatchNormActivation; `statistics_or_x`: with
  /// `given_statistics`, x's per-channel sums and sums of squares ([2,C] float32, not
  /// differentiable), else x again. Returns {y}, or with `second_output` {y, y again}: two
  /// autograd outputs over one buffer.
  static variable_list forward(AutogradContext* context, const torch::Tensor& x, const torch::Tensor& residual_or_x,
                               int64_t activation, bool second_output, const torch::Tensor& statistics_or_x,
                               bool given_statistics, const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                               double eps) {
    const c10::cuda::CUDAGuard device_guard(x.device());
    const torch::Tensor y = torch::empty_like(x);                   // x's layout: channels_last
    const torch::Tensor saved_mean = torch::empty_like(weight);     // [C] float32
    const torch::Tensor saved_inv_std = torch::empty_like(weight);  // [C] float32, 1/sqrt(var + eps)
    kernels::BatchNormForward arguments;
    arguments.x = x.data_ptr();
    arguments.residual = residual_or_x.data_ptr();
    arguments.y = y.data_ptr();
    arguments.weight = weight.data_ptr<float>();
    arguments.bias = bias.data_ptr<float>();
    arguments.running_mean = running_mean.data_ptr<float>();
    arguments.running_var = running_var.data_ptr<float>();
    arguments.saved_mean = saved_mean.data_ptr<float>();
    arguments.saved_inv_std = saved_inv_std.data_ptr<float>();
    arguments.momentum = momentum;
    arguments.eps = eps;
    // [bytes] uint8: the ReLU's mask after a residual add, where the backward streams (1 bit an
    // element, read there instead of y).
    const int64_t mask_bytes =
        kernels::batch_norm_relu_mask_bytes(element_type(x), activation_of(activation), shape_of(x));
    const torch::Tensor relu_mask =
        mask_bytes > 0 ? torch::empty({mask_bytes}, x.options().dtype(torch::kUInt8)) : torch::Tensor();
    arguments.relu_mask = relu_mask.defined() ? relu_mask.data_ptr<uint8_t>() : nullptr;
    if (given_statistics) {
      arguments.sum = statistics_or_x.data_ptr<float>();
      arguments.square_sum = arguments.sum + x.size(1);
      throw_on_error(kernels::batch_norm_forward_given_statistics(element_type(x), activation_of(activation),
                                                                  shape_of(x), arguments, current_stream_of(x)),
                     "BatchNorm kernel with given statistics, forward");
    } else {
      throw_on_error(kernels::batch_norm_forward(element_type(x), activation_of(activation), shape_of(x), arguments,
                                                 current_stream_of(x)),
                     "BatchNorm kernel, forward");
    }
    // The ReLU's gradient needs the output's sign: from y, from its mask, or (streamed after a ReLU
    // alone) from x, the bias and the statistics again; without a ReLU nothing needs the output.
    const bool needs_y = activation_of(activation) != BatchNormActivation::none && !relu_mask.defined();
    context->save_for_backward(
        {x, needs_y ? y : torch::Tensor(), relu_mask, weight, bias, saved_mean, saved_inv_std});
    context->saved_data["activation"] = activation;
    // An output nobody used passes no gradient, rather than a tensor of zeros to read.
    context->set_materialize_grads(false);
    if (!second_output) return {y};
    // Shares y's storage without being a view of it: autograd keeps the two outputs' gradients
    // apart, and nothing writes to either in place.
    torch::Tensor y_again = torch::empty({0}, y.options());
    y_again.set_(y);
    return {y, y_again};
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    const variable_list saved = context->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& y = saved[1];
    const torch::Tensor& relu_mask = saved[2];
    const torch::Tensor& weight = saved[3];
    const torch::Tensor& bias = saved[4];
    const torch::Tensor& saved_mean = saved[5];
    const torch::Tensor& saved_inv_std = saved[6];
    const BatchNormActivation activation = activation_of(context->saved_data["activation"].toInt());

    // One gradient per forward argument: x, residual_or_x, activation, second_output,
    // statistics_or_x, given_statistics, weight, bias, running_mean, running_var, momentum, eps.
    // The backward is the same with the statistics given: they are x's, and its formula holds
    // their dependence on x.
    variable_list grads(12);
    // y's gradients through each output that reached the loss; the kernel adds the second.
    torch::Tensor grad_y = grad_outputs[0];
    torch::Tensor grad_y_second = grad_outputs.size() > 1 ? grad_outputs[1] : torch::Tensor();
    if (!grad_y.defined()) std::swap(grad_y, grad_y_second);
    if (!grad_y.defined()) return grads;
    const c10::cuda::CUDAGuard device_guard(x.device());
    grad_y = kernel_gradient(grad_y, x);
    if (grad_y_second.defined()) grad_y_second = kernel_gradient(grad_y_second, x);
    const bool add_residual = activation == BatchNormActivation::add_relu;
    const torch::Tensor grad_x = torch::empty_like(x);
    const torch::Tensor grad_residual = add_residual ? torch::empty_like(x) : torch::Tensor();
    const torch::Tensor grad_weight = torch::empty_like(weight);
    const torch::Tensor grad_bias = torch::empty_like(weight);
    kernels::BatchNormBackward arguments;
    arguments.x = x.data_ptr();
    arguments.y = y.defined() ? y.data_ptr() : nullptr;
    arguments.relu_mask = relu_mask.defined() ? relu_mask.data_ptr<uint8_t>() : nullptr;
    arguments.grad_y = grad_y.data_ptr();
    arguments.grad_y_second = grad_y_second.defined() ? grad_y_second.data_ptr() : nullptr;
    arguments.grad_x = grad_x.data_ptr();
    arguments.grad_residual = add_residual ? grad_residual.data_ptr() : nullptr;
    arguments.weight = weight.data_ptr<float>();
    arguments.bias = bias.data_ptr<float>();
    arguments.saved_mean = saved_mean.data_ptr<float>();
    arguments.saved_inv_std = saved_inv_std.data_ptr<float>();
    arguments.grad_weight = grad_weight.data_ptr<float>();
    arguments.grad_bias = grad_bias.data_ptr<float>();
    throw_on_error(kernels::batch_norm_backward(element_type(x), activation, shape_of(x), arguments,
                                                              current_stream_of(x)),
                            "BatchNorm kernel, backward");
    grads[0] = grad_x;
    grads[1] = grad_residual;
    grads[6] = grad_weight;
    grads[7] = grad_bias;
    return grads;
  }
};

/// [2,C] float32 sums of x and x^2 on x's device, contiguous.
bool are_statistics_of(const torch::Tensor& statistics, const torch::Tensor& x) {
  return statistics.scalar_type() == torch::kFloat32 && statistics.dim() == 2 && statistics.size(0) == 2 &&
         statistics.size(1) == x.size(1) && statistics.is_contiguous() && statistics.device() == x.device();
}

}  // namespace

device::KernelFit ltrain_batch_norm_fit(const torch::Device& device) {
  return fit_on(device, kernels::batch_norm_fit);
}

device::KernelFit ltrain_batch_norm_cluster_fit(const torch::Device& device) {
  return fit_on(device, kernels::batch_norm_cluster_fit);
}

torch::Tensor ltrain_batch_norm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                                const BatchNormParameters& parameters, torch::Tensor* second_output,
                                const torch::Tensor& statistics) {
  if (!relu && residual.defined()) return {};
  if (!takes_half_nhwc_batch_norm(x, residual, parameters)) return {};
  if (!vector_aligned(x) || (residual.defined() && !vector_aligned(residual))) return {};
  // The kernels add float sums atomically, in no fixed order: runs asked to repeat bit for bit
  // (precision.deterministic sets cuDNN's flag) get cuDNN's kernels or ATen's.
  if (at::globalContext().deterministicAlgorithms() || at::globalContext().deterministicCuDNN()) return {};
  if (!runs_on(x.device(), kernels::batch_norm_fit, "BatchNorm", "cuDNN's or ATen's BatchNorm kernels"))
    return {};
  const c10::cuda::CUDAGuard device_guard(x.device());
  const BatchNormActivation activation = activation_of(relu, residual.defined());
  if (!kernels::batch_norm_supported(element_type(x), activation, shape_of(x), current_stream_of(x)))
    return {};
  // Statistics that do not fit are computed again rather than refused.
  const bool given_statistics = statistics.defined() && are_statistics_of(statistics, x) &&
                                kernels::batch_norm_given_statistics_supported(element_type(x), shape_of(x));
  // The kernels add a second gradient only after a residual add: a residual block's output.
  if (activation != BatchNormActivation::add_relu) second_output = nullptr;
  variable_list outputs =
      LtrainBatchNorm::apply(x, residual.defined() ? residual : x, static_cast<int64_t>(activation),
                             second_output != nullptr, given_statistics ? statistics : x, given_statistics,
                             parameters.weight, parameters.bias, parameters.running_mean, parameters.running_var,
                             parameters.momentum, parameters.eps);
  if (second_output != nullptr) *second_output = std::move(outputs[1]);
  return std::move(outputs[0]);
}

std::string ltrain_batch_norm_reduction(const torch::Tensor& x, bool relu, bool residual) {
  if (!x.is_cuda() || x.dim() != 4 || x.numel() == 0) return {};
  const c10::cuda::CUDAGuard device_guard(x.device());
  switch (kernels::batch_norm_reduction(element_type(x), activation_of(relu, residual), shape_of(x))) {
    case kernels::BatchNormReduction::cluster: return "cluster";
    case kernels::BatchNormReduction::grid: return "grid";
    case kernels::BatchNormReduction::streaming: return "streaming";
    case kernels::BatchNormReduction::none: break;
  }
  return {};
}

void set_batch_norm_dependent_launch(BatchNormDependentLaunch which) {
  switch (which) {
    case BatchNormDependentLaunch::none:
      kernels::set_batch_norm_dependent_launch(kernels::BatchNormDependentLaunch::none);
      return;
    case BatchNormDependentLaunch::clusters:
      kernels::set_batch_norm_dependent_launch(kernels::BatchNormDependentLaunch::clusters);
      return;
    case BatchNormDependentLaunch::all:
      kernels::set_batch_norm_dependent_launch(kernels::BatchNormDependentLaunch::all);
      return;
  }
}

#endif  // LTRAIN_WITH_CUDA

}  // namespace ltrain::ops
