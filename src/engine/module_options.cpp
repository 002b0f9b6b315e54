#include "ltrain/engine/module_options.h"

namespace ltrain::engine {

namespace {

data::NormalizeOptions normalize_options(const config::DataSection& data) {
  return {data.normalize, data.mean, data.std};
}

data::ProgressiveResize progressive_resize(const config::DataSection& data) {
  if (data.progressive_start_size == 0 || data.progressive_epochs == 0) return {0, 0, data.progressive_size_step};
  return {data.progressive_start_size, data.progressive_epochs, data.progressive_size_step};
}

}  // namespace

data::SourceOptions source_options(const config::DataSection& data) {
  data::SourceOptions options{};
  options.source = data.source;
  options.root = data.root;
  options.cifar100_labels = data.cifar100_labels;
  options.image_size = data.image_size;
  options.synthetic_train_size = data.synthetic_train_size;
  options.synthetic_test_size = data.synthetic_test_size;
  return options;
}

data::TrainLoaderOptions train_loader_options(const config::RunConfig& config) {
  const config::DataSection& data = config.data;
  data::TrainLoaderOptions options{};
  options.images_per_step = data.batch_size * config.optim.accumulation_steps;
  options.shuffle = data.shuffle;
  options.random_crop = data.random_crop;
  options.crop_padding = data.crop_padding;
  options.horizontal_flip = data.horizontal_flip;
  options.cutout = data.cutout;
  options.progressive = progressive_resize(data);
  options.normalize = normalize_options(data);
  return options;
}

data::EvalLoaderOptions eval_loader_options(const config::DataSection& data) {
  return {data.eval_batch_size, normalize_options(data)};
}

models::ResNetOptions resnet_options(const config::ModelSection& model) {
  models::ResNetOptions options{};
  options.arch = model.arch;
  options.stem = model.stem;
  options.num_classes = model.num_classes;
  options.width = model.width;
  options.zero_init_residual = model.zero_init_residual;
  options.checkpoint_segments = model.checkpoint_segments;
  options.ltrain_batch_norm = model.ltrain_batch_norm;
  options.cudnn_batch_norm = model.cudnn_batch_norm;
  options.ltrain_max_pool = model.ltrain_max_pool;
  options.fused_conv = model.fused_conv;
  return options;
}

optim::OptimizerOptions optimizer_options(const config::OptimSection& optim) {
  optim::OptimizerOptions options{};
  options.name = optim.name;
  options.momentum = optim.momentum;
  options.nesterov = optim.nesterov;
  options.weight_decay = optim.weight_decay;
  options.no_decay_norm_and_bias = optim.no_decay_norm_and_bias;
  options.betas = {optim.betas.at(0), optim.betas.at(1)};  // two numbers: config/validate checks it
  options.eps = optim.eps;
  options.fused = optim.fused;
  return options;
}

optim::ScheduleOptions schedule_options(const config::ScheduleSection& schedule) {
  optim::ScheduleOptions options{};
  options.name = schedule.name;
  options.warmup_epochs = schedule.warmup_epochs;
  options.warmup_start_factor = schedule.warmup_start_factor;
  options.milestones = schedule.milestones;
  options.gamma = schedule.gamma;
  options.min_lr = schedule.min_lr;
  options.pct_start = schedule.pct_start;
  options.div_factor = schedule.div_factor;
  options.final_div_factor = schedule.final_div_factor;
  return options;
}

dist::GroupOptions group_options(const config::DistributedSection& distributed) {
  dist::GroupOptions options{};
  options.backend = distributed.backend;
  options.timeout_s = distributed.timeout_s;
  return options;
}

amp::PrecisionPlan precision_plan(const config::PrecisionSection& precision) {
  amp::PrecisionPlan plan;
  plan.tf32 = precision.tf32 || precision.mode == config::PrecisionMode::tf32;
  if (precision.mode == config::PrecisionMode::fp16) {
    plan.autocast = true;
    plan.dtype = torch::kFloat16;
    plan.grad_scaler = true;
  } else if (precision.mode == config::PrecisionMode::bf16) {
    plan.autocast = true;
    plan.dtype = torch::kBFloat16;
  }
  return plan;
}

amp::GradScalerOptions grad_scaler_options(const config::PrecisionSection& precision) {
  amp::GradScalerOptions options{};
  options.enabled = precision_plan(precision).grad_scaler;
  options.init_scale = precision.loss_scale_init;
  options.growth_factor = precision.loss_scale_growth_factor;
  options.backoff_factor = precision.loss_scale_backoff_factor;
  options.growth_interval = precision.loss_scale_growth_interval;
  return options;
}

}  // namespace ltrain::engine
