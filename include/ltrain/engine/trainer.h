#pragma once
// Training a run: the loop reads top to bottom in src/engine/trainer.cpp; where a run starts and
// what a checkpoint carries (resume.cpp), early stopping (early_stopping.cpp) and what a run
// reports beside the loop, the dry run's plan included (run_report.cpp), lie beside it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "ltrain/config/load.h"

namespace ltrain::engine {

struct TrainResult {
  std::filesystem::path run_dir;
  int64_t epochs = 0;            ///< epochs completed
  int64_t steps = 0;             ///< optimizer steps completed
  double final_test_accuracy = 0.0;
  double final_test_loss = 0.0;
  double best_test_accuracy = 0.0;
  int64_t best_epoch = 0;
  /// Time in training steps (no evaluation, no checkpoints), over the whole run: a resumed run's
  /// earlier processes too, up to the checkpoint it resumed from.
  double train_seconds = 0.0;
  /// The whole run after set-up, the same way (earlier processes up to that checkpoint).
  double wall_seconds = 0.0;
  /// The step this process started at (0: a fresh start; else the checkpoint's it resumed from),
  /// and this process's own share of the two times above.
  int64_t resumed_at_step = 0;
  double process_train_seconds = 0.0;
  double process_wall_seconds = 0.0;
  /// Set-up before the first step, from engine::train's start: data read and moved to the device,
  /// model, optimizer, run directory. cuDNN's autotuning and the graph captures happen in the
  /// first steps, so they are part of train_seconds.
  double startup_seconds = 0.0;
  double images_per_second = 0.0;  ///< training images / train_seconds
  /// run.early_stop_metric ended the run before run.epochs (`epochs` says after which).
  bool stopped_early = false;
  /// The device's peak bytes in tensors and held by the caching allocator (CUDA graph pools
  /// included), since the process started; -1 on the CPU, which does not count them (summary.json:
  /// null).
  int64_t peak_memory_bytes = -1;
  int64_t peak_reserved_bytes = -1;
};

/// Observers of a run (tests use them to stop a run at a chosen step).
struct TrainHooks {
  std::function<void()> after_setup;             ///< set-up done, before anything is written
  std::function<void(int64_t step)> after_step;  ///< after each optimizer step is enqueued
  std::function<void(int64_t epoch)> before_evaluation;  ///< as an epoch's evaluation begins
};

/// A run as `ltrain train --dry-run` reports it.
struct RunPlan {
  std::string device;
  int64_t parameters = 0;
  int64_t train_images = 0;
  int64_t test_images = 0;
  int64_t images_per_step = 0;  ///< data.batch_size x optim.accumulation_steps
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t epochs = 0;
  std::filesystem::path resume_from;  ///< the checkpoint checkpoint.resume continues from ("": a fresh start)
  int64_t resume_step = 0;
};

/// What this machine must offer the config, checked without building a run: the device run.device
/// names, its precision and CUDA graph settings there, run.threads. ConfigError naming the key (as
/// resolve_device and check_threads say it), what train() would throw at start for these.
void check_device_support(const config::LoadedConfig& loaded);

/// Sets up what train() sets up before it writes anything, as it does (the device, the data read
/// and checked, the loaders, the model with model.init_from, the optimizer; checkpoint.resume's
/// checkpoint read and checked against the config), in one process, and reports it. Writes
/// nothing; throws what train() would throw at start.
RunPlan plan_run(const config::LoadedConfig& loaded);

/// The plan as one line: model, parameters, data sizes, steps, device.
std::string to_text(const config::RunConfig& config, const RunPlan& plan);

/// Trains as `loaded` says, writing logs, metrics, checkpoints and summary.json into a new run
/// directory, or continuing one (checkpoint.resume) to the steps this config runs (run.epochs,
/// run.max_steps: raised since the checkpoint, the run goes on to them; below its step, a
/// ConfigError before anything is written; at its step, after that step's evaluation, nothing is
/// trained: one line, and the summary written where it is missing). SIGINT/SIGTERM
/// (interrupt::StopRequests) during set-up throw Interrupted before anything is written; during
/// training, and during an evaluation (the last one too), they finish the step or the evaluation,
/// write a checkpoint and throw Interrupted. A JSON console (log::use_json_console) that refuses a
/// write stops the run the same way, with a RunError (exit code 4). Throws ConfigError, DataError or
/// RunError for the user to act on; a file that cannot be written (files::WriteError) stops the
/// run at once.
TrainResult train(const config::LoadedConfig& loaded, const TrainHooks& hooks = {});

}  // namespace ltrain::engine
