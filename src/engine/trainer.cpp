#include "ltrain/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/amp/precision.h"
#include "ltrain/core/files.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/log.h"
#include "ltrain/core/progress.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/dist/group.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/evaluator.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/engine/weight_average.h"
#include "ltrain/io/run_files.h"
#include "ltrain/optim/schedule.h"

namespace ltrain::engine {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool due(int64_t epoch, int64_t every, bool last) { return last || (every > 0 && epoch % every == 0); }

/// Out-of-memory as a user error with what to try, as the GPU guides advise.
RunError out_of_memory_error(const config::RunConfig& config, const std::exception& error) {
  return RunError(fmt::format("out of memory with data.batch_size {} ({}): lower data.batch_size, or use a smaller "
                              "model.arch",
                              config.data.batch_size, compat::first_line(error.what())));
}

/// Stops the run (RunError, exit code 4) on a non-finite loss, or with fp16 on too many skipped
/// steps in a row; says what to try. Checkpoints already written stay as they are.
void check_numerics(const config::RunConfig& config, const StepTotals& totals, int64_t step, int64_t epoch,
                    const fs::path& checkpoint_dir) {
  if (amp::plan_precision(config.precision).grad_scaler) {
    if (totals.consecutive_skips > config.precision.max_consecutive_skipped_steps)
      throw RunError(fmt::format("fp16: the last {} steps up to step {} (epoch {}) had inf/NaN gradients and were "
                                 "skipped (loss scale now {:g}): lower optim.lr, set optim.clip_grad_norm, or use "
                                 "precision.mode \"bf16\"; checkpoints already in {} are intact",
                                 totals.consecutive_skips, step, epoch, totals.loss_scale, checkpoint_dir.string()));
    return;
  }
  if (!std::isfinite(totals.mean_loss()))
    throw RunError(fmt::format("the training loss became {} by step {} (epoch {}): lower optim.lr (now {}), add "
                               "schedule.warmup_epochs, or check the data; checkpoints already in {} are intact",
                               totals.mean_loss(), step, epoch, config.optim.lr, checkpoint_dir.string()));
}

nlohmann::json result_json(const TrainResult& r) {
  return {{"run_dir", r.run_dir.string()},
          {"epochs", r.epochs},
          {"steps", r.steps},
          {"final_test_accuracy", r.final_test_accuracy},
          {"final_test_loss", r.final_test_loss},
          {"best_test_accuracy", r.best_test_accuracy},
          {"best_epoch", r.best_epoch},
          {"train_seconds", r.train_seconds},
          {"wall_seconds", r.wall_seconds},
          {"images_per_second", r.images_per_second},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes}};
}

/// What the loop accumulates beyond the model and optimizer; a checkpoint carries it (as JSON,
/// whose numbers round-trip exactly) so that a resumed run continues the same sums.
struct RunningSums {
  StepTotals epoch;            // loss, hits and images of the epoch in progress
  double epoch_seconds = 0.0;  // its time in training steps
  double train_seconds = 0.0;  // time in training steps of the epochs before it
  double final_test_accuracy = 0.0;
  double final_test_loss = 0.0;
  double best_test_accuracy = 0.0;
  int64_t best_epoch = 0;
  double best_metric = 0.0;  // checkpoint.best_metric's value in best.ltc
  bool has_best_metric = false;
  double last_scale = 0.0;  // the GradScaler's scale and skipped steps at the last read (fp16)
  int64_t skipped_steps = 0;

  nlohmann::json to_json() const {
    return {{"epoch_loss_sum", number(epoch.loss_sum)}, {"epoch_correct", epoch.correct},
            {"epoch_images", epoch.images},             {"epoch_seconds", number(epoch_seconds)},
            {"train_seconds", number(train_seconds)},   {"final_test_accuracy", number(final_test_accuracy)},
            {"final_test_loss", number(final_test_loss)}, {"best_test_accuracy", number(best_test_accuracy)},
            {"best_epoch", best_epoch},                 {"best_metric", number(best_metric)},
            {"has_best_metric", has_best_metric},       {"last_scale", number(last_scale)},
            {"skipped_steps", skipped_steps}};
  }
  static RunningSums from_json(const nlohmann::json& j) {
    RunningSums s;
    s.epoch.loss_sum = number(j, "epoch_loss_sum");
    s.epoch.correct = j.value("epoch_correct", int64_t{0});
    s.epoch.images = j.value("epoch_images", int64_t{0});
    s.epoch_seconds = number(j, "epoch_seconds");
    s.train_seconds = number(j, "train_seconds");
    s.final_test_accuracy = number(j, "final_test_accuracy");
    s.final_test_loss = number(j, "final_test_loss");
    s.best_test_accuracy = number(j, "best_test_accuracy");
    s.best_epoch = j.value("best_epoch", int64_t{0});
    s.best_metric = number(j, "best_metric");
    s.has_best_metric = j.value("has_best_metric", false);
    s.last_scale = number(j, "last_scale");
    s.skipped_steps = j.value("skipped_steps", int64_t{0});
    return s;
  }

 private:
  // JSON has no inf or NaN (a diverged run's test loss can be either): they travel as strings.
  static nlohmann::json number(double value) {
    if (std::isfinite(value)) return value;
    return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
  }
  static double number(const nlohmann::json& j, const char* key) {
    const nlohmann::json value = j.value(key, nlohmann::json(0.0));
    if (value.is_number()) return value.get<double>();
    const std::string text = value.is_string() ? value.get<std::string>() : "nan";
    if (text == "inf") return std::numeric_limits<double>::infinity();
    if (text == "-inf") return -std::numeric_limits<double>::infinity();
    return std::numeric_limits<double>::quiet_NaN();
  }
};

/// Where a run starts: its directory and, when it resumes, the checkpoint it resumes from.
struct StartPoint {
  fs::path run_dir;  // empty: a new one under run.out_dir
  std::optional<FoundCheckpoint> resume;
};

/// checkpoint.resume -> the run directory and checkpoint to continue from. DataError for a
/// checkpoint that cannot be resumed (named, with why); nothing is created here.
StartPoint choose_start(const config::LoadedConfig& loaded) {
  const config::RunConfig& config = loaded.config;
  const std::string& resume = config.checkpoint.resume;
  StartPoint start;
  if (resume == "none") return start;
  if (resume == "auto") {
    start.run_dir = fs::path(config.run.out_dir) / config.run.name;
    start.resume = newest_valid_checkpoint(start.run_dir / "checkpoints");
  } else {
    const fs::path file = resume;
    if (!fs::is_regular_file(file))
      throw config::config_error(loaded, "checkpoint.resume",
                                 "no such checkpoint file; use \"auto\", \"none\" or the path of a .ltc file");
    start.resume = FoundCheckpoint{file, read_checkpoint(file)};
    // A checkpoint inside a run directory continues that run's logs and metrics.
    const fs::path folder = fs::absolute(file).parent_path();
    if (folder.filename() == "checkpoints" && fs::exists(folder.parent_path() / "config.json"))
      start.run_dir = folder.parent_path();
  }
  if (start.resume) check_resumable(start.resume->checkpoint, config, start.resume->file);
  return start;
}

/// The data-parallel process group when torchrun's variables name more than one process.
std::unique_ptr<dist::Group> join_group(const config::LoadedConfig& loaded, torch::Device& device) {
  const std::optional<dist::Environment> environment = dist::read_environment();
  if (!environment || environment->world_size == 1) return nullptr;
  // One GPU per process: "auto" and "cuda" mean this process's LOCAL_RANK.
  const std::string& name = loaded.config.run.device;
  if (device.is_cuda() && (name == "auto" || name == "cuda")) {
    if (environment->local_rank >= compat::cuda_device_count())
      throw config::config_error(loaded, "run.device",
                                 fmt::format("LOCAL_RANK {} but this machine has {} CUDA device(s): start at most one "
                                             "process per GPU",
                                             environment->local_rank, compat::cuda_device_count()));
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(environment->local_rank));
  }
  auto group = std::make_unique<dist::Group>(*environment, loaded.config.distributed, device);
  // Every process must train the same thing: compare the resolved configs.
  const std::vector<std::string> configs = group->all_gather_text("config", config::to_json(loaded.config).dump());
  for (size_t rank = 1; rank < configs.size(); ++rank)
    if (configs[rank] != configs[0]) {
      const std::vector<std::string> changes =
          config::changed_settings(nlohmann::json::parse(configs[0]), nlohmann::json::parse(configs[rank]));
      throw ConfigError(fmt::format("rank {}'s config differs from rank 0's: {}; every process must run the same "
                                    "config and --set flags",
                                    rank, fmt::join(changes, ", ")));
    }
  return group;
}

/// Rank `rank`'s contiguous part of `set` when it is split into `count` parts (sizes differ by at most one).
data::ImageSet shard_of(const data::ImageSet& set, int64_t rank, int64_t count) {
  const int64_t begin = set.size() * rank / count;
  const int64_t end = set.size() * (rank + 1) / count;
  return {set.images.narrow(0, begin, end - begin), set.labels.narrow(0, begin, end - begin)};
}

/// True on every rank when `value` is true on any (a collective: every rank must call it).
bool any_rank(dist::Group& group, bool value, const torch::Device& device) {
  torch::Tensor flag = torch::full({1}, value ? 1 : 0, torch::TensorOptions().dtype(torch::kInt32).device(device));
  group.all_reduce_sum({flag}).wait();
  return flag.item<int32_t>() > 0;
}

/// True on every rank when a stop was requested on any (with a group: a collective, every rank
/// calls it at the same point).
bool stop_requested_anywhere(dist::Group* group, const torch::Device& device) {
  return group ? any_rank(*group, interrupt::stop_requested(), device) : interrupt::stop_requested();
}

/// What stopped this process: "signal 15", or "a signal to another process" on a rank that stops
/// with the others.
std::string stop_cause() {
  const int signal_number = interrupt::stop_signal();
  return signal_number != 0 ? fmt::format("signal {}", signal_number) : "a signal to another process";
}

/// The model's parameters and buffers, in module order.
std::vector<torch::Tensor> model_state(const torch::nn::Module& model) {
  std::vector<torch::Tensor> tensors = model.parameters();
  for (const torch::Tensor& buffer : model.buffers()) tensors.push_back(buffer);
  return tensors;
}

}  // namespace

TrainResult train(const config::LoadedConfig& loaded, const TrainHooks& hooks) {
  const config::RunConfig& config = loaded.config;
  // From here SIGINT/SIGTERM are requests polled below: before anything is written, after each step.
  const interrupt::StopRequests stop_requests;

  // ---- Set-up: everything that can fail on bad input fails before the run directory exists ----
  torch::Device device = resolve_device(loaded);
  const std::unique_ptr<dist::Group> group = join_group(loaded, device);
  const bool main_process = !group || group->is_main();
  const int64_t ranks = group ? group->size() : 1;
  const int64_t rank = group ? group->rank() : 0;
  StartPoint start = choose_start(loaded);
  apply_runtime_settings(loaded);
  const int64_t gpu_memory_limit = limit_gpu_memory(config, device);
  const data::TrainTestSets sets = load_data(config, device);
  data::TrainLoader train_loader = make_train_loader(loaded, sets.train, {rank, ranks});
  const data::EvalLoader eval_loader(shard_of(sets.test, rank, ranks), config.data);
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  // A resumed run takes its weights from the checkpoint: model.init_from need not exist any more.
  config::LoadedConfig model_source = loaded;
  if (start.resume) model_source.config.model.init_from.clear();
  models::ResNet model = build_model(model_source, device);
  const std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(config.optim, named_parameters(*model));
  const int64_t total_steps = config.run.max_steps > 0 ? std::min(config.run.max_steps, config.run.epochs * steps_per_epoch)
                                                       : config.run.epochs * steps_per_epoch;
  const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const optim::LrSchedule schedule(config.schedule, config.optim.lr, total_steps, steps_per_epoch);
  amp::GradScaler scaler(amp::scaler_options(config.precision), device);
  RunningSums sums;
  int64_t first_epoch = 1, first_index = 0, step = 0;  // where the loop begins
  if (start.resume) {
    const Checkpoint& checkpoint = start.resume->checkpoint;
    restore_training_state(checkpoint, start.resume->file, *model, *optimizer, scaler);
    sums = RunningSums::from_json(checkpoint.meta.progress);
    first_epoch = checkpoint.meta.epoch + 1;
    first_index = checkpoint.meta.epoch_steps_done;
    step = checkpoint.meta.step;
  }
  if (group) {
    // Every rank starts from rank 0's weights and buffers (a resumed run: the same file anyway).
    group->broadcast_from_main(model_state(*model));
    if (config.distributed.sync_batchnorm) {
      dist::Group* sync_group = group.get();
      models::synchronize_batchnorm(*model, [sync_group](const torch::Tensor& values) {
        return dist::all_reduce_sum_differentiable(*sync_group, values);
      });
    }
  }
  // optim.ema_decay: from the (broadcast, or resumed) weights on.
  std::optional<WeightAverage> average;
  if (config.optim.ema_decay > 0.0) {
    average.emplace(*model, config.optim.ema_decay);
    if (start.resume) {
      const Checkpoint& checkpoint = start.resume->checkpoint;
      if (checkpoint.averaged_weights.empty()) {
        spdlog::warn("{}: no averaged weights in the checkpoint; optim.ema_decay starts its average from the resumed "
                     "weights",
                     start.resume->file.string());
      } else {
        average->load(checkpoint.averaged_weights, start.resume->file);
      }
    }
  }
  // Optional only to be destroyed before the group closes (see the end).
  std::optional<TrainStep> train_step(std::in_place, model, *optimizer, scaler, config, group.get());
  std::optional<Evaluator> evaluator(std::in_place, model, eval_loader, config, group.get());
  // A stop asked for during set-up ends the run here, before anything is written.
  if (hooks.after_setup) hooks.after_setup();
  if (stop_requested_anywhere(group.get(), device))
    throw Interrupted(fmt::format("stopped by {} during set-up, before step {}; nothing was written: run the same "
                                  "command again",
                                  stop_cause(), step + 1));

  // Only rank 0 writes: the run directory, logs, metrics and checkpoints; the others log warnings
  // and errors only.
  if (!main_process) spdlog::set_level(spdlog::level::warn);
  fs::path run_dir = start.run_dir;
  if (!main_process) {
    run_dir = group->all_gather_text("run_dir", "")[0];
  } else if (run_dir.empty()) {
    run_dir = io::create_run_dir(config.run.out_dir, config.run.name);
  } else {
    std::error_code error;
    fs::create_directories(run_dir, error);
    if (error)
      throw RunError(fmt::format("{}: cannot create the run folder ({}); set run.out_dir to a writable folder",
                                 run_dir.string(), error.message()));
    // Rows written after the checkpoint (or by an attempt without one) will be written again.
    io::truncate_metrics(run_dir, step, /*epoch_row_at_step_kept=*/first_index == 0);
  }
  if (group && main_process) group->all_gather_text("run_dir", run_dir.string());
  const fs::path checkpoint_dir = run_dir / "checkpoints";
  if (main_process) {
    std::error_code error;
    fs::create_directories(checkpoint_dir, error);
    if (error) throw files::write_error(checkpoint_dir, "create the folder", error.value());
    log::add_file(run_dir / "train.log");
    // Unfinished writes of a run that was killed (SIGKILL, a power cut): never of a living process.
    for (const fs::path& folder : {run_dir, checkpoint_dir})
      for (const fs::path& file : files::remove_stale_temporaries(folder))
        spdlog::info("removed {}: an unfinished write of a process that no longer runs", file.string());
  }
  spdlog::info("ltrain {} | LibTorch {} | device {} | {} CPU threads", LTRAIN_VERSION, compat::torch_version(),
               device.str(), torch::get_num_threads());
  spdlog::info("run directory {}", run_dir.string());
  if (const std::string limits = describe_gpu_limits(device, gpu_memory_limit); !limits.empty())
    spdlog::info("GPU limits: {}", limits);
  if (start.resume) {
    spdlog::info("resuming from {}: step {}, epoch {} ({} of its {} steps done)", start.resume->file.string(), step,
                 first_epoch, first_index, steps_per_epoch);
    // Resuming is what checkpoint.resume asks for: its own change is no news.
    nlohmann::json saved = start.resume->checkpoint.meta.config;
    saved["checkpoint"]["resume"] = config.checkpoint.resume;
    const std::vector<std::string> changes = config::changed_settings(saved, config::to_json(config));
    if (!changes.empty())
      spdlog::warn("settings changed since the checkpoint (the run will not repeat an uninterrupted one exactly): {}",
                   fmt::join(changes, ", "));
  } else if (config.checkpoint.resume == "auto") {
    spdlog::info("checkpoint.resume auto: no valid checkpoint in {}, starting afresh", checkpoint_dir.string());
  }
  spdlog::info("resolved config:\n{}", config::format_table(loaded));
  if (main_process) io::write_text_file(run_dir / "config.json", config::to_json(config).dump(2) + "\n");
  if (group)
    spdlog::info("data-parallel: {} processes ({}), {} images per process per step{}", ranks, group->backend_name(),
                 train_loader.batch_size(), config.distributed.sync_batchnorm ? ", SyncBatchNorm" : "");
  spdlog::info("model {} ({} stem, width {}): {} parameters{}", config::to_string(config.model.arch),
               config::to_string(config.model.stem), config.model.width, models::count_parameters(*model),
               config.model.init_from.empty() ? "" : fmt::format(", weights from {}", config.model.init_from));
  spdlog::info("data {}: {} training images, {} test images; {} steps per epoch of {} images ({} x {} accumulated), "
               "{} steps in {} epoch(s)",
               config::to_string(config.data.source), sets.train.size(), sets.test.size(), steps_per_epoch,
               train_loader.batch_size() * ranks, config.optim.accumulation_steps, config.data.batch_size * ranks,
               total_steps, epochs);
  spdlog::info("precision {}{}{} | optimizer step: {}{}{}", config::to_string(config.precision.mode),
               scaler.enabled() ? " with a GradScaler" : "", config.model.channels_last ? " | channels_last" : "",
               optimizer->step_kernel(),
               config.cuda_graph.train
                   ? fmt::format(" | CUDA graph of the training step after {} eager steps", config.cuda_graph.warmup_steps)
                   : "",
               config.cuda_graph.eval ? " | CUDA graph of evaluation" : "");
  log::throw_if_file_failed();

  std::optional<io::MetricsLog> metrics;
  if (main_process) metrics.emplace(run_dir);
  Progress progress(main_process && stderr_is_terminal());
  TrainResult result;
  result.run_dir = run_dir;
  result.epochs = std::min(first_epoch - 1, epochs);
  const auto run_start = Clock::now();

  // A checkpoint of the state after `step`: `epochs_done` whole epochs and `steps_done` of the next.
  auto write_checkpoint = [&](const fs::path& file, int64_t epochs_done, int64_t steps_done,
                              const std::map<std::string, double>& values) {
    if (!main_process) return;
    CheckpointMeta meta;
    meta.epoch = epochs_done;
    meta.step = step;
    meta.epoch_steps_done = steps_done;
    meta.config = config::to_json(config);
    meta.progress = sums.to_json();
    for (const auto& [key, value] : values) meta.metrics[key] = value;
    save_checkpoint(file, *model, optimizer.get(), &scaler, meta,
                    average ? average->averaged_state_dict() : optim::NamedTensors{});
    spdlog::info("checkpoint {}", file.string());
  };
  auto stop_for_signal = [&](const fs::path& file) {
    throw Interrupted(fmt::format("stopped by {} after step {}; checkpoint {} written: run the same command with "
                                  "--set checkpoint.resume=auto (or ={}) to continue",
                                  stop_cause(), step, file.string(), file.string()));
  };

  try {
    for (int64_t epoch = first_epoch; epoch <= epochs; ++epoch) {
      // ---- Training steps of one epoch ----
      train_loader.set_epoch(epoch - 1);
      const int64_t epoch_steps = std::min(steps_per_epoch, total_steps - (epoch - 1) * steps_per_epoch);
      const int64_t first = epoch == first_epoch ? first_index : 0;
      if (first == 0) {
        sums.epoch = StepTotals();
        sums.epoch_seconds = 0.0;
      }
      auto interval_start = Clock::now();
      for (int64_t index = first; index < epoch_steps; ++index) {
        const double lr = schedule.at(step);
        optimizer->set_lr(lr);
        train_step->run(train_loader.batch(index));
        if (average) average->update();
        ++step;
        if (hooks.after_step) hooks.after_step(step);
        const bool last_of_epoch = index + 1 == epoch_steps;
        // Several processes act on a signal together, at the next log interval, where they agree.
        bool stop = !group && interrupt::stop_requested();
        // Steps checkpoints inside the epoch; one at its last step waits for the evaluation.
        const bool periodic_checkpoint =
            config.checkpoint.every_steps > 0 && step % config.checkpoint.every_steps == 0 && !last_of_epoch;
        if (step % config.run.log_every_steps != 0 && !last_of_epoch && !periodic_checkpoint && !stop) continue;

        // ---- Log interval: the loop's only host sync ----
        const StepTotals totals = train_step->take_totals();
        if (group) stop = stop_requested_anywhere(group.get(), device);
        const bool checkpoint_now = stop || periodic_checkpoint;
        const double interval_seconds = seconds_since(interval_start);
        interval_start = Clock::now();
        sums.epoch_seconds += interval_seconds;
        sums.epoch.loss_sum += totals.loss_sum;
        sums.epoch.correct += totals.correct;
        sums.epoch.images += totals.images;
        check_numerics(config, totals, step, epoch, checkpoint_dir);
        const double images_per_second = static_cast<double>(totals.images) / interval_seconds;
        const double seconds_per_step =
            (sums.train_seconds + sums.epoch_seconds) / static_cast<double>(std::max<int64_t>(step, 1));
        progress.update({epoch, epochs, step, total_steps, index + 1, epoch_steps, totals.mean_loss(),
                         totals.accuracy(), lr, images_per_second,
                         seconds_per_step * static_cast<double>(total_steps - step)});
        std::map<std::string, double> values{{"lr", lr},
                                             {"train_loss", totals.mean_loss()},
                                             {"train_acc", totals.accuracy()},
                                             {"img_per_s", images_per_second},
                                             {"elapsed_s", seconds_since(run_start)}};
        if (scaler.enabled()) {
          values["loss_scale"] = totals.loss_scale;
          values["skipped_steps"] = static_cast<double>(totals.skipped_steps);
          sums.last_scale = totals.loss_scale;
          sums.skipped_steps = totals.skipped_steps;
        }
        if (metrics) metrics->write({"step", epoch, step, values});
        if (checkpoint_now) {
          progress.clear();
          const fs::path file = checkpoint_dir / checkpoint_file_name(step);
          write_checkpoint(file, epoch - 1, index + 1, values);
          if (main_process) prune_checkpoints(checkpoint_dir, config.checkpoint.keep_last);
          if (stop) stop_for_signal(file);
        }
        log::throw_if_file_failed();
      }
      progress.clear();
      sums.train_seconds += sums.epoch_seconds;
      result.epochs = epoch;
      const bool last_epoch = epoch == epochs;

      // ---- Evaluation ----
      std::optional<EvalResult> evaluation;
      bool new_best = false;
      if (due(epoch, config.run.eval_every_epochs, last_epoch)) {
        std::optional<WeightAverage::Applied> averaged;  // with optim.ema_decay: evaluate the average
        if (average) averaged.emplace(*average);
        // Without SyncBatchNorm each rank's running statistics are its own: all evaluate (and
        // rank 0 saves) rank 0's, as DistributedDataParallel's broadcast_buffers does.
        if (group) group->broadcast_from_main(model->buffers());
        evaluation = evaluator->run();
        averaged.reset();
        sums.final_test_accuracy = evaluation->accuracy;
        sums.final_test_loss = evaluation->loss;
        if (evaluation->accuracy > sums.best_test_accuracy || sums.best_epoch == 0) {
          sums.best_test_accuracy = evaluation->accuracy;
          sums.best_epoch = epoch;
        }
        if (config.checkpoint.best_metric != config::BestMetric::none) {
          const bool accuracy = config.checkpoint.best_metric == config::BestMetric::test_acc;
          const double value = accuracy ? evaluation->accuracy : evaluation->loss;
          new_best = !sums.has_best_metric || (accuracy ? value > sums.best_metric : value < sums.best_metric);
          if (new_best) {
            sums.best_metric = value;
            sums.has_best_metric = true;
          }
        }
      }

      // ---- Epoch log and metrics ----
      const double epoch_images_per_second = static_cast<double>(sums.epoch.images) / sums.epoch_seconds;
      std::map<std::string, double> epoch_values{{"lr", schedule.at(std::max<int64_t>(step - 1, 0))},
                                                 {"train_loss", sums.epoch.mean_loss()},
                                                 {"train_acc", sums.epoch.accuracy()},
                                                 {"img_per_s", epoch_images_per_second},
                                                 {"elapsed_s", seconds_since(run_start)}};
      std::string test_text;
      if (scaler.enabled()) {
        epoch_values["loss_scale"] = sums.last_scale;
        epoch_values["skipped_steps"] = static_cast<double>(sums.skipped_steps);
        test_text += fmt::format(" | scale {:g}, {} skipped", sums.last_scale, sums.skipped_steps);
      }
      if (evaluation) {
        epoch_values["test_loss"] = evaluation->loss;
        epoch_values["test_acc"] = evaluation->accuracy;
        test_text += fmt::format(" | test loss {:.4f} acc {:.2f}%", evaluation->loss, 100.0 * evaluation->accuracy);
      }
      spdlog::info("epoch {}/{} | train loss {:.4f} acc {:.2f}%{} | {:.0f} img/s | {} elapsed", epoch, epochs,
                   sums.epoch.mean_loss(), 100.0 * sums.epoch.accuracy(), test_text, epoch_images_per_second,
                   format_duration(seconds_since(run_start)));
      if (metrics) metrics->write({"epoch", epoch, step, epoch_values});

      // ---- Checkpoints: the state after this epoch ----
      const bool stop = stop_requested_anywhere(group.get(), device);
      sums.epoch = StepTotals();
      sums.epoch_seconds = 0.0;
      const fs::path file = checkpoint_dir / checkpoint_file_name(step);
      if (due(epoch, config.checkpoint.every_epochs, last_epoch) || stop ||
          (config.checkpoint.every_steps > 0 && step % config.checkpoint.every_steps == 0)) {
        write_checkpoint(file, epoch, 0, epoch_values);
        if (main_process) prune_checkpoints(checkpoint_dir, config.checkpoint.keep_last);
      }
      if (new_best) write_checkpoint(checkpoint_dir / kBestCheckpointName, epoch, 0, epoch_values);
      log::throw_if_file_failed();
      if (stop && !last_epoch) stop_for_signal(file);
    }
  } catch (const c10::Error& error) {
    if (compat::is_out_of_memory(error)) throw out_of_memory_error(config, error);
    throw;
  } catch (const files::WriteError& error) {
    throw files::WriteError(fmt::format("{}; the checkpoints already in {} are intact: once it is fixed, the same "
                                        "command with --set checkpoint.resume=auto continues the run",
                                        error.what(), checkpoint_dir.string()));
  }

  // ---- Summary ----
  result.steps = step;
  result.final_test_accuracy = sums.final_test_accuracy;
  result.final_test_loss = sums.final_test_loss;
  result.best_test_accuracy = sums.best_test_accuracy;
  result.best_epoch = sums.best_epoch;
  result.train_seconds = sums.train_seconds;
  result.wall_seconds = seconds_since(run_start);
  result.images_per_second =
      result.train_seconds > 0 ? static_cast<double>(step * train_loader.batch_size() * ranks) / result.train_seconds
                               : 0.0;
  result.peak_memory_bytes = compat::peak_memory_bytes(device);
  result.peak_reserved_bytes = compat::peak_reserved_bytes(device);
  spdlog::info("done: {} epoch(s), {} steps in {} (training {}) | test accuracy {:.2f}%, best {:.2f}% (epoch {}) | "
               "{:.0f} img/s",
               result.epochs, result.steps, format_duration(result.wall_seconds),
               format_duration(result.train_seconds), 100.0 * result.final_test_accuracy,
               100.0 * result.best_test_accuracy, result.best_epoch, result.images_per_second);
  if (main_process) {
    io::write_text_file(run_dir / "summary.json", result_json(result).dump(2) + "\n");
    log::throw_if_file_failed();
    log::remove_file();
  }
  // Their CUDA graphs hold all-reduces captured on the group's NCCL communicators; with the graphs
  // alive, tearing the communicators down never returned (2 H200s, 2026-11-30).
  train_step.reset();
  evaluator.reset();
  if (group) group->close();  // no process leaves while another may still need it
  return result;
}

}  // namespace ltrain::engine
