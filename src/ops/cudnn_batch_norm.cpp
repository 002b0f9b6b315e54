#include "ltrain/ops/batch_norm.h"

#if LTRAIN_WITH_CUDNN
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cudnn/Handle.h>
#include <cudnn.h>

#include <array>
#include <atomic>
#include <stdexcept>
#include <string>
#endif

namespace ltrain::ops {

#if !LTRAIN_WITH_CUDNN

bool cudnn_batch_norm_built() { return false; }

torch::Tensor cudnn_batch_norm(const torch::Tensor&, const torch::Tensor&, const BatchNormParameters&) { return {}; }

#else

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The fused kernels exist for NHWC in the persistent mode only (the mode PyTorch's own cuDNN
// BatchNorm uses in training). cuDNN 9 keeps this legacy API, marked deprecated.
constexpr cudnnBatchNormMode_t kMode = CUDNN_BATCHNORM_SPATIAL_PERSISTENT;

/// Thrown from the forward pass when cuDNN does not support the combination (nothing was written).
struct CudnnRefused {};

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuDNN's fused BatchNorm: ") + what + ": " + cudnnGetErrorString(status));
}

/// Like check(), but a NOT_SUPPORTED status becomes CudnnRefused.
void check_supported(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_NOT_SUPPORTED) throw CudnnRefused{};
  check(status, what);
}

cudnnBatchNormOps_t fused_ops(bool add_residual) {
  return add_residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
}

/// PyTorch's cuDNN handle for this thread and device, on the current stream (a capturing one too).
cudnnHandle_t current_handle() {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  check(cudnnSetStream(handle, at::cuda::getCurrentCUDAStream()), "cudnnSetStream");
  return handle;
}

/// The descriptors of one call: `data` for x, y, the residual and their gradients ([B,C,H,W] NHWC,
/// fp16/bf16), `per_channel` for weight, bias and the statistics ([1,C,1,1] float32), `relu`.
class Descriptors {
 public:
  explicit Descriptors(const torch::Tensor& x) {
    check(cudnnCreateTensorDescriptor(&data_), "create descriptor");
    check(cudnnCreateTensorDescriptor(&per_channel_), "create descriptor");
    check(cudnnCreateActivationDescriptor(&relu_), "create descriptor");
    const cudnnDataType_t type = x.scalar_type() == torch::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    const auto dim = [&x](int64_t d) { return static_cast<int>(x.size(d)); };
    check(cudnnSetTensor4dDescriptor(data_, CUDNN_TENSOR_NHWC, type, dim(0), dim(1), dim(2), dim(3)), "x descriptor");
    check(cudnnSetTensor4dDescriptor(per_channel_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, dim(1), 1, 1),
          "per-channel descriptor");
    check(cudnnSetActivationDescriptor(relu_, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0), "ReLU descriptor");
  }
  ~Descriptors() {
    cudnnDestroyActivationDescriptor(relu_);
    cudnnDestroyTensorDescriptor(per_channel_);
    cudnnDestroyTensorDescriptor(data_);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  cudnnTensorDescriptor_t data() const { return data_; }
  /// The residual's (and its gradient's) descriptor, null without one.
  cudnnTensorDescriptor_t residual(bool add_residual) const { return add_residual ? data_ : nullptr; }
  cudnnTensorDescriptor_t per_channel() const { return per_channel_; }
  cudnnActivationDescriptor_t relu() const { return relu_; }

 private:
  cudnnTensorDescriptor_t data_{};
  cudnnTensorDescriptor_t per_channel_{};
  cudnnActivationDescriptor_t relu_{};
};

torch::Tensor byte_buffer(size_t bytes, const torch::Tensor& like) {
  return torch::empty({static_cast<int64_t>(bytes)}, like.options().dtype(torch::kUInt8));
}

/// cuDNN's scaling factors for fp16/bf16/float data are float: out = 1 * result + 0 * out.
constexpr float kOne = 1.0F;
constexpr float kZero = 0.0F;

class CudnnBatchNorm : public torch::autograd::Function<CudnnBatchNorm> {
 public:
  /// `residual_or_x`: the residual, or x again without one (a custom function takes no undefined
  /// tensors), as `add_residual` says.
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& x, const torch::Tensor& residual_or_x,
                               bool add_residual, const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& running_mean, const torch::Tensor& running_var, double momentum,
                               double eps) {
    const cudnnBatchNormOps_t ops = fused_ops(add_residual);
    const Descriptors descriptors(x);
    cudnnHandle_t handle = current_handle();

    size_t workspace_bytes = 0;
    check_supported(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
                        handle, kMode, ops, descriptors.data(), descriptors.residual(add_residual),
                        descriptors.data(), descriptors.per_channel(), descriptors.relu(), &workspace_bytes),
                    "forward workspace size");
    size_t reserve_bytes = 0;
    check_supported(cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, kMode, ops, descriptors.relu(),
                                                                         descriptors.data(), &reserve_bytes),
                    "reserve size");
    const torch::Tensor workspace = byte_buffer(workspace_bytes, x);
    // Kept for the backward pass (it holds what the ReLU's gradient needs).
    const torch::Tensor reserve = byte_buffer(reserve_bytes, x);
    const torch::Tensor y = torch::empty_like(x);                   // x's layout: channels_last
    const torch::Tensor saved_mean = torch::empty_like(weight);     // [C] float32
    const torch::Tensor saved_inv_std = torch::empty_like(weight);  // [C] float32, 1/sqrt(var + eps)

    check_supported(cudnnBatchNormalizationForwardTrainingEx(
                        handle, kMode, ops, &kOne, &kZero, descriptors.data(), x.data_ptr(),
                        descriptors.residual(add_residual), add_residual ? residual_or_x.data_ptr() : nullptr,
                        descriptors.data(), y.data_ptr(), descriptors.per_channel(), weight.data_ptr(),
                        bias.data_ptr(), momentum, running_mean.data_ptr(), running_var.data_ptr(), eps,
                        saved_mean.data_ptr(), saved_inv_std.data_ptr(), descriptors.relu(), workspace.data_ptr(),
                        workspace_bytes, reserve.data_ptr(), reserve_bytes),
                    "forward");

    context->save_for_backward({x, y, weight, bias, saved_mean, saved_inv_std, reserve});
    context->saved_data["add_residual"] = add_residual;
    context->saved_data["eps"] = eps;
    return y;
  }

  static variable_list backward(AutogradContext* context, variable_list grad_outputs) {
    const variable_list saved = context->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& y = saved[1];
    const torch::Tensor& weight = saved[2];
    const torch::Tensor& bias = saved[3];
    const torch::Tensor& saved_mean = saved[4];
    const torch::Tensor& saved_inv_std = saved[5];
    const torch::Tensor& reserve = saved[6];
    const bool add_residual = context->saved_data["add_residual"].toBool();
    const cudnnBatchNormOps_t ops = fused_ops(add_residual);

    // One gradient per forward argument: x, residual_or_x, add_residual, weight, bias, running_mean,
    // running_var, momentum, eps.
    variable_list grads(9);
    if (!grad_outputs[0].defined()) return grads;
    const torch::Tensor grad_y = grad_outputs[0].to(x.scalar_type()).contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor grad_x = torch::empty_like(x);
    const torch::Tensor grad_residual = add_residual ? torch::empty_like(x) : torch::Tensor();
    const torch::Tensor grad_weight = torch::empty_like(weight);
    const torch::Tensor grad_bias = torch::empty_like(bias);

    const Descriptors descriptors(x);
    cudnnHandle_t handle = current_handle();
    size_t workspace_bytes = 0;
    check(cudnnGetBatchNormalizationBackwardExWorkspaceSize(
              handle, kMode, ops, descriptors.data(), descriptors.data(), descriptors.data(),
              descriptors.residual(add_residual), descriptors.data(), descriptors.per_channel(), descriptors.relu(),
              &workspace_bytes),
          "backward workspace size");
    const torch::Tensor workspace = byte_buffer(workspace_bytes, x);
    check(cudnnBatchNormalizationBackwardEx(
              handle, kMode, ops, &kOne, &kZero, &kOne, &kZero, descriptors.data(), x.data_ptr(), descriptors.data(),
              y.data_ptr(), descriptors.data(), grad_y.data_ptr(), descriptors.residual(add_residual),
              add_residual ? grad_residual.data_ptr() : nullptr, descriptors.data(), grad_x.data_ptr(),
              descriptors.per_channel(), weight.data_ptr(), bias.data_ptr(), grad_weight.data_ptr(),
              grad_bias.data_ptr(), context->saved_data["eps"].toDouble(), saved_mean.data_ptr(),
              saved_inv_std.data_ptr(), descriptors.relu(), workspace.data_ptr(), workspace_bytes,
              reserve.data_ptr(), static_cast<size_t>(reserve.numel())),
          "backward");
    grads[0] = grad_x;
    grads[1] = grad_residual;
    grads[3] = grad_weight;
    grads[4] = grad_bias;
    return grads;
  }
};

/// What the fused kernels take (see the header); anything else runs as separate operators.
bool fusable(const torch::Tensor& x, const torch::Tensor& residual, const BatchNormParameters& parameters) {
  return at::globalContext().userEnabledCuDNN() && takes_half_nhwc_batch_norm(x, residual, parameters) &&
         x.size(1) % 4 == 0;
}

/// Set once cuDNN has refused a combination: [bf16][add_residual].
std::array<std::array<std::atomic<bool>, 2>, 2> refused{};

}  // namespace

bool cudnn_batch_norm_built() { return true; }

torch::Tensor cudnn_batch_norm(const torch::Tensor& x, const torch::Tensor& residual,
                               const BatchNormParameters& parameters) {
  if (!fusable(x, residual, parameters)) return {};
  std::atomic<bool>& refused_here =
      refused[x.scalar_type() == torch::kBFloat16 ? 1 : 0][residual.defined() ? 1 : 0];
  if (refused_here.load(std::memory_order_relaxed)) return {};
  try {
    const bool add_residual = residual.defined();
    return CudnnBatchNorm::apply(x, add_residual ? residual : x, add_residual, parameters.weight, parameters.bias,
                                     parameters.running_mean, parameters.running_var, parameters.momentum,
                                     parameters.eps);
  } catch (const CudnnRefused&) {
    refused_here.store(true, std::memory_order_relaxed);
    return {};
  }
}

#endif  // LTRAIN_WITH_CUDNN

}  // namespace ltrain::ops
