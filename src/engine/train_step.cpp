#include "ltrain/engine/train_step.h"

namespace ltrain::engine {

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing) {
  return torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(label_smoothing));
}

TrainStep::TrainStep(models::ResNet model, optim::Optimizer& optimizer, const config::RunConfig& config)
    : model_(std::move(model)), optimizer_(optimizer), label_smoothing_(config.loss.label_smoothing) {
  const torch::Device device = optimizer_.lr().device();
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  correct_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
}

void TrainStep::run(const data::Batch& batch) {
  const int64_t batch_size = batch.labels.size(0);
  optimizer_.zero_grad();
  const torch::Tensor logits = model_->forward(batch.images);  // [B,classes] float32
  const torch::Tensor loss = classification_loss(logits, batch.labels, label_smoothing_);
  loss.backward();
  optimizer_.step();
  torch::NoGradGuard no_grad;
  loss_sum_.add_(loss.detach() * static_cast<double>(batch_size));
  correct_.add_(logits.argmax(1).eq(batch.labels).sum());
  images_ += batch_size;
}

StepTotals TrainStep::take_totals() {
  StepTotals totals{loss_sum_.item<double>(), correct_.item<int64_t>(), images_};
  loss_sum_.zero_();
  correct_.zero_();
  images_ = 0;
  return totals;
}

}  // namespace ltrain::engine
