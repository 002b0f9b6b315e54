#include "ltrain/engine/evaluator.h"

#include "ltrain/amp/autocast.h"
#include "ltrain/amp/precision.h"
#include "ltrain/engine/setup.h"

namespace ltrain::engine {

EvalResult evaluate(models::ResNet& model, const data::EvalLoader& loader, const config::RunConfig& config) {
  const amp::PrecisionPlan precision = amp::plan_precision(config.precision);
  const torch::MemoryFormat format = memory_format(config);
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor loss_sum;  // [] float32 on the device
  torch::Tensor correct;   // [] int64 on the device
  for (int64_t index = 0; index < loader.num_batches(); ++index) {
    const data::Batch batch = loader.batch(index);
    torch::Tensor logits;  // [B,classes]
    {
      const amp::AutocastGuard autocast(batch.images.device().type(), precision.dtype, precision.autocast);
      logits = model->forward(batch.images.contiguous(format)).to(torch::kFloat32);
    }
    const torch::Tensor batch_loss = torch::nn::functional::cross_entropy(
        logits, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    const torch::Tensor batch_correct = logits.argmax(1).eq(batch.labels).sum();
    loss_sum = loss_sum.defined() ? loss_sum + batch_loss : batch_loss;
    correct = correct.defined() ? correct + batch_correct : batch_correct;
  }
  model->train(was_training);
  EvalResult result;
  result.images = loader.size();
  if (result.images == 0) return result;
  result.correct = correct.item<int64_t>();
  result.loss = loss_sum.item<double>() / static_cast<double>(result.images);
  result.accuracy = static_cast<double>(result.correct) / static_cast<double>(result.images);
  return result;
}

}  // namespace ltrain::engine
