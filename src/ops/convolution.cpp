#include "ltrain/ops/convolution.h"

#include <array>
#include <utility>
#include <vector>

#include "ltrain/core/gpu.h"
#include "ltrain/core/torch_compat.h"

namespace ltrain::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What CUDA autocast's convolution casts: a floating-point CUDA tensor other than float64, to
/// autocast's dtype. Elsewhere, or with autocast off, the tensor as it is.
torch::Tensor cast_as_autocast(const torch::Tensor& t) {
  if (!t.is_cuda() || !compat::autocast_enabled(torch::kCUDA)) return t;
  const torch::ScalarType dtype = compat::autocast_dtype(torch::kCUDA);
  if (!t.is_floating_point() || t.scalar_type() == torch::kDouble || t.scalar_type() == dtype) return t;
  return t.to(dtype);
}

/// Whether autograd keeps `grad` as the .grad of `weight` as it is: the strides agree wherever a
/// size is not 1 (autograd's layout contract for gradients); otherwise it copies it.
bool keeps_as_grad(const torch::Tensor& grad, const torch::Tensor& weight) {
  if (!weight.is_non_overlapping_and_dense()) return grad.is_contiguous();
  for (int64_t d = 0; d < weight.dim(); ++d)
    if (weight.size(d) != 1 && grad.stride(d) != weight.stride(d)) return false;
  return true;
}

/// The weight gradient would be read by autograd inside the backward pass, on the stream that
/// queued the convolution's backward and without waiting for the branch: added to a gradient the
/// weight already holds, passed on to a weight that is no leaf, or copied into the weight's layout.
bool autograd_reads_weight_gradient(const torch::Tensor& weight, const torch::Tensor& grad_weight) {
  return !weight.is_leaf() || weight.grad().defined() || !keeps_as_grad(grad_weight, weight);
}

/// weight [K,C,k,k] extended to [K,channels,k,k] with zero channels, in its memory format; autograd
/// hands the gradient of the first C channels back to `weight`.
torch::Tensor with_zero_channels(const torch::Tensor& weight, int64_t channels) {
  std::vector<int64_t> sizes = weight.sizes().vec();
  sizes[1] = channels;
  // at::zeros takes no memory format: empty in the weight's, then zeroed.
  torch::Tensor padded = torch::empty(sizes, weight.options().memory_format(weight.suggest_memory_format())).zero_();
  padded.narrow(1, 0, weight.size(1)).copy_(weight);
  return padded;
}

/// Whether x [B,C',H,W] carries channels past weight's [K,C,k,k], C' > C: images padded with zero
/// channels (padded_image_channels), which the weight meets extended with zero channels of its own.
bool input_padded_past(const torch::Tensor& x, const torch::Tensor& weight, int64_t groups) {
  return groups == 1 && x.dim() == 4 && weight.dim() == 4 && x.size(1) > weight.size(1);
}

/// ConvolutionBackends::after_weight_gradient as autograd's saved data holds it (a capsule).
struct AfterWeightGradient : torch::CustomClassHolder {
  explicit AfterWeightGradient(ConvolutionBackends::AfterWeightGradient called) : call(std::move(called)) {}
  ConvolutionBackends::AfterWeightGradient call;
};

constexpr const char* kAfterWeightGradient = "after_weight_gradient";

/// torch's convolution, whose backward queues the weight gradient on the step's branch stream.
class BranchedConvolutionFunction : public torch::autograd::Function<BranchedConvolutionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& x, const torch::Tensor& weight,
                               int64_t stride, int64_t padding, int64_t groups, bool join_each,
                               const ConvolutionBackends::AfterWeightGradient& after_weight_gradient) {
    // Images padded past the weight's channels: the weight padded to match here, and its
    // gradient cut back to its own channels in the backward pass, on the branch.
    const torch::Tensor padded_weight =
        input_padded_past(x, weight, groups) ? with_zero_channels(weight, x.size(1)) : weight;
    context->save_for_backward({x, weight, padded_weight});
    context->saved_data["stride"] = stride;
    context->saved_data["padding"] = padding;
    context->saved_data["groups"] = groups;
    context->saved_data["join_each"] = join_each;
    if (after_weight_gradient)
      context->saved_data[kAfterWeightGradient] =
          c10::IValue::make_capsule(c10::make_intrusive<AfterWeightGradient>(after_weight_gradient));
    return torch::conv2d(x, padded_weight, {}, stride, padding, /*dilation=*/1, groups);
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    // One gradient per forward argument: x, weight, stride, padding, groups, join_each,
    // after_weight_gradient.
    variable_list grads(7);
    const torch::Tensor& grad_y = grad_outputs[0];
    if (!grad_y.defined()) return grads;
    const variable_list saved = context->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& padded_weight = saved[2];
    const int64_t stride = context->saved_data["stride"].toInt();
    const int64_t padding = context->saved_data["padding"].toInt();
    const int64_t groups = context->saved_data["groups"].toInt();
    // The same two cuDNN products as torch's convolution backward, asked for one at a time.
    auto gradient = [&](bool of_input) {
      const std::array<bool, 3> wanted{of_input, !of_input, false};
      auto products = at::convolution_backward(grad_y, x, padded_weight, c10::nullopt, {stride, stride},
                                               {padding, padding}, {1, 1}, /*transposed=*/false, {0, 0}, groups,
                                               wanted);
      if (of_input) return std::get<0>(products);
      const torch::Tensor& grad_weight = std::get<1>(products);  // [K,C',k,k]
      if (padded_weight.size(1) == weight.size(1)) return grad_weight;
      return grad_weight.narrow(1, 0, weight.size(1)).contiguous(weight.suggest_memory_format());
    };
    bool joined = false;
    if (context->needs_input_grad(1)) {
      // Forked before the data gradient is queued: the branch waits for grad_y alone.
      gpu::fork_to_branch(
          x.device(), [&] { grads[1] = gradient(/*of_input=*/false); }, {x, grad_y});
      joined = context->saved_data["join_each"].toBool() || autograd_reads_weight_gradient(weight, grads[1]);
      if (joined) gpu::join_branch(x.device());
    }
    if (context->needs_input_grad(0)) grads[0] = gradient(/*of_input=*/true);
    const auto after = context->saved_data.find(kAfterWeightGradient);
    if (grads[1].defined() && !joined && after != context->saved_data.end()) {
      const auto holder = c10::static_intrusive_pointer_cast<AfterWeightGradient>(after->second.toCapsule());
      // Forked after the data gradient is queued: what the call queues waits for it too (and, on
      // the branch, for the weight gradient).
      gpu::fork_to_branch(x.device(), [&] { holder->call(weight, grads[1]); }, {});
    }
    return grads;
  }
};

}  // namespace

int64_t padded_image_channels(int64_t channels, torch::ScalarType dtype, torch::MemoryFormat format,
                              const torch::Device& device) {
  if (!device.is_cuda() || format != torch::MemoryFormat::ChannelsLast || channels != 3) return channels;
  if (dtype == torch::kHalf) return 4;
  if (dtype == torch::kBFloat16) return 8;
  return channels;
}

ConvWithStatistics convolution(const torch::Tensor& x, const torch::Tensor& weight,
                               const ConvolutionParameters& parameters, const ConvolutionBackends& backends,
                               bool with_statistics) {
  // Images padded past the weight's channels: the weight padded to match (by autograd's operators
  // here; on the branch, inside the branched convolution).
  const bool padded_input = input_padded_past(x, weight, parameters.groups);
  const auto padded = [&](const torch::Tensor& w) {
    return padded_input ? with_zero_channels(cast_as_autocast(w), x.size(1)) : w;
  };
  if (with_statistics && parameters.groups == 1) {
    // Under autocast without the step's low-precision weight copies (amp/low_precision_weights.h),
    // the cast torch's own convolution would make.
    ConvWithStatistics fused = conv_with_statistics(cast_as_autocast(x), cast_as_autocast(padded(weight)),
                                                    parameters.stride, parameters.padding);
    if (fused.y.defined()) return fused;
  }
  const bool branched = backends.weight_gradient_branch && x.is_cuda() && torch::GradMode::is_enabled() &&
                        (x.requires_grad() || weight.requires_grad());
  if (!branched) {
    return {torch::conv2d(x, padded(weight), {}, parameters.stride, parameters.padding, 1, parameters.groups), {}};
  }
  return {BranchedConvolutionFunction::apply(cast_as_autocast(x), cast_as_autocast(weight), parameters.stride,
                                             parameters.padding, parameters.groups,
                                             backends.join_each_weight_gradient, backends.after_weight_gradient),
          {}};
}

}  // namespace ltrain::ops
