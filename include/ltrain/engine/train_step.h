#pragma once
// One training step over a batch, with no host sync: the loss and accuracy are summed on the
// device and read only when the loop asks (at log intervals).
#include <cstdint>

#include <torch/torch.h>

#include "ltrain/config/config.h"
#include "ltrain/data/loader.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

/// Sums over the steps since the last read.
struct StepTotals {
  double loss_sum = 0.0;  ///< sum over images of the per-image training loss
  int64_t correct = 0;    ///< top-1 hits on the (augmented) training batches
  int64_t images = 0;
  double mean_loss() const { return images > 0 ? loss_sum / static_cast<double>(images) : 0.0; }
  double accuracy() const { return images > 0 ? static_cast<double>(correct) / static_cast<double>(images) : 0.0; }
};

class TrainStep {
 public:
  TrainStep(models::ResNet model, optim::Optimizer& optimizer, const config::RunConfig& config);

  /// Forward, loss, backward and optimizer update on `batch`; enqueues work only.
  void run(const data::Batch& batch);

  /// Reads and resets the device-side sums: one host sync.
  StepTotals take_totals();

 private:
  models::ResNet model_;
  optim::Optimizer& optimizer_;
  double label_smoothing_;
  torch::Tensor loss_sum_;  // [] float32 on the device
  torch::Tensor correct_;   // [] int64 on the device
  int64_t images_ = 0;
};

/// Cross-entropy (mean over the batch) with label smoothing, as torch.nn.CrossEntropyLoss.
torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing);

}  // namespace ltrain::engine
