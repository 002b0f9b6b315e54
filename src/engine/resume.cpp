#include "resume.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/errors.h"

namespace ltrain::engine {
namespace {

namespace fs = std::filesystem;

// JSON has no inf or NaN (a diverged run's test loss can be either): they travel as strings.
nlohmann::json json_number(double value) {
  if (std::isfinite(value)) return value;
  return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
}

double number_of(const nlohmann::json& j, const char* key) {
  const nlohmann::json value = j.value(key, nlohmann::json(0.0));
  if (value.is_number()) return value.get<double>();
  const std::string text = value.is_string() ? value.get<std::string>() : "nan";
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  return std::numeric_limits<double>::quiet_NaN();
}

RunningSums sums_of(const nlohmann::json& j) {
  RunningSums s;
  s.epoch.loss_sum = number_of(j, "epoch_loss_sum");
  s.epoch.correct = j.value("epoch_correct", int64_t{0});
  s.epoch.images = j.value("epoch_images", int64_t{0});
  s.epoch_seconds = number_of(j, "epoch_seconds");
  s.train_seconds = number_of(j, "train_seconds");
  s.final_test_accuracy = number_of(j, "final_test_accuracy");
  s.final_test_loss = number_of(j, "final_test_loss");
  s.best_test_accuracy = number_of(j, "best_test_accuracy");
  s.best_epoch = j.value("best_epoch", int64_t{0});
  s.best_metric = number_of(j, "best_metric");
  s.has_best_metric = j.value("has_best_metric", false);
  s.last_scale = number_of(j, "last_scale");
  s.skipped_steps = j.value("skipped_steps", int64_t{0});
  s.wall_seconds = number_of(j, "wall_seconds");
  return s;
}

EarlyStopping::Standing early_stop_of(const nlohmann::json& j) {
  EarlyStopping::Standing standing;
  standing.best = number_of(j, "early_stop_best");
  standing.best_epoch = j.value("early_stop_best_epoch", int64_t{0});
  standing.evaluations_without_improvement = j.value("evaluations_without_improvement", int64_t{0});
  return standing;
}

/// Where the run of `meta` picks up at `steps_per_epoch` steps per epoch; `epoch_ended`: its
/// checkpoint was written after its epoch's end.
ResumePoint resume_point(const CheckpointMeta& meta, bool epoch_ended, int64_t steps_per_epoch) {
  ResumePoint point;
  point.step = meta.step;
  point.epoch_ended = epoch_ended || meta.step == 0;
  if (!point.epoch_ended && meta.step % steps_per_epoch == 0) {
    // The last step of an epoch, before its evaluation: the resumed run evaluates it.
    point.epoch = meta.step / steps_per_epoch;
    point.index = steps_per_epoch;
  } else {
    point.epoch = meta.step / steps_per_epoch + 1;
    point.index = meta.step % steps_per_epoch;
  }
  return point;
}

}  // namespace

RunLength run_length(const config::RunConfig& config, int64_t steps_per_epoch) {
  RunLength length;
  length.steps_per_epoch = steps_per_epoch;
  const int64_t all = config.run.epochs * steps_per_epoch;
  length.by_max_steps = config.run.max_steps > 0 && config.run.max_steps < all;
  length.total_steps = config.run.max_steps > 0 ? std::min(config.run.max_steps, all) : all;
  length.epochs = epochs_of(length.total_steps, steps_per_epoch);
  return length;
}

int64_t epochs_of(int64_t steps, int64_t steps_per_epoch) { return (steps + steps_per_epoch - 1) / steps_per_epoch; }

std::string length_text(const config::RunConfig& config, const RunLength& length) {
  return length.by_max_steps ? fmt::format("run.max_steps {}", config.run.max_steps)
                             : fmt::format("run.epochs {} of {} steps", config.run.epochs, length.steps_per_epoch);
}

std::string saved_run_name(const Checkpoint& checkpoint) {
  const nlohmann::json& saved = checkpoint.meta.config;
  if (!saved.is_object() || !saved.contains("run") || !saved["run"].is_object()) return "";
  const nlohmann::json& name = saved["run"].value("name", nlohmann::json());
  return name.is_string() ? name.get<std::string>() : "";
}

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
    if (!fs::is_regular_file(file)) {
      std::error_code no_absolute_path;  // "" has none
      const fs::path absolute = fs::absolute(file, no_absolute_path);
      throw config::config_error(loaded, "checkpoint.resume",
                                 fmt::format("no such checkpoint file{}; use \"auto\", \"none\" or the path of a .ltc "
                                             "file",
                                             file.is_relative() && !no_absolute_path ? " (" + absolute.string() + ")"
                                                                                     : ""));
    }
    start.resume = FoundCheckpoint{file, read_checkpoint(file)};
    // A checkpoint inside a run directory continues that run's logs and metrics, unless run.name
    // names another run: that one starts in a folder of its own from the checkpoint's state.
    const fs::path folder = fs::absolute(file).parent_path();
    if (folder.filename() == "checkpoints" && fs::exists(folder.parent_path() / "config.json") &&
        saved_run_name(start.resume->checkpoint) == config.run.name)
      start.run_dir = folder.parent_path();
  }
  if (start.resume) check_resumable(start.resume->checkpoint, config, start.resume->file);
  return start;
}

void check_steps_left(const config::LoadedConfig& loaded, const StartPoint& start, const RunLength& length) {
  if (!start.resume) return;
  const config::RunConfig& config = loaded.config;
  const int64_t step = start.resume->checkpoint.meta.step;
  if (step <= length.total_steps) return;
  const int64_t epochs_needed = step / length.steps_per_epoch + 1;
  const std::string go_on =
      length.by_max_steps ? fmt::format("set run.max_steps above {} (0: no limit){}", step,
                                        config.run.epochs < epochs_needed
                                            ? fmt::format(" and run.epochs to {} or more", epochs_needed)
                                            : std::string())
                          : fmt::format("set run.epochs to {} or more", epochs_needed);
  throw config::config_error(
      loaded, length.by_max_steps ? "run.max_steps" : "run.epochs",
      fmt::format("{} is at step {}, past the {} steps this config runs ({}); {} to train further, or start a new "
                  "run (checkpoint.resume \"none\")",
                  start.resume->file.string(), step, length.total_steps, length_text(config, length), go_on));
}

void warn_of_changed_settings(const nlohmann::json& saved, const config::RunConfig& config) {
  nlohmann::json before = saved, after = config::to_json(config);
  for (nlohmann::json* settings : {&before, &after}) {
    for (const char* key : {"name", "out_dir", "log_every_steps", "tensorboard"}) (*settings)["run"].erase(key);
    settings->erase("checkpoint");
  }
  const std::vector<std::string> changes = config::changed_settings(before, after);
  if (!changes.empty())
    spdlog::warn("settings changed since the checkpoint (the run will not repeat an uninterrupted one exactly): {}",
                 fmt::join(changes, ", "));
}

nlohmann::json progress_json(const RunningSums& sums, const EarlyStopping::Standing& early_stop, bool epoch_ended) {
  return {{"epoch_loss_sum", json_number(sums.epoch.loss_sum)},
          {"epoch_correct", sums.epoch.correct},
          {"epoch_images", sums.epoch.images},
          {"epoch_seconds", json_number(sums.epoch_seconds)},
          {"train_seconds", json_number(sums.train_seconds)},
          {"wall_seconds", json_number(sums.wall_seconds)},
          {"final_test_accuracy", json_number(sums.final_test_accuracy)},
          {"final_test_loss", json_number(sums.final_test_loss)},
          {"best_test_accuracy", json_number(sums.best_test_accuracy)},
          {"best_epoch", sums.best_epoch},
          {"best_metric", json_number(sums.best_metric)},
          {"has_best_metric", sums.has_best_metric},
          {"last_scale", json_number(sums.last_scale)},
          {"skipped_steps", sums.skipped_steps},
          {"early_stop_best", json_number(early_stop.best)},
          {"early_stop_best_epoch", early_stop.best_epoch},
          {"evaluations_without_improvement", early_stop.evaluations_without_improvement},
          {"epoch_ended", epoch_ended}};
}

ResumeState read_resume_state(const FoundCheckpoint& found, int64_t steps_per_epoch) {
  const CheckpointMeta& meta = found.checkpoint.meta;
  const DataError damaged(fmt::format(
      "{}: its training progress holds a value of the wrong type; use an earlier checkpoint", found.file.string()));
  ResumeState state;
  nlohmann::json ended;
  try {
    state.sums = sums_of(meta.progress);
    state.early_stop = early_stop_of(meta.progress);
    // Checkpoints written at an epoch's end say so; those of earlier versions have no steps of
    // the next epoch done there (even where run.max_steps cut that epoch short).
    ended = meta.progress.value("epoch_ended", nlohmann::json(meta.epoch_steps_done == 0));
  } catch (const nlohmann::json::exception&) {
    throw damaged;
  }
  if (!ended.is_boolean()) throw damaged;
  state.point = resume_point(meta, ended.get<bool>(), steps_per_epoch);
  return state;
}

}  // namespace ltrain::engine
