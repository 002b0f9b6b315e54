#include "ltrain/engine/evaluator.h"

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/precision.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"

namespace ltrain::engine {

Evaluator::Evaluator(models::ResNet model, const data::EvalLoader& loader, const config::RunConfig& config,
                     dist::Group* group)
    : model_(std::move(model)),
      loader_(loader),
      precision_(precision_plan(config.precision)),
      memory_format_(memory_format(config)),
      batch_size_(config.data.eval_batch_size),
      flip_average_(config.data.eval_flip_average),
      group_(group) {
  // One eager full batch first: the warm-up before the capture.
  const torch::Device device = model_->parameters().front().device();
  if (config.cuda_graph.eval) graph_.emplace(/*warmup_runs=*/1, static_images(config, precision_, device));
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  correct_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
}

void Evaluator::enqueue(const torch::Tensor& images, const torch::Tensor& labels) {
  torch::Tensor logits;  // [B,classes] float32
  {
    const amp::AutocastGuard autocast(images.device().type(), precision_.dtype, precision_.autocast);
    logits = model_->forward(images.contiguous(memory_format_)).to(torch::kFloat32);
    if (flip_average_) {
      // [B,3,H,W] mirrored along W.
      const torch::Tensor mirrored = images.flip({3}).contiguous(memory_format_);
      logits = 0.5 * (logits + model_->forward(mirrored).to(torch::kFloat32));
    }
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
  for (int64_t index = 0; index < loader_.num_batches(); ++index) {
    const data::Batch batch = loader_.batch(index);
    if (graph_ && batch.labels.size(0) == batch_size_) {
      graph_->run(batch, [&](const torch::Tensor& images, const torch::Tensor& labels) { enqueue(images, labels); });
    } else {
      enqueue(batch.images, batch.labels);  // no graph, or the smaller last batch
    }
  }
  model_->train(was_training);
  EvalResult result;
  result.images = loader_.size();
  if (group_) {
    group_->all_reduce_sum({loss_sum_}).wait();
    group_->all_reduce_sum({correct_}).wait();
    torch::Tensor images = torch::full({}, result.images, correct_.options());
    group_->all_reduce_sum({images}).wait();
    result.images = images.item<int64_t>();
  }
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
