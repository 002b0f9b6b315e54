#include "ltrain/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/amp/precision.h"
#include "ltrain/core/log.h"
#include "ltrain/core/progress.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/evaluator.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"
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
          {"images_per_second", r.images_per_second}};
}

}  // namespace

TrainResult train(const config::LoadedConfig& loaded) {
  const config::RunConfig& config = loaded.config;

  // ---- Set-up: everything that can fail on bad input fails before the run directory exists ----
  const torch::Device device = resolve_device(loaded);
  apply_runtime_settings(config);
  const data::TrainTestSets sets = load_data(config, device);
  data::TrainLoader train_loader = make_train_loader(loaded, sets.train);
  const data::EvalLoader eval_loader(sets.test, config.data);
  const int64_t steps_per_epoch = train_loader.batches_per_epoch();
  models::ResNet model = build_model(loaded, device);
  const std::unique_ptr<optim::Optimizer> optimizer = optim::make_optimizer(config.optim, named_parameters(*model));
  const int64_t total_steps = config.run.max_steps > 0 ? std::min(config.run.max_steps, config.run.epochs * steps_per_epoch)
                                                       : config.run.epochs * steps_per_epoch;
  const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  const optim::LrSchedule schedule(config.schedule, config.optim.lr, total_steps, steps_per_epoch);
  amp::GradScaler scaler(amp::scaler_options(config.precision), device);
  TrainStep train_step(model, *optimizer, scaler, config);
  Evaluator evaluator(model, eval_loader, config);

  const fs::path run_dir = io::create_run_dir(config.run.out_dir, config.run.name);
  const fs::path checkpoint_dir = run_dir / "checkpoints";
  fs::create_directories(checkpoint_dir);
  log::add_file(run_dir / "train.log");
  spdlog::info("ltrain {} | LibTorch {} | device {} | {} CPU threads", LTRAIN_VERSION, compat::torch_version(),
               device.str(), torch::get_num_threads());
  spdlog::info("run directory {}", run_dir.string());
  spdlog::info("resolved config:\n{}", config::format_table(loaded));
  io::write_text_file(run_dir / "config.json", config::to_json(config).dump(2) + "\n");
  spdlog::info("model {} ({} stem, width {}): {} parameters", config::to_string(config.model.arch),
               config::to_string(config.model.stem), config.model.width, models::count_parameters(*model));
  spdlog::info("data {}: {} training images, {} test images; {} steps per epoch of {} images ({} x {} accumulated), "
               "{} steps in {} epoch(s)",
               config::to_string(config.data.source), sets.train.size(), sets.test.size(), steps_per_epoch,
               train_loader.batch_size(), config.optim.accumulation_steps, config.data.batch_size, total_steps, epochs);
  spdlog::info("precision {}{}{} | optimizer step: {}{}{}", config::to_string(config.precision.mode),
               scaler.enabled() ? " with a GradScaler" : "", config.model.channels_last ? " | channels_last" : "",
               optimizer->fused() ? "fused (LibTorch)" : "portable",
               config.cuda_graph.train
                   ? fmt::format(" | CUDA graph of the training step after {} eager steps", config.cuda_graph.warmup_steps)
                   : "",
               config.cuda_graph.eval ? " | CUDA graph of evaluation" : "");

  io::MetricsLog metrics(run_dir);
  Progress progress(stderr_is_terminal());
  TrainResult result;
  result.run_dir = run_dir;
  const auto run_start = Clock::now();
  int64_t step = 0;
  double last_scale = 0.0;     // the GradScaler's scale and skipped steps at the last read (fp16)
  int64_t skipped_steps = 0;

  try {
    for (int64_t epoch = 1; epoch <= epochs; ++epoch) {
      // ---- Training steps of one epoch ----
      train_loader.set_epoch(epoch - 1);
      const int64_t epoch_steps = std::min(steps_per_epoch, total_steps - step);
      StepTotals epoch_totals;
      double epoch_seconds = 0.0;
      auto interval_start = Clock::now();
      for (int64_t index = 0; index < epoch_steps; ++index) {
        const double lr = schedule.at(step);
        optimizer->set_lr(lr);
        train_step.run(train_loader.batch(index));
        ++step;
        if (step % config.run.log_every_steps != 0 && index + 1 != epoch_steps) continue;

        // ---- Log interval: the loop's only host sync ----
        const StepTotals totals = train_step.take_totals();
        const double interval_seconds = seconds_since(interval_start);
        interval_start = Clock::now();
        epoch_seconds += interval_seconds;
        epoch_totals.loss_sum += totals.loss_sum;
        epoch_totals.correct += totals.correct;
        epoch_totals.images += totals.images;
        check_numerics(config, totals, step, epoch, checkpoint_dir);
        const double images_per_second = static_cast<double>(totals.images) / interval_seconds;
        const double seconds_per_step = (result.train_seconds + epoch_seconds) / static_cast<double>(step);
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
          last_scale = totals.loss_scale;
          skipped_steps = totals.skipped_steps;
        }
        metrics.write({"step", epoch, step, values});
      }
      progress.clear();
      result.train_seconds += epoch_seconds;
      result.epochs = epoch;
      result.steps = step;
      const bool last_epoch = epoch == epochs;

      // ---- Evaluation ----
      std::optional<EvalResult> evaluation;
      if (due(epoch, config.run.eval_every_epochs, last_epoch)) {
        evaluation = evaluator.run();
        result.final_test_accuracy = evaluation->accuracy;
        result.final_test_loss = evaluation->loss;
        if (evaluation->accuracy > result.best_test_accuracy || result.best_epoch == 0) {
          result.best_test_accuracy = evaluation->accuracy;
          result.best_epoch = epoch;
        }
      }

      // ---- Epoch log and metrics ----
      const double epoch_images_per_second = static_cast<double>(epoch_totals.images) / epoch_seconds;
      std::map<std::string, double> epoch_values{{"lr", schedule.at(std::max<int64_t>(step - 1, 0))},
                                                 {"train_loss", epoch_totals.mean_loss()},
                                                 {"train_acc", epoch_totals.accuracy()},
                                                 {"img_per_s", epoch_images_per_second},
                                                 {"elapsed_s", seconds_since(run_start)}};
      std::string test_text;
      if (scaler.enabled()) {
        epoch_values["loss_scale"] = last_scale;
        epoch_values["skipped_steps"] = static_cast<double>(skipped_steps);
        test_text += fmt::format(" | scale {:g}, {} skipped", last_scale, skipped_steps);
      }
      if (evaluation) {
        epoch_values["test_loss"] = evaluation->loss;
        epoch_values["test_acc"] = evaluation->accuracy;
        test_text += fmt::format(" | test loss {:.4f} acc {:.2f}%", evaluation->loss, 100.0 * evaluation->accuracy);
      }
      spdlog::info("epoch {}/{} | train loss {:.4f} acc {:.2f}%{} | {:.0f} img/s | {} elapsed", epoch, epochs,
                   epoch_totals.mean_loss(), 100.0 * epoch_totals.accuracy(), test_text, epoch_images_per_second,
                   format_duration(seconds_since(run_start)));
      metrics.write({"epoch", epoch, step, epoch_values});

      // ---- Checkpoint ----
      if (due(epoch, config.checkpoint.every_epochs, last_epoch)) {
        CheckpointMeta meta{epoch, step, config::to_json(config), nlohmann::json::object()};
        for (const auto& [key, value] : epoch_values) meta.metrics[key] = value;
        const fs::path file = checkpoint_dir / checkpoint_file_name(step);
        save_checkpoint(file, *model, optimizer.get(), meta);
        prune_checkpoints(checkpoint_dir, config.checkpoint.keep_last);
        spdlog::info("checkpoint {}", file.string());
      }
    }
  } catch (const c10::Error& error) {
    if (compat::is_out_of_memory(error)) throw out_of_memory_error(config, error);
    throw;
  }

  // ---- Summary ----
  result.wall_seconds = seconds_since(run_start);
  result.images_per_second =
      result.train_seconds > 0 ? static_cast<double>(step * train_loader.batch_size()) / result.train_seconds : 0.0;
  spdlog::info("done: {} epoch(s), {} steps in {} (training {}) | test accuracy {:.2f}%, best {:.2f}% (epoch {}) | "
               "{:.0f} img/s",
               result.epochs, result.steps, format_duration(result.wall_seconds),
               format_duration(result.train_seconds), 100.0 * result.final_test_accuracy,
               100.0 * result.best_test_accuracy, result.best_epoch, result.images_per_second);
  io::write_text_file(run_dir / "summary.json", result_json(result).dump(2) + "\n");
  log::remove_file();
  return result;
}

}  // namespace ltrain::engine
