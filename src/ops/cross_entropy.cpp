#include "ltrain/ops/cross_entropy.h"

#if LTRAIN_WITH_CUDA
#include "ltrain/kernels/cross_entropy.h"
#include "ltrain/ops/kernel_bridge.h"
#endif

namespace ltrain::ops {

#if !LTRAIN_WITH_CUDA

device::KernelFit ltrain_cross_entropy_fit(const torch::Device&) {
  return {false, "a CPU build has no CUDA kernels"};
}

bool takes_ltrain_cross_entropy(const torch::Tensor&, const torch::Tensor&, double) { return false; }

#else

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LtrainCrossEntropy : public torch::autograd::Function<LtrainCrossEntropy> {
  // logits [rows, classes] (float32/fp16/bf16), labels [rows] int64 -> loss [] float32; the
  // gradient d loss / d logits [rows, classes] float32 is written with it and saved.
  static torch::Tensor forward(AutogradContext* context, const torch::Tensor& logits, const torch::Tensor& labels,
                               double label_smoothing) {
    kernels::ElementType type{};
    element_type_of(logits.scalar_type(), type);
    const kernels::CrossEntropyShape shape{logits.size(0), logits.size(1)};
    const torch::Tensor loss = torch::empty({}, logits.options().dtype(torch::kFloat32));
    const torch::Tensor gradient = torch::empty({shape.rows, shape.classes}, logits.options().dtype(torch::kFloat32));
    throw_on_error(kernels::cross_entropy_forward(type, logits.data_ptr(), labels.data_ptr<int64_t>(), shape,
                                                  static_cast<float>(label_smoothing), loss.data_ptr<float>(),
                                                  gradient.data_ptr<float>(), current_stream_of(logits)),
                   "cross-entropy kernel, forward");
    context->save_for_backward({gradient});
    context->saved_data["logits_dtype"] = logits.scalar_type();
    return loss;
  }

  static variable_list backward(AutogradContext* context, variable_list grads) {
    const torch::Tensor gradient = context->get_saved_variables()[0];
    const torch::Tensor grad_loss = grads[0].to(torch::kFloat32).contiguous();  // []
    const auto dtype = context->saved_data["logits_dtype"].toScalarType();
    kernels::ElementType type{};
    element_type_of(dtype, type);
    const torch::Tensor grad_logits = torch::empty(gradient.sizes(), gradient.options().dtype(dtype));
    throw_on_error(kernels::cross_entropy_backward(type, gradient.data_ptr<float>(), grad_loss.data_ptr<float>(),
                                                   grad_logits.data_ptr(), gradient.numel(),
                                                   current_stream_of(gradient)),
                   "cross-entropy kernel, backward");
    return {grad_logits, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

device::KernelFit ltrain_cross_entropy_fit(const torch::Device& device) {
  return fit_on(device, kernels::cross_entropy_fit);
}

bool takes_ltrain_cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing) {
  kernels::ElementType type{};
  if (!logits.defined() || !labels.defined() || !logits.is_cuda() || logits.dim() != 2) return false;
  if (!element_type_of(logits.scalar_type(), type) || !logits.is_contiguous()) return false;
  if (logits.size(0) < 1 || logits.size(0) > kernels::kCrossEntropyMostRows) return false;
  if (logits.size(1) < 1 || logits.size(1) > kernels::kCrossEntropyMostClasses) return false;
  if (labels.device() != logits.device() || labels.scalar_type() != torch::kInt64 || labels.dim() != 1 ||
      labels.size(0) != logits.size(0) || !labels.is_contiguous())
    return false;
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) return false;
  return runs_on(logits.device(), kernels::cross_entropy_fit, "cross-entropy", "ATen's cross-entropy kernels");
}

#endif  // LTRAIN_WITH_CUDA

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing,
                            const CrossEntropyBackends& backends) {
#if LTRAIN_WITH_CUDA
  if (backends.ltrain && takes_ltrain_cross_entropy(logits, labels, label_smoothing))
    return LtrainCrossEntropy::apply(logits, labels, label_smoothing);
#else
  (void)backends;
#endif
  return torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
}

}  // namespace ltrain::ops
