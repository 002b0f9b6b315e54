#include "ltrain/engine/train_step.h"

#include <string>
#include <utility>

#include <spdlog/spdlog.h>

#include "ltrain/amp/autocast.h"
#include "ltrain/core/gpu.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"

namespace ltrain::engine {

torch::Tensor classification_loss(const torch::Tensor& logits, const torch::Tensor& labels, double label_smoothing,
                                  const ops::CrossEntropyBackends& backends) {
  return ops::cross_entropy(logits, labels, label_smoothing, backends);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& grads, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& grad : grads) norms.push_back(grad.norm(2).to(torch::kFloat32));
  const torch::Tensor total = torch::stack(norms).norm(2);
  // As torch: coefficient max_norm / (norm + 1e-6), never above 1, applied without a host read.
  const torch::Tensor coefficient = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
  for (const auto& grad : grads) grad.mul_(coefficient.to(grad.scalar_type()));
  return total;
}

TrainStep::TrainStep(models::ResNet model, optim::Optimizer& optimizer, amp::GradScaler& scaler,
                     const config::RunConfig& config, dist::Group* group)
    : model_(std::move(model)),
      optimizer_(optimizer),
      scaler_(scaler),
      precision_(precision_plan(config.precision)),
      memory_format_(memory_format(config)),
      accumulation_steps_(config.optim.accumulation_steps),
      clip_grad_norm_(config.optim.clip_grad_norm),
      label_smoothing_(config.loss.label_smoothing),
      loss_backends_{config.loss.ltrain_kernels},
      group_(group) {
  if (precision_.autocast) {
    std::vector<torch::Tensor> optimizer_order;  // the optimizer's parameters, group by group
    for (const optim::ParamGroup& param_group : optimizer_.groups())
      optimizer_order.insert(optimizer_order.end(), param_group.params.begin(), param_group.params.end());
    low_precision_weights_.emplace(*model_, precision_.dtype, std::move(optimizer_order));
    low_precision_weights_->set_copies_written_by_optimizer(
        optimizer_.write_low_precision_copies(low_precision_weights_->copies()));
  }
  low_precision_gradients_ = low_precision_weights_ && accumulation_steps_ == 1 && clip_grad_norm_ == 0.0 &&
                             group_ == nullptr && optimizer_.takes_low_precision_gradients();
  if (group_) {
    std::vector<dist::GradientSource> sources;
    for (const torch::Tensor& param : model_->parameters()) {
      const torch::Tensor copy = low_precision_weights_ ? low_precision_weights_->copy_of(param) : torch::Tensor();
      sources.push_back({param, copy.defined() ? copy : param});
    }
    const config::GradientDtype wire = config.distributed.gradient_dtype;
    reducer_ = std::make_unique<dist::GradientReducer>(
        *group_, std::move(sources), config.distributed.bucket_mb,
        wire == config::GradientDtype::bf16 ? torch::kBFloat16
                                            : (wire == config::GradientDtype::fp16 ? torch::kHalf : torch::kFloat32));
  }
  const torch::Device device = optimizer_.lr().device();
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  correct_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  if (config.cuda_graph.train)
    graph_.emplace(config.cuda_graph.warmup_steps, static_images(config, precision_, device));
  // The branch pays only inside a graph: eager steps are bound by the host issuing kernels.
  branch_setting_ = graph_ && device.is_cuda() ? config.cuda_graph.branches : config::StepBranches::off;
  if (config.cuda_graph.updates_in_backward) {
    const std::string reason = reason_updates_stay_at_end();
    updates_in_backward_ = reason.empty();
    if (!updates_in_backward_)
      spdlog::warn("cuda_graph.updates_in_backward: {}; every update stays at the step's end", reason);
  }
  convolution_backends_before_ = model_->convolution_backends();
}

TrainStep::~TrainStep() {
  model_->set_convolution_backends(convolution_backends_before_);
  model_->set_forward_counts_batches(true);
}

std::string TrainStep::reason_updates_stay_at_end() const {
  // The update reads the gradient the backward pass left, as the step's end would: nothing may
  // read or change it in between (the scaler's check, accumulation, clipping, an all-reduce, a
  // float32 copy), and the branch it runs on exists only in a captured step.
  if (branch_setting_ == config::StepBranches::off) return "it needs cuda_graph.train and cuda_graph.branches";
  if (scaler_.enabled()) return "the GradScaler (precision.mode fp16) checks every gradient before any update";
  if (accumulation_steps_ > 1) return "optim.accumulation_steps adds up gradients over micro-batches";
  if (clip_grad_norm_ > 0.0) return "optim.clip_grad_norm reads every gradient before any update";
  if (group_ != nullptr) return "a data-parallel step averages the gradients over the processes first";
  // What reads the gradients as the backward pass leaves them is ltrain's SGD kernel alone.
  if (!optimizer_.takes_low_precision_gradients() || (low_precision_weights_ && !low_precision_gradients_))
    return "it needs ltrain's SGD kernel (optim.name sgd, optim.fused, a CUDA build)";
  return "";
}

int64_t TrainStep::first_stage_positions(const torch::Tensor& images) const {
  const int64_t micro_batch = images.size(0) / accumulation_steps_;
  return micro_batch * model_->first_stage_side(images.size(2)) * model_->first_stage_side(images.size(3));
}

bool TrainStep::branches_pay(const torch::Tensor& images) const {
  // The largest first stage at which the branch measured faster, the recipes' 512 images at 16x16
  // (docs/benchmarks/branches.md); larger maps fill the GPU from one stream.
  constexpr int64_t kMostBranchedPositions = 512 * 16 * 16;
  return first_stage_positions(images) <= kMostBranchedPositions;
}

bool TrainStep::critical_path_first_pays(const torch::Tensor& images) const {
  // Measured faster at the guides' 256 images at 8x8, no slower at 1024, slower at the recipes'
  // 512 at 16x16 (docs/benchmarks/branch-priority.md).
  constexpr int64_t kMostPrioritizedPositions = 1024 * 8 * 8;
  return first_stage_positions(images) <= kMostPrioritizedPositions;
}

void TrainStep::choose_branches(const torch::Tensor& images) {
  branch_shape_ = images.sizes().vec();
  branches_ = branch_setting_ == config::StepBranches::on ||
              (branch_setting_ == config::StepBranches::automatic && branches_pay(images));
  ops::ConvolutionBackends backends = convolution_backends_before_;
  backends.weight_gradient_branch = branches_;
  // The reducer's hooks copy each gradient into its bucket inside the backward pass.
  backends.join_each_weight_gradient = reducer_ != nullptr;
  backends.after_weight_gradient = nullptr;
  if (branches_ && updates_in_backward_) {
    // On the branch, after the weight's last reader: the optimizer's kernel writes the weight
    // (and its fp16/bf16 copy) in place.
    backends.after_weight_gradient = [this](const torch::Tensor& weight, const torch::Tensor& grad_weight) {
      if (optimizer_.step_parameter(weight, grad_weight, scaler_.step_state(/*gradients_unscaled=*/false)))
        ++parameters_updated_in_backward_;
    };
  }
  model_->set_convolution_backends(backends);
  model_->set_forward_counts_batches(!branches_);  // with the branch, counted there (enqueue)
  // The critical path above the branch: where both wait for SMs, its kernels go first. Not in a
  // data-parallel step, whose captured all-reduces keep the priority of the communicator's stream:
  // below the compute, they could wait behind it on one rank while the others spin (not measured).
  const bool critical_path_first = branches_ && reducer_ == nullptr && critical_path_first_pays(images);
  graph_->set_capture_priority(critical_path_first ? gpu::StreamPriority::high : gpu::StreamPriority::normal);
}

void TrainStep::run(const data::Batch& batch) {
  images_ += batch.labels.size(0);
  if (!graph_) {
    enqueue(batch.images, batch.labels);
    return;
  }
  if (batch.images.sizes() != torch::IntArrayRef(branch_shape_)) choose_branches(batch.images);
  // Where the optimizer writes the copies, the capture left the weights' cast out; anything that
  // changed the weights since (a checkpoint load, say) needs it now.
  if (low_precision_weights_ && low_precision_weights_->copies_written_by_optimizer())
    low_precision_weights_->refresh();
  graph_->run(batch, [&](const torch::Tensor& images, const torch::Tensor& labels) { enqueue(images, labels); });
}

void TrainStep::enqueue(const torch::Tensor& batch_images, const torch::Tensor& batch_labels) {
  const std::vector<torch::Tensor> images = batch_images.chunk(accumulation_steps_);  // K x [B,3,32,32] float32
  const std::vector<torch::Tensor> labels = batch_labels.chunk(accumulation_steps_);  // K x [B] int64
  optimizer_.zero_grad(/*set_to_none=*/true);
  parameters_updated_in_backward_ = 0;
  std::optional<amp::LowPrecisionWeights::InUse> low_precision;  // over every forward and backward pass
  if (low_precision_weights_) low_precision.emplace(*low_precision_weights_);
  for (size_t micro = 0; micro < images.size(); ++micro) {
    torch::Tensor logits, loss;
    {
      const amp::AutocastGuard autocast(images[micro].device().type(), precision_.dtype, precision_.autocast);
      logits = model_->forward(images[micro].contiguous(memory_format_));  // [B,classes], fp16/bf16 under autocast
      loss = classification_loss(logits, labels[micro], label_smoothing_, loss_backends_);  // [] float32
    }
    const auto add_to_totals = [&] {
      torch::NoGradGuard no_grad;
      loss_sum_.add_(loss.detach().to(torch::kFloat32) * static_cast<double>(labels[micro].size(0)));
      correct_.add_(logits.argmax(1).eq(labels[micro]).sum());
    };
    // The totals read the forward pass's outputs alone, and the BatchNorm counters nothing: on the
    // branch, beside the backward pass (joined with the weight gradients).
    if (branches_) {
      gpu::fork_to_branch(
          images[micro].device(),
          [&] {
            add_to_totals();
            model_->count_training_batch();
          },
          {loss, logits, labels[micro]});
    }
    // Each micro-batch's loss is divided by K: the gradients sum to those of the mean loss (with
    // one micro-batch, no division: x / 1 is x, and it would cost a kernel each way).
    const torch::Tensor micro_loss = accumulation_steps_ == 1 ? loss : loss / static_cast<double>(accumulation_steps_);
    const bool last_micro_batch = micro + 1 == images.size();
    if (reducer_ && last_micro_batch) reducer_->arm(/*accumulated=*/micro > 0);
    scaler_.backward(micro_loss);
    if (branches_) gpu::join_branch(images[micro].device());  // every weight gradient is complete
    if (low_precision_weights_ && !low_precision_gradients_)
      low_precision_weights_->collect_gradients(/*first_micro_batch=*/micro == 0);
    if (reducer_ && last_micro_batch) reducer_->finish();  // every rank now holds the mean gradients
    if (!branches_) add_to_totals();
  }
  low_precision.reset();

  const std::vector<torch::Tensor> grads =
      low_precision_gradients_ ? low_precision_weights_->take_copy_gradients() : optimizer_.gradients();
  if (clip_grad_norm_ > 0.0) {
    scaler_.unscale(grads);  // clipping needs the true gradients
    clip_grad_norm(grads, clip_grad_norm_);
    optimizer_.step(scaler_.step_state(/*gradients_unscaled=*/true));
  } else if (optimizer_.fused()) {
    scaler_.check(grads);  // the fused kernel divides by the scale itself
    optimizer_.step(scaler_.step_state(/*gradients_unscaled=*/false), grads);
  } else {
    scaler_.unscale(grads);
    optimizer_.step(scaler_.step_state(/*gradients_unscaled=*/true));
  }
  if (low_precision_weights_) low_precision_weights_->note_copies_written();  // where the optimizer wrote them
  scaler_.update();
}

StepTotals TrainStep::take_totals() {
  if (group_) {
    group_->all_reduce_sum({loss_sum_}).wait();
    group_->all_reduce_sum({correct_}).wait();
    images_ *= group_->size();
  }
  StepTotals totals;
  totals.loss_sum = loss_sum_.item<double>();
  totals.correct = correct_.item<int64_t>();
  totals.images = images_;
  if (scaler_.enabled()) {
    totals.loss_scale = scaler_.scale().item<double>();
    totals.skipped_steps = scaler_.skipped_steps().item<int64_t>();
    totals.consecutive_skips = scaler_.consecutive_skips().item<int64_t>();
  }
  loss_sum_.zero_();
  correct_.zero_();
  images_ = 0;
  return totals;
}

StepTotals TrainStep::peek_totals() const {
  StepTotals totals;
  totals.loss_sum = loss_sum_.item<double>();
  totals.correct = correct_.item<int64_t>();
  totals.images = images_;
  return totals;
}

}  // namespace ltrain::engine
