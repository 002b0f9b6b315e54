#include "ltrain/engine/evaluator.h"

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/precision.h"
#include "ltrain/engine/setup.h"

namespace ltrain::engine {

Evaluator::Evaluator(models::ResNet model, const data::EvalLoader& loader, const config::RunConfig& config)
    : model_(std::move(model)), loader_(loader), config_(config), use_graph_(config.cuda_graph.eval) {
  const torch::Device device = model_->parameters().front().device();
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  correct_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
}

void Evaluator::enqueue(const torch::Tensor& images, const torch::Tensor& labels) {
  const amp::PrecisionPlan precision = amp::plan_precision(config_.precision);
  torch::Tensor logits;  // [B,classes] float32
  {
    const amp::AutocastGuard autocast(images.device().type(), precision.dtype, precision.autocast);
    logits = model_->forward(images.contiguous(memory_format(config_))).to(torch::kFloat32);
  }
  loss_sum_.add_(torch::nn::functional::cross_entropy(
      logits, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
  correct_.add_(logits.argmax(1).eq(labels).sum());
}

EvalResult Evaluator::run() {
  const bool was_training = model_->is_training();
  model_->eval();
  torch::NoGradGuard no_grad;
  loss_sum_.zero_();
  correct_.zero_();
  const int64_t batch_size = config_.data.eval_batch_size;
  for (int64_t index = 0; index < loader_.num_batches(); ++index) {
    const data::Batch batch = loader_.batch(index);
    const bool full = batch.labels.size(0) == batch_size;
    if (!use_graph_ || !full) {
      enqueue(batch.images, batch.labels);
    } else if (!graph_.captured() && index == 0) {
      // The warm-up PyTorch asks for before a capture (cuDNN picks its algorithms here).
      gpu::run_on_side_stream(batch.images.device(), [&] { enqueue(batch.images, batch.labels); });
    } else {
      if (!graph_.captured())
        graph_.capture(batch, memory_format(config_), [&](const torch::Tensor& images, const torch::Tensor& labels) {
          enqueue(images, labels);
        });
      graph_.replay(batch);
    }
  }
  model_->train(was_training);
  EvalResult result;
  result.images = loader_.size();
  if (result.images == 0) return result;
  result.correct = correct_.item<int64_t>();
  result.loss = loss_sum_.item<double>() / static_cast<double>(result.images);
  result.accuracy = static_cast<double>(result.correct) / static_cast<double>(result.images);
  return result;
}

EvalResult evaluate(models::ResNet& model, const data::EvalLoader& loader, const config::RunConfig& config) {
  config::RunConfig eager = config;
  eager.cuda_graph.eval = false;
  return Evaluator(model, loader, eager).run();
}

}  // namespace ltrain::engine
