#include "ltrain/ops/batch_norm.h"

#include <vector>

namespace ltrain::ops {
namespace {

/// A float32 [channels] vector on `device`.
bool is_channel_vector(const torch::Tensor& t, int64_t channels, const torch::Device& device) {
  return t.defined() && t.scalar_type() == torch::kFloat32 && t.dim() == 1 && t.size(0) == channels &&
         t.is_contiguous() && t.device() == device;
}

/// Training-mode batch_norm(x) with the statistics of every rank's batch, in float32:
/// `sum_over_ranks` adds a [2C+1] vector over the ranks, differentiably.
torch::Tensor synchronized_batch_norm(const torch::Tensor& x, const BatchNormParameters& parameters,
                                      const std::function<torch::Tensor(const torch::Tensor&)>& sum_over_ranks) {
  const int64_t channels = x.size(1);
  const torch::Tensor x32 = x.to(torch::kFloat32);  // [B,C,H,W]
  const std::vector<int64_t> reduced{0, 2, 3};
  const double local_count = static_cast<double>(x.numel() / channels);
  // [2C+1]: per-channel sums and sums of squares, and the number of values per channel.
  const torch::Tensor stats = sum_over_ranks(
      torch::cat({x32.sum(reduced), x32.square().sum(reduced), torch::full({1}, local_count, x32.options())}));
  const torch::Tensor count = stats.narrow(0, 2 * channels, 1);                           // [1]
  const torch::Tensor mean = stats.narrow(0, 0, channels) / count;                        // [C]
  const torch::Tensor variance = stats.narrow(0, channels, channels) / count - mean.square();  // [C], biased
  {
    // As torch: the running variance is the unbiased one.
    torch::NoGradGuard no_grad;
    parameters.running_mean.mul_(1.0 - parameters.momentum).add_(mean.detach() * parameters.momentum);
    parameters.running_var.mul_(1.0 - parameters.momentum)
        .add_(variance.detach() * (count / (count - 1.0)) * parameters.momentum);
  }
  const std::vector<int64_t> per_channel{1, channels, 1, 1};
  const torch::Tensor scale = (parameters.weight * torch::rsqrt(variance + parameters.eps)).view(per_channel);
  return ((x32 - mean.view(per_channel)) * scale + parameters.bias.view(per_channel)).to(x.scalar_type());
}

/// The fused backends in their order; an undefined tensor where neither takes the input.
torch::Tensor fused_batch_norm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                               const BatchNormParameters& parameters, const BatchNormBackends& backends,
                               torch::Tensor* second_output, const torch::Tensor& statistics) {
  if (backends.ltrain) {
    torch::Tensor y = ltrain_batch_norm(x, residual, relu, parameters, second_output, statistics);
    if (y.defined()) return y;
  }
  if (backends.cudnn && relu) return cudnn_batch_norm(x, residual, parameters);
  return {};
}

}  // namespace

torch::Tensor batch_norm(const torch::Tensor& x, const torch::Tensor& residual, bool relu,
                         const BatchNormParameters& parameters, bool training, const BatchNormBackends& backends,
                         torch::Tensor* second_output, const torch::Tensor& statistics) {
  torch::Tensor y;
  if (training && backends.sum_over_ranks) {
    y = synchronized_batch_norm(x, parameters, backends.sum_over_ranks);
  } else if (training) {
    torch::Tensor fused = fused_batch_norm(x, residual, relu, parameters, backends, second_output, statistics);
    if (fused.defined()) return fused;
  }
  if (!y.defined())
    y = torch::batch_norm(x, parameters.weight, parameters.bias, parameters.running_mean, parameters.running_var,
                          training, parameters.momentum, parameters.eps, at::globalContext().userEnabledCuDNN());
  if (!relu) return y;
  // In place, as torchvision does: BatchNorm's backward needs its input, not its output, so its
  // output buffer can take the sum and the ReLU instead of two fresh allocations.
  if (residual.defined()) y.add_(residual);
  return y.relu_();
}

bool takes_half_nhwc_batch_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                const BatchNormParameters& parameters) {
  if (!x.defined() || !x.is_cuda() || x.dim() != 4 || x.numel() == 0) return false;
  if (x.scalar_type() != torch::kHalf && x.scalar_type() != torch::kBFloat16) return false;
  if (!x.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  if (residual.defined() &&
      (residual.sizes() != x.sizes() || residual.scalar_type() != x.scalar_type() ||
       residual.device() != x.device() || !residual.is_contiguous(at::MemoryFormat::ChannelsLast)))
    return false;
  const int64_t channels = x.size(1);
  const torch::Device device = x.device();
  return is_channel_vector(parameters.weight, channels, device) &&
         is_channel_vector(parameters.bias, channels, device) &&
         is_channel_vector(parameters.running_mean, channels, device) &&
         is_channel_vector(parameters.running_var, channels, device);
}

}  // namespace ltrain::ops
