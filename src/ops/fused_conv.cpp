#include "ltrain/ops/fused_conv.h"

#if LTRAIN_WITH_FUSED_CONV
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>

#include "ltrain/kernels/fused_conv.h"
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {

#if !LTRAIN_WITH_FUSED_CONV

bool fused_conv_built() { return false; }

device::KernelFit fused_conv_fit(const torch::Device&) {
  return {false, "this build has no fused convolutions (configure with -DLTRAIN_FUSED_CONV=ON)"};
}

ConvWithStatistics conv_with_statistics(const torch::Tensor&, const torch::Tensor&, int64_t, int64_t) { return {}; }

#else

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::ConvShape shape_of(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                            int64_t padding) {
  kernels::ConvShape shape;
  shape.batch = x.size(0);
  shape.in_channels = x.size(1);
  shape.height = x.size(2);
  shape.width = x.size(3);
  shape.out_channels = weight.size(0);
  shape.kernel = weight.size(2);
  shape.stride = stride;
  shape.padding = padding;
  return shape;
}

kernels::ElementType element_type(const torch::Tensor& x) {
  kernels::ElementType type{};
  element_type_of(x.scalar_type(), type);
  return type;
}

/// The fit function for fit_on (which caches per function and device): the current device.
device::KernelFit current_device_fit() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return {false, "no current CUDA device"};
  }
  if (!kernels::fused_conv_device_supported(device))
    return {false, "the fused convolutions are built for sm_90a alone (compute capability 9.0)"};
  return {true, ""};
}

class ConvWithStatisticsFunction : public torch::autograd::Function<ConvWithStatisticsFunction> {
 public:
  /// Returns {y [B,K,H',W'] channels_last in x's dtype, statistics [2,K] float32}.
  static variable_list forward(AutogradContext* context, const torch::Tensor& x, const torch::Tensor& weight,
                               int64_t stride, int64_t padding) {
    const c10::cuda::CUDAGuard device_guard(x.device());
    const kernels::ConvShape shape = shape_of(x, weight, stride, padding);
    const kernels::ElementType type = element_type(x);
    const torch::Tensor y =
        torch::empty({shape.batch, shape.out_channels, shape.out_height(), shape.out_width()},
                     x.options().memory_format(at::MemoryFormat::ChannelsLast));
    const torch::Tensor statistics = torch::empty({2, shape.out_channels}, x.options().dtype(torch::kFloat32));
    const size_t workspace_bytes = kernels::fused_conv_workspace_bytes(type, shape);
    // The per-tile partial sums; the caching allocator's blocks are 512-byte aligned.
    const torch::Tensor workspace =
        torch::empty({static_cast<int64_t>(workspace_bytes)}, x.options().dtype(torch::kUInt8));
    kernels::FusedConvForward arguments;
    arguments.x = x.data_ptr();
    arguments.weight = weight.data_ptr();
    arguments.y = y.data_ptr();
    arguments.sum = statistics.data_ptr<float>();
    arguments.square_sum = arguments.sum + shape.out_channels;
    arguments.workspace = workspace.data_ptr();
    arguments.workspace_bytes = workspace_bytes;
    throw_on_error(kernels::fused_conv_forward(type, shape, arguments, current_stream_of(x)),
                   "fused convolution, forward");
    context->save_for_backward({x, weight});
    context->saved_data["stride"] = stride;
    context->saved_data["padding"] = padding;
    context->mark_non_differentiable({statistics});
    context->set_materialize_grads(false);
    return {y, statistics};
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    // One gradient per forward argument: x, weight, stride, padding.
    variable_list grads(4);
    const torch::Tensor& grad_y = grad_outputs[0];
    if (!grad_y.defined()) return grads;
    const variable_list saved = context->get_saved_variables();
    const int64_t stride = context->saved_data["stride"].toInt();
    const int64_t padding = context->saved_data["padding"].toInt();
    const c10::cuda::CUDAGuard device_guard(saved[0].device());
    // What torch's convolution runs backward: cuDNN's data and weight gradients, as configured
    // (benchmark mode, TF32, determinism).
    const std::array<bool, 3> wanted{context->needs_input_grad(0), context->needs_input_grad(1), false};
    auto [grad_x, grad_weight, grad_bias] =
        at::convolution_backward(grad_y, saved[0], saved[1], c10::nullopt, {stride, stride}, {padding, padding},
                                 {1, 1}, /*transposed=*/false, {0, 0}, /*groups=*/1, wanted);
    grads[0] = grad_x;
    grads[1] = grad_weight;
    return grads;
  }
};

bool is_aligned_channels_last(const torch::Tensor& t) {
  return t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast) && vector_aligned(t);
}

}  // namespace

bool fused_conv_built() { return true; }

device::KernelFit fused_conv_fit(const torch::Device& device) { return fit_on(device, current_device_fit); }

ConvWithStatistics conv_with_statistics(const torch::Tensor& x, const torch::Tensor& weight, int64_t stride,
                                        int64_t padding) {
  if (!x.defined() || !weight.defined() || !x.is_cuda() || x.numel() == 0) return {};
  if (x.scalar_type() != torch::kHalf && x.scalar_type() != torch::kBFloat16) return {};
  if (weight.scalar_type() != x.scalar_type() || weight.device() != x.device()) return {};
  if (!is_aligned_channels_last(x) || !is_aligned_channels_last(weight)) return {};
  if (weight.size(1) != x.size(1) || weight.size(2) != weight.size(3)) return {};
  if (at::globalContext().deterministicAlgorithms() || at::globalContext().deterministicCuDNN()) return {};
  if (!kernels::fused_conv_pays(element_type(x), shape_of(x, weight, stride, padding))) return {};
  if (!runs_on(x.device(), current_device_fit, "fused convolution", "cuDNN's convolutions")) return {};
  variable_list outputs = ConvWithStatisticsFunction::apply(x, weight, stride, padding);
  return {std::move(outputs[0]), std::move(outputs[1])};
}

#endif  // LTRAIN_WITH_FUSED_CONV

}  // namespace ltrain::ops
