#include "ltrain/ops/max_pool.h"

#if LTRAIN_WITH_CUDA
#include <cstdint>

#include "ltrain/kernels/max_pool.h"
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {

#if !LTRAIN_WITH_CUDA

device::KernelFit ltrain_max_pool_fit(const torch::Device&) { return {false, "a CPU build has no CUDA kernels"}; }

bool takes_ltrain_max_pool(const torch::Tensor&, int64_t, int64_t, int64_t) { return false; }

#else

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::PoolGeometry geometry_of(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding) {
  kernels::PoolGeometry g;
  g.batch = input.size(0);
  g.channels = input.size(1);
  g.height = input.size(2);
  g.width = input.size(3);
  g.out_height = (g.height + 2 * padding - kernel) / stride + 1;
  g.out_width = (g.width + 2 * padding - kernel) / stride + 1;
  g.kernel = kernel;
  g.stride = stride;
  g.padding = padding;
  return g;
}

struct LtrainMaxPool : public torch::autograd::Function<LtrainMaxPool> {
  // input [N,C,H,W] channels_last -> output [N,C,OH,OW] channels_last; arg-max saved as uint8
  // [N,OH,OW,C] (the position in the window).
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& input, int64_t kernel, int64_t stride,
                               int64_t padding) {
    const kernels::PoolGeometry g = geometry_of(input, kernel, stride, padding);
    kernels::ElementType type{};
    element_type_of(input.scalar_type(), type);
    const torch::Tensor output = torch::empty({g.batch, g.channels, g.out_height, g.out_width},
                                              input.options().memory_format(torch::MemoryFormat::ChannelsLast));
    const torch::Tensor argmax =
        torch::empty({g.batch, g.out_height, g.out_width, g.channels}, input.options().dtype(torch::kUInt8));
    throw_on_error(kernels::max_pool_forward(type, input.data_ptr(), output.data_ptr(),
                                                           argmax.data_ptr<uint8_t>(), g,
                                                           current_stream_of(input)),
                            "max pooling kernel, forward");
    context->save_for_backward({argmax});
    context->saved_data["input_height"] = g.height;
    context->saved_data["input_width"] = g.width;
    context->saved_data["kernel"] = kernel;
    context->saved_data["stride"] = stride;
    context->saved_data["padding"] = padding;
    return output;
  }

  static variable_list backward(AutogradContext* context, variable_list grads) {
    const torch::Tensor argmax = context->get_saved_variables()[0];
    torch::Tensor grad_output = grads[0].contiguous(torch::MemoryFormat::ChannelsLast);
    if (!vector_aligned(grad_output)) grad_output = grad_output.clone(torch::MemoryFormat::ChannelsLast);
    kernels::PoolGeometry g;
    g.batch = argmax.size(0);
    g.out_height = argmax.size(1);
    g.out_width = argmax.size(2);
    g.channels = argmax.size(3);
    g.height = context->saved_data["input_height"].toInt();
    g.width = context->saved_data["input_width"].toInt();
    g.kernel = context->saved_data["kernel"].toInt();
    g.stride = context->saved_data["stride"].toInt();
    g.padding = context->saved_data["padding"].toInt();
    kernels::ElementType type{};
    element_type_of(grad_output.scalar_type(), type);
    const auto layout = grad_output.options().memory_format(torch::MemoryFormat::ChannelsLast);
    const torch::Tensor grad_input = torch::empty({g.batch, g.channels, g.height, g.width}, layout);
    throw_on_error(
        kernels::max_pool_backward(type, grad_output.data_ptr(), argmax.data_ptr<uint8_t>(), grad_input.data_ptr(),
                                        g, current_stream_of(grad_output)),
        "max pooling kernel, backward");
    return {grad_input, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

device::KernelFit ltrain_max_pool_fit(const torch::Device& device) {
  return fit_on(device, kernels::max_pool_fit);
}

bool takes_ltrain_max_pool(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding) {
  kernels::ElementType type{};
  if (!input.defined() || !input.is_cuda() || input.dim() != 4) return false;
  if (!element_type_of(input.scalar_type(), type)) return false;
  if (!input.is_contiguous(torch::MemoryFormat::ChannelsLast) || !vector_aligned(input)) return false;
  if (input.size(1) % kernels::max_pool_vector_width(type) != 0) return false;
  // The arg-max byte holds kh * kernel + kw; ATen's own limits on padding and output size.
  if (kernel < 1 || kernel * kernel > 256 || stride < 1 || padding < 0 || 2 * padding > kernel) return false;
  if (input.size(2) + 2 * padding < kernel || input.size(3) + 2 * padding < kernel || input.numel() == 0) return false;
  return runs_on(input.device(), kernels::max_pool_fit, "max pooling", "ATen's max pooling kernels");
}

#endif  // LTRAIN_WITH_CUDA

torch::Tensor max_pool2d(const torch::Tensor& input, int64_t kernel, int64_t stride, int64_t padding,
                         const MaxPoolBackends& backends) {
#if LTRAIN_WITH_CUDA
  if (backends.ltrain && takes_ltrain_max_pool(input, kernel, stride, padding))
    return LtrainMaxPool::apply(input, kernel, stride, padding);
#else
  (void)backends;
#endif
  return torch::max_pool2d(input, {kernel, kernel}, {stride, stride}, {padding, padding});
}

}  // namespace ltrain::ops
