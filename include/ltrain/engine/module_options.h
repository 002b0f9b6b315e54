#pragma once
// Each module's options from the run config: the one place that reads a config section into the
// options struct of the module it configures. The modules hold no defaults of their own; the
// config's sections are the one place of defaults, so a test that needs them builds a module's
// options from a default section here (eval_loader_options(config::DataSection{})).
#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/precision.h"
#include "ltrain/config/config.h"
#include "ltrain/data/cifar.h"
#include "ltrain/data/loader.h"
#include "ltrain/dist/group.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/optimizer.h"
#include "ltrain/optim/schedule.h"

namespace ltrain::engine {

/// The data source's options from the config's data section: the source, its folder, CIFAR-100's
/// label, the image size and the synthetic source's set sizes.
data::SourceOptions source_options(const config::DataSection& data);

/// The training loader's options from the config's data section: a batch is one optimizer step's
/// images, data.batch_size (a micro-batch) x optim.accumulation_steps.
data::TrainLoaderOptions train_loader_options(const config::RunConfig& config);

/// The evaluation loader's options from the config's data section.
data::EvalLoaderOptions eval_loader_options(const config::DataSection& data);

/// The network's options from the config's model section (all of it but model.channels_last and
/// model.init_from, which engine::build_model applies).
models::ResNetOptions resnet_options(const config::ModelSection& model);

/// The optimizer's options from the config's optim section (its update's keys: not optim.lr, which
/// the schedule starts from, nor the step's accumulation, clipping and weight average).
optim::OptimizerOptions optimizer_options(const config::OptimSection& optim);

/// The learning-rate schedule's options from the config's schedule section.
optim::ScheduleOptions schedule_options(const config::ScheduleSection& schedule);

/// The process group's options from the config's distributed section (distributed.backend and
/// distributed.timeout_s).
dist::GroupOptions group_options(const config::DistributedSection& distributed);

/// What precision.mode (and precision.tf32) turn on.
amp::PrecisionPlan precision_plan(const config::PrecisionSection& precision);

/// The GradScaler's options from the config's precision section: enabled with precision.mode fp16.
amp::GradScalerOptions grad_scaler_options(const config::PrecisionSection& precision);

}  // namespace ltrain::engine
