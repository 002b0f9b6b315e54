#pragma once
// One optimizer step over a batch, with no host sync: forward and loss under autocast (fp16/bf16),
// scaled backward (fp16), accumulation over micro-batches, unscale/clip, the optimizer step (skipped
// on the device after inf/NaN gradients) and the scaler update. Loss, accuracy, skipped steps and
// the scale are kept on the device and read only when the loop asks (at log intervals).
// With cuda_graph.train the step's device work is captured once as a CUDA graph and replayed; with
// cuda_graph.branches too, each convolution's weight gradient runs on a second stream inside it, and
// with cuda_graph.updates_in_backward as well, that weight's SGD update after it there.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/low_precision_weights.h"
#include "ltrain/amp/precision.h"
#include "ltrain/config/config.h"
#include "ltrain/data/loader.h"
#include "ltrain/dist/grad_reducer.h"
#include "ltrain/engine/batch_graph.h"
#include "ltrain/models/resnet.h"
#include "ltrain/ops/convolution.h"
#include "ltrain/ops/cross_entropy.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::engine {

/// Sums over the steps since the last read, and the scaler's state at the read.
struct StepTotals {
  double loss_sum = 0.0;  ///< sum over images of the per-image training loss
  int64_t correct = 0;    ///< top-1 hits on the (augmented) training batches
  int64_t images = 0;
  double loss_scale = 1.0;         ///< the GradScaler's scale (1 without one)
  int64_t skipped_steps = 0;       ///< steps skipped for inf/NaN gradients since the run began
  int64_t consecutive_skips = 0;   ///< skipped steps in a row up to now
  double mean_loss() const { return images > 0 ? loss_sum / static_cast<double>(images) : 0.0; }
  double accuracy() const { return images > 0 ? static_cast<double>(correct) / static_cast<double>(images) : 0.0; }
};

class TrainStep {
 public:
  /// With `group` (a data-parallel run) gradients are averaged over its ranks in the backward
  /// pass and the totals are summed over them.
  TrainStep(models::ResNet model, optim::Optimizer& optimizer, amp::GradScaler& scaler, const config::RunConfig& config,
            dist::Group* group = nullptr);
  /// Gives the model back its convolution backends as they were before the step (no branch).
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  /// One optimizer step over `batch`: [K*B] images as K = optim.accumulation_steps micro-batches
  /// of B. Enqueues work only. With cuda_graph.train the first cuda_graph.warmup_steps calls run
  /// eagerly on a side stream, the next one captures the step, and every call from then on
  /// copies `batch` into the graph's input buffers and replays it (every batch the same shape).
  void run(const data::Batch& batch);

  /// True once the step has been captured as a CUDA graph.
  bool graphed() const { return graph_ && graph_->captured(); }
  /// The priority of the stream the step's graph is captured on (normal without a graph).
  gpu::StreamPriority capture_priority() const {
    return graph_ ? graph_->capture_priority() : gpu::StreamPriority::normal;
  }

  /// How many parameters the last step (as enqueued or captured) updated inside its backward
  /// pass (cuda_graph.updates_in_backward); the rest were updated at its end.
  int64_t parameters_updated_in_backward() const { return parameters_updated_in_backward_; }

  /// Reads and resets the device-side sums (over every rank in a data-parallel run): one host sync.
  StepTotals take_totals();

  /// This process's sums since the last take_totals, left in place (no collective, the scaler's
  /// state not read): one host sync, for a progress line before the first log interval.
  StepTotals peek_totals() const;

 private:
  /// The step's device work on `images` [K*B,3,32,32] float32 and `labels` [K*B] int64, with no
  /// host sync and no host state that changes between steps (it may be captured once and replayed).
  void enqueue(const torch::Tensor& images, const torch::Tensor& labels);
  /// Whether the weight gradients of a step over `images` [K*B,3,H,W] run on the branch where
  /// cuda_graph.branches is auto: where the first stage's feature maps of a micro-batch hold few
  /// positions (B x H' x W'), whose kernels leave SMs idle on one stream.
  bool branches_pay(const torch::Tensor& images) const;
  /// Whether a step with the branch over `images` is captured with its critical path above the
  /// branch (gpu::StreamPriority::high): where the first stage holds few positions.
  bool critical_path_first_pays(const torch::Tensor& images) const;
  /// Positions of the first stage's feature maps in a micro-batch of `images` [K*B,3,H,W]: B x H' x W'.
  int64_t first_stage_positions(const torch::Tensor& images) const;
  /// Turns the branch on or off for the graph of `images`' shape (before its warm-up steps).
  void choose_branches(const torch::Tensor& images);
  /// Why cuda_graph.updates_in_backward cannot apply to this step ("" where it can).
  std::string reason_updates_stay_at_end() const;

  models::ResNet model_;
  optim::Optimizer& optimizer_;
  amp::GradScaler& scaler_;
  amp::PrecisionPlan precision_;
  torch::MemoryFormat memory_format_;
  int64_t accumulation_steps_;
  double clip_grad_norm_;
  double label_smoothing_;
  ops::CrossEntropyBackends loss_backends_;  // loss.ltrain_kernels
  std::optional<amp::LowPrecisionWeights> low_precision_weights_;  // with autocast (fp16/bf16)
  // With autocast, the optimizer reads the copies' fp16/bf16 gradients as they are, with no
  // float32 gradients, when it can and nothing else needs float32 ones (accumulation, clipping,
  // data-parallel averaging).
  bool low_precision_gradients_ = false;
  torch::Tensor loss_sum_;  // [] float32 on the device
  torch::Tensor correct_;   // [] int64 on the device
  int64_t images_ = 0;
  std::optional<BatchGraph> graph_;  // with cuda_graph.train
  // With cuda_graph.branches on for the current batch shape (a graph on CUDA): the model's
  // convolutions queue their weight gradients on the step's branch stream, which each backward
  // pass ends by joining; where the first stage is small the graph is captured on a stream of high
  // priority, above the branch.
  config::StepBranches branch_setting_;
  bool branches_ = false;
  std::vector<int64_t> branch_shape_;  // the batch shape branches_ was chosen for
  // cuda_graph.updates_in_backward, where the step's gradients go to the optimizer as the
  // backward pass leaves them: with the branch, each convolution's weight is updated on it.
  bool updates_in_backward_ = false;
  int64_t parameters_updated_in_backward_ = 0;  // by the last enqueue
  ops::ConvolutionBackends convolution_backends_before_;
  dist::Group* group_;
  std::unique_ptr<dist::GradientReducer> reducer_;  // with a group
};

/// Cross-entropy (mean over the batch) with label smoothing, as torch.nn.CrossEntropyLoss, on the
/// first of `backends` that takes it (ops::cross_entropy).
torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing,
                                  const ops::CrossEntropyBackends& backends = {});

/// torch.nn.utils.clip_grad_norm_: scales `grads` in place so that their global L2 norm is at most
/// `max_norm`; returns the norm before clipping ([] float32, on the device, no sync).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& grads, double max_norm);

}  // namespace ltrain::engine
