#pragma once
// Test-set evaluation: every image once, sums kept on the device, one host sync at the end.
#include <cstdint>
#include <optional>

#include "ltrain/amp/precision.h"
#include "ltrain/config/config.h"
#include "ltrain/data/loader.h"
#include "ltrain/dist/group.h"
#include "ltrain/engine/batch_graph.h"
#include "ltrain/models/resnet.h"

namespace ltrain::engine {

struct EvalResult {
  double loss = 0.0;      ///< mean cross-entropy (no label smoothing)
  double accuracy = 0.0;  ///< top-1, fraction in [0, 1]
  int64_t correct = 0;
  int64_t images = 0;
};

/// Evaluates one model over one test loader, as often as asked. With cuda_graph.eval the forward
/// pass of a full batch is captured once (after one eager batch) and replayed for the others; a
/// last, smaller batch runs eagerly, so every image counts exactly once.
class Evaluator {
 public:
  /// With `group`, `loader` holds this rank's shard of the test set and the sums are added over
  /// the ranks: every rank gets the whole test set's result.
  Evaluator(models::ResNet model, const data::EvalLoader& loader, const config::RunConfig& config,
            dist::Group* group = nullptr);

  /// Runs the model in eval mode (BatchNorm running statistics) over every test batch, with the
  /// config's autocast and memory format (and data.eval_flip_average's mirrored second pass);
  /// restores the model's previous train/eval mode.
  EvalResult run();

 private:
  /// Adds the loss and hits of one batch to the device sums (no host sync).
  void enqueue(const torch::Tensor& images, const torch::Tensor& labels);

  models::ResNet model_;
  const data::EvalLoader& loader_;
  amp::PrecisionPlan precision_;
  torch::MemoryFormat memory_format_;
  int64_t batch_size_;  // data.eval_batch_size: the size of every batch but maybe the last
  bool flip_average_;   // data.eval_flip_average
  dist::Group* group_;
  torch::Tensor loss_sum_;  // [] float32 on the device
  torch::Tensor correct_;   // [] int64 on the device
  std::optional<BatchGraph> graph_;  // with cuda_graph.eval: the forward pass of a full batch
};

/// One evaluation without a graph: Evaluator(model, loader, config).run() with cuda_graph.eval off.
EvalResult evaluate(models::ResNet& model, const data::EvalLoader& loader, const config::RunConfig& config);

}  // namespace ltrain::engine
