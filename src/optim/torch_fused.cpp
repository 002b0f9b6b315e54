#include "ltrain/optim/torch_fused.h"

#include <stdexcept>

namespace ltrain::optim {

#if LTRAIN_TORCH_HAS_FUSED_OPTIMIZERS
namespace {
c10::optional<torch::Tensor> optional_tensor(const torch::Tensor& tensor) {
  return tensor.defined() ? c10::optional<torch::Tensor>(tensor) : c10::nullopt;
}
}  // namespace

void fused_sgd(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
               const std::vector<torch::Tensor>& momentum_buffers, double weight_decay, double momentum,
               const torch::Tensor& lr, bool nesterov, const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  // The buffers start at zero, so the "first step" branch (copy the gradient) is not needed.
  at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, /*dampening=*/0.0, nesterov,
                  /*maximize=*/false, /*is_first_step=*/false, optional_tensor(grad_scale), optional_tensor(found_inf));
}

void fused_adamw(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                 const std::vector<torch::Tensor>& exp_avgs, const std::vector<torch::Tensor>& exp_avg_sqs,
                 const std::vector<torch::Tensor>& steps, const torch::Tensor& lr, double beta1, double beta2,
                 double weight_decay, double eps, const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, beta1, beta2, weight_decay,
                    eps, /*amsgrad=*/false, /*maximize=*/false, optional_tensor(grad_scale), optional_tensor(found_inf));
}
#else
void fused_sgd(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
               double, double, const torch::Tensor&, bool, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("fused_sgd: this LibTorch has no fused optimizer kernels");
}
void fused_adamw(const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                 const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&, const torch::Tensor&, double,
                 double, double, double, const torch::Tensor&, const torch::Tensor&) {
  throw std::logic_error("fused_adamw: this LibTorch has no fused optimizer kernels");
}
#endif


}  // namespace ltrain::optim
