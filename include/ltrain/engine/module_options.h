#pragma once
// Each module's options from the run config: the one place that reads a config section into the
// options struct of the module it configures. The modules hold no defaults of their own; the
// config's sections are the one place of defaults, so a test that needs them builds a module's
// options from a default section here (eval_loader_options(config::DataSection{})).
#include "ltrain/config/config.h"
#include "ltrain/data/loader.h"
#include "ltrain/models/resnet.h"

namespace ltrain::engine {

/// The training loader's options from the config's data section: a batch is one optimizer step's
/// images, data.batch_size (a micro-batch) x optim.accumulation_steps.
data::TrainLoaderOptions train_loader_options(const config::RunConfig& config);

/// The evaluation loader's options from the config's data section.
data::EvalLoaderOptions eval_loader_options(const config::DataSection& data);

/// The network's options from the config's model section (all of it but model.channels_last and
/// model.init_from, which engine::build_model applies).
models::ResNetOptions resnet_options(const config::ModelSection& model);

}  // namespace ltrain::engine
