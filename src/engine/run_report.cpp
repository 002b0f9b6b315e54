#include "run_report.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/log.h"
#include "ltrain/core/progress.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/dist/group.h"
#include "ltrain/engine/setup.h"
#include "ltrain/io/run_files.h"

namespace ltrain::engine {

// ---- The start ----

void log_start(Run& run, const StartPoint& start, const ResumePoint& begin, const RunLength& length,
               const std::filesystem::path& run_dir) {
  const config::RunConfig& config = run.config();
  const torch::Device& device = run.device();
  spdlog::info("ltrain {} | LibTorch {} | device {} | {} CPU threads | seed {}", LTRAIN_VERSION,
               compat::torch_version(), device.str(), torch::get_num_threads(), config.run.seed);
  spdlog::info("run directory {}{}", run_dir.string(), run.main_process() ? "" : " (rank 0's, on its machine)");
  if (const std::string limits = describe_gpu_limits(device, run.gpu_memory_limit()); !limits.empty())
    spdlog::info("GPU limits: {}", limits);
  if (start.resume) {
    spdlog::info("resuming from {}: step {}, epoch {} ({} of its {} steps done); {} steps to go",
                 start.resume->file.string(), begin.step, begin.epoch, begin.index, length.steps_per_epoch,
                 length.total_steps - begin.step);
    warn_of_changed_settings(start.resume->checkpoint.meta.config, config);
    if (start.run_dir.empty()) {
      const std::string resumed_name = saved_run_name(start.resume->checkpoint);
      spdlog::info("{}: a new run in {} from its state at step {}",
                   resumed_name != config.run.name
                       ? fmt::format("run.name \"{}\" is not the checkpoint's run (\"{}\")", config.run.name,
                                     resumed_name)
                       : std::string("the checkpoint lies in no run folder"),
                   run_dir.string(), begin.step);
    }
  } else if (config.checkpoint.resume == "auto") {
    spdlog::info("checkpoint.resume auto: no valid checkpoint in {}, starting afresh",
                 (run_dir / "checkpoints").string());
  }
  spdlog::info("{}", config::format_table(run.loaded()));
  const data::TrainLoader& loader = run.train_loader();
  const int64_t ranks = run.ranks();
  if (const dist::Group* group = run.group()) {
    const dist::Environment& environment = group->environment();
    const std::string nodes = environment.local_world_size < ranks
                                  ? fmt::format(" on {} nodes, this is node {},", ranks / environment.local_world_size,
                                                environment.node_rank)
                                  : ",";
    spdlog::info("data-parallel: {} processes ({}){} {} images per process per step{}", ranks, group->backend_name(),
                 nodes, loader.images_per_step(), config.distributed.sync_batch_norm ? ", SyncBatchNorm" : "");
  }
  spdlog::info("model {} ({} stem, width {}): {} parameters{}", config::to_string(config.model.arch),
               config::to_string(config.model.stem), config.model.width, models::count_parameters(*run.model()),
               config.model.init_from.empty() ? "" : fmt::format(", weights from {}", config.model.init_from));
  spdlog::info("data {}: {} training images, {} test images; {} steps per epoch of {} images ({} x {} accumulated), "
               "{} steps in {} epoch(s)",
               config::to_string(config.data.source), run.sets().train.size(), run.sets().test.size(),
               length.steps_per_epoch, loader.images_per_step() * ranks, config.optim.accumulation_steps,
               config.data.batch_size * ranks, length.total_steps, length.epochs);
  const std::string train_graph =
      config.cuda_graph.train
          ? fmt::format(" | CUDA graph of the training step after {} eager steps", config.cuda_graph.warmup_steps)
          : "";
  spdlog::info("precision {}{}{} | optimizer step: {}{}{}", config::to_string(config.precision.mode),
               run.scaler().enabled() ? " with a GradScaler" : "", config.model.channels_last ? " | channels_last" : "",
               run.optimizer().step_kernel(), train_graph, config.cuda_graph.eval ? " | CUDA graph of evaluation" : "");
  log::throw_if_file_failed();
}

// ---- The end ----

nlohmann::json result_json(const TrainResult& r) {
  // Byte counts the device does not keep (the CPU's) are null, not a number.
  const auto bytes = [](int64_t count) { return count < 0 ? nlohmann::json() : nlohmann::json(count); };
  return {{"run_dir", r.run_dir.string()},
          {"epochs", r.epochs},
          {"steps", r.steps},
          {"final_test_accuracy", r.final_test_accuracy},
          {"final_test_loss", r.final_test_loss},
          {"best_test_accuracy", r.best_test_accuracy},
          {"best_epoch", r.best_epoch},
          {"train_seconds", r.train_seconds},
          {"wall_seconds", r.wall_seconds},
          {"startup_seconds", r.startup_seconds},
          {"images_per_second", r.images_per_second},
          {"stopped_early", r.stopped_early},
          {"this_process",
           {{"resumed_at_step", r.resumed_at_step},
            {"steps", r.steps - r.resumed_at_step},
            {"train_seconds", r.process_train_seconds},
            {"wall_seconds", r.process_wall_seconds}}},
          {"peak_memory_bytes", bytes(r.peak_memory_bytes)},
          {"peak_reserved_bytes", bytes(r.peak_reserved_bytes)}};
}

void log_summary(const TrainResult& result, const config::RunConfig& config,
                 const EarlyStopping::Standing& early_stop) {
  // A resumed run's times are the whole run's; this process's share follows them.
  const std::string this_process =
      result.resumed_at_step == 0
          ? ""
          : fmt::format("; this process from step {}: {} steps in {}, training {}", result.resumed_at_step,
                        result.steps - result.resumed_at_step, format_duration(result.process_wall_seconds),
                        format_duration(result.process_train_seconds));
  nlohmann::json fields = result_json(result);
  fields["event"] = "done";
  const log::JsonFields json_fields(fields);
  // Early stopping on the test loss names that best too, each best with its metric.
  const std::string test_loss =
      config.run.early_stop_metric == config::BestMetric::test_loss
          ? fmt::format(" | test loss {:.4f} (best {:.4f}, epoch {})", result.final_test_loss, early_stop.best,
                        early_stop.best_epoch)
          : "";
  spdlog::info("done: {} epoch(s), {} steps in {} (training {}; set-up before them {}{}) | test accuracy {:.2f}% "
               "(best {:.2f}%, epoch {}){} | {:.0f} img/s",
               result.epochs, result.steps, format_duration(result.wall_seconds),
               format_duration(result.train_seconds), format_duration(result.startup_seconds), this_process,
               100.0 * result.final_test_accuracy, 100.0 * result.best_test_accuracy, result.best_epoch, test_loss,
               result.images_per_second);
}

void log_nothing_to_train(const TrainResult& result, const std::filesystem::path& checkpoint,
                          const std::string& length) {
  nlohmann::json fields = result_json(result);
  fields["event"] = "done";  // for --json's readers, as at the end of a run
  const log::JsonFields json_fields(fields);
  spdlog::info("nothing to train: {} is at step {}, the end of this run ({}), and the run's summary is written; "
               "raise run.max_steps or run.epochs to train further",
               checkpoint.string(), result.steps, length);
}

void write_summary(const std::filesystem::path& run_dir, const TrainResult& result, const config::RunConfig& config,
                   const nlohmann::json& provenance) {
  nlohmann::json summary = result_json(result);
  summary["data"] = config::data_summary(config.data);
  summary["provenance"] = provenance;
  io::write_text_file(run_dir / "summary.json", summary.dump(2) + "\n");
}

// ---- The dry run's plan ----

void check_device_support(const config::LoadedConfig& loaded) {
  resolve_device(loaded);
  check_threads(loaded);
}

RunPlan plan_run(const config::LoadedConfig& loaded) {
  const StartPoint start = choose_start(loaded);
  RunParts parts;  // one process: a dry run joins no group
  parts.weights_from_caller = start.resume.has_value();
  Run run(loaded, parts);
  const RunLength length = run_length(run.config(), run.train_loader().batches_per_epoch());
  RunPlan plan;
  plan.device = run.device().str();
  plan.parameters = models::count_parameters(*run.model());
  plan.train_images = run.sets().train.size();
  plan.test_images = run.sets().test.size();
  plan.images_per_step = run.train_loader().images_per_step();
  plan.steps_per_epoch = length.steps_per_epoch;
  plan.total_steps = length.total_steps;
  plan.epochs = length.epochs;
  check_steps_left(loaded, start, length);
  if (start.resume) {
    plan.resume_from = start.resume->file;
    plan.resume_step = start.resume->checkpoint.meta.step;
  }
  return plan;
}

std::string to_text(const config::RunConfig& config, const RunPlan& plan) {
  return fmt::format("{} ({} stem, width {}): {} parameters | {}: {} training, {} test images | {} steps per epoch of "
                     "{} images, {} steps in {} epoch(s){} | device {}",
                     config::to_string(config.model.arch), config::to_string(config.model.stem), config.model.width,
                     plan.parameters, config::to_string(config.data.source), plan.train_images, plan.test_images,
                     plan.steps_per_epoch, plan.images_per_step, plan.total_steps, plan.epochs,
                     plan.resume_from.empty()
                         ? ""
                         : fmt::format(", resuming from {} (step {}: {} to go)", plan.resume_from.string(),
                                       plan.resume_step, plan.total_steps - plan.resume_step),
                     plan.device);
}

}  // namespace ltrain::engine
