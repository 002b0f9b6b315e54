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
#include "ltrain/engine/run.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/engine/ema.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"
#include "ltrain/optim/schedule.h"

namespace ltrain::engine {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
/// Before the first log interval, a progress line this often (and after the first step), so that a
/// slow start shows that the run is under way.
constexpr double kEarlyProgressSeconds = 5.0;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool due(int64_t epoch, int64_t every, bool last) { return last || (every > 0 && epoch % every == 0); }

/// The run's optimizer steps: run.epochs of `steps_per_epoch`, capped by run.max_steps.
int64_t total_steps_of(const config::RunConfig& config, int64_t steps_per_epoch) {
  const int64_t all = config.run.epochs * steps_per_epoch;
  return config.run.max_steps > 0 ? std::min(config.run.max_steps, all) : all;
}

/// The epochs `total_steps` begin (the last one may be cut short by run.max_steps).
int64_t epochs_of(int64_t total_steps, int64_t steps_per_epoch) {
  return (total_steps + steps_per_epoch - 1) / steps_per_epoch;
}

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
  if (!std::isfinite(totals.mean_loss())) {
    // The onecycle schedule refuses schedule.warmup_epochs: its warm-up is schedule.pct_start.
    const std::string warm_up =
        config.schedule.name == config::ScheduleKind::onecycle
            ? fmt::format("raise schedule.pct_start (now {}) for a longer warm-up", config.schedule.pct_start)
            : fmt::format("set a longer schedule.warmup_epochs (now {})", config.schedule.warmup_epochs);
    throw RunError(fmt::format("the training loss became {} by step {} (epoch {}): lower optim.lr (now {}), {}, or "
                               "check the data and data.std; checkpoints already in {} are intact",
                               totals.mean_loss(), step, epoch, config.optim.lr, warm_up, checkpoint_dir.string()));
  }
}

/// A value of `metric` as the log shows it: "18.90%" (test_acc), "0.1550" (test_loss).
std::string metric_text(config::BestMetric metric, double value) {
  return metric == config::BestMetric::test_acc ? fmt::format("{:.2f}%", 100.0 * value) : fmt::format("{:.4f}", value);
}

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

/// What the loop accumulates beyond the model and optimizer; a checkpoint carries it (as JSON,
/// whose numbers round-trip exactly) so that a resumed run continues the same sums.
struct RunningSums {
  StepTotals epoch;            // loss, hits and images of the epoch in progress
  double epoch_seconds = 0.0;  // its time in training steps
  double train_seconds = 0.0;  // time in training steps of the epochs before it
  double wall_seconds = 0.0;   // the run's earlier processes' time after set-up, up to this checkpoint
  double final_test_accuracy = 0.0;
  double final_test_loss = 0.0;
  double best_test_accuracy = 0.0;
  int64_t best_epoch = 0;
  double best_metric = 0.0;  // checkpoint.best_metric's value in best.ltc
  bool has_best_metric = false;
  double last_scale = 0.0;  // the GradScaler's scale and skipped steps at the last read (fp16)
  int64_t skipped_steps = 0;
  double early_stop_best = 0.0;  // run.early_stop_metric's best value, its epoch, evaluations since
  int64_t early_stop_best_epoch = 0;
  int64_t evaluations_without_improvement = 0;

  nlohmann::json to_json() const {
    return {{"epoch_loss_sum", number(epoch.loss_sum)}, {"epoch_correct", epoch.correct},
            {"epoch_images", epoch.images},             {"epoch_seconds", number(epoch_seconds)},
            {"train_seconds", number(train_seconds)},   {"final_test_accuracy", number(final_test_accuracy)},
            {"final_test_loss", number(final_test_loss)}, {"best_test_accuracy", number(best_test_accuracy)},
            {"best_epoch", best_epoch},                 {"best_metric", number(best_metric)},
            {"has_best_metric", has_best_metric},       {"last_scale", number(last_scale)},
            {"skipped_steps", skipped_steps},           {"wall_seconds", number(wall_seconds)},
            {"early_stop_best", number(early_stop_best)}, {"early_stop_best_epoch", early_stop_best_epoch},
            {"evaluations_without_improvement", evaluations_without_improvement}};
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
    s.wall_seconds = number(j, "wall_seconds");
    s.early_stop_best = number(j, "early_stop_best");
    s.early_stop_best_epoch = j.value("early_stop_best_epoch", int64_t{0});
    s.evaluations_without_improvement = j.value("evaluations_without_improvement", int64_t{0});
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

/// The run.name `checkpoint` was written under ("" when its config lacks one).
std::string saved_run_name(const Checkpoint& checkpoint) {
  const nlohmann::json& saved = checkpoint.meta.config;
  if (!saved.is_object() || !saved.contains("run") || !saved["run"].is_object()) return "";
  const nlohmann::json& name = saved["run"].value("name", nlohmann::json());
  return name.is_string() ? name.get<std::string>() : "";
}

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

/// Where a resumed run picks up in a run of `steps_per_epoch` steps per epoch: the step, the epoch
/// it falls in and the steps of that epoch done, and whether that epoch's end (its evaluation, its
/// metrics row) came at this step. Taken from the step alone, so that a run whose epoch was cut
/// short by run.max_steps, or which now has another run.max_steps or run.epochs, goes on from
/// where it stood.
struct ResumePoint {
  int64_t step = 0;
  int64_t epoch = 1;  // the epoch the next step (or the pending evaluation) belongs to
  int64_t index = 0;  // steps of that epoch done
  bool epoch_ended = false;
};

ResumePoint resume_point(const FoundCheckpoint& found, int64_t steps_per_epoch) {
  const CheckpointMeta& meta = found.checkpoint.meta;
  ResumePoint point;
  point.step = meta.step;
  // Checkpoints written at an epoch's end say so; those of earlier versions have no steps of the
  // next epoch done there (even where run.max_steps cut that epoch short).
  const nlohmann::json ended = meta.progress.value("epoch_ended", nlohmann::json(meta.epoch_steps_done == 0));
  if (!ended.is_boolean())
    throw DataError(fmt::format("{}: its training progress holds a value of the wrong type; use an earlier checkpoint",
                                found.file.string()));
  point.epoch_ended = ended.get<bool>() || meta.step == 0;
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

/// Whether run.max_steps, not run.epochs, sets where the run ends.
bool ended_by_max_steps(const config::RunConfig& config, int64_t steps_per_epoch) {
  return config.run.max_steps > 0 && config.run.max_steps < config.run.epochs * steps_per_epoch;
}

/// "run.epochs 3 of 78 steps" or "run.max_steps 100": what sets the run's length.
std::string length_text(const config::RunConfig& config, int64_t steps_per_epoch) {
  return ended_by_max_steps(config, steps_per_epoch)
             ? fmt::format("run.max_steps {}", config.run.max_steps)
             : fmt::format("run.epochs {} of {} steps", config.run.epochs, steps_per_epoch);
}

/// ConfigError naming run.max_steps (or run.epochs) when the checkpoint a run resumes from is past
/// the steps the config runs: one line before anything is written, with the setting that goes on.
void check_steps_left(const config::LoadedConfig& loaded, const StartPoint& start, int64_t steps_per_epoch) {
  if (!start.resume) return;
  const config::RunConfig& config = loaded.config;
  const int64_t total = total_steps_of(config, steps_per_epoch);
  const int64_t step = start.resume->checkpoint.meta.step;
  if (step <= total) return;
  const bool by_max_steps = ended_by_max_steps(config, steps_per_epoch);
  const int64_t epochs_needed = step / steps_per_epoch + 1;
  const std::string go_on =
      by_max_steps ? fmt::format("set run.max_steps above {} (0: no limit){}", step,
                                 config.run.epochs < epochs_needed
                                     ? fmt::format(" and run.epochs to {} or more", epochs_needed)
                                     : std::string())
                   : fmt::format("set run.epochs to {} or more", epochs_needed);
  throw config::config_error(
      loaded, by_max_steps ? "run.max_steps" : "run.epochs",
      fmt::format("{} is at step {}, past the {} steps this config runs ({}); {} to train further, or start a new "
                  "run (checkpoint.resume \"none\")",
                  start.resume->file.string(), step, total, length_text(config, steps_per_epoch), go_on));
}

/// The config as a run directory's config.json keeps it: checkpoint.resume says how one process
/// started, not what the run is, so the file holds "none" (run again, it starts a new run).
nlohmann::json saved_config_json(const config::RunConfig& config) {
  nlohmann::json saved = config::to_json(config);
  saved["checkpoint"]["resume"] = config::CheckpointSection{}.resume;
  return saved;
}

/// Warns of each setting that changed since `saved` (a checkpoint's config) and changes what the
/// run computes: where it writes, how often it logs or checkpoints, and checkpoint.resume itself
/// are no news.
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

/// True on every rank when `value` is true on any (a collective: every rank must call it).
bool any_rank(dist::Group& group, bool value, const torch::Device& device) {
  torch::Tensor flag = torch::full({1}, value ? 1 : 0, torch::TensorOptions().dtype(torch::kInt32).device(device));
  group.all_reduce_sum({flag}).wait();
  return flag.item<int32_t>() > 0;
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

/// One training run: the loop's state, and the parts of the loop as methods in the order a run
/// meets them. Built from a Run (the objects) and a StartPoint (where it begins).
class Trainer {
 public:
  /// `started`: when the command began, for the provenance record.
  Trainer(Run& run, StartPoint start, const TrainHooks& hooks, std::chrono::system_clock::time_point started);

  /// Start-up (weights, run directory, logs), then the epochs, then the summary; then the
  /// process group is left in order (after a stop on a signal too).
  TrainResult train();

 private:
  TrainResult train_to_the_end();
  /// Destroys what holds the group's communicators, then closes the group (a collective).
  void leave_group();

  // ---- Start-up ----
  void restore_or_share_weights();
  void open_run_directory();
  void log_start() const;
  /// The run's time after set-up so far: its earlier processes' up to the checkpoint this one
  /// resumed from, and this process's.
  double run_elapsed() const { return sums_.wall_seconds + seconds_since(run_start_); }

  // ---- Epochs ----
  void train_epoch(int64_t epoch);
  /// The log interval ending at step_: the loop's only host sync. Reads the step totals, logs,
  /// writes metrics, and a checkpoint where one is due (or a stop was asked for).
  void end_log_interval(int64_t epoch, int64_t index, int64_t epoch_steps, bool stop, bool periodic_checkpoint);
  /// Whether a progress line is due before this process's first log interval: after its first
  /// step, then every kEarlyProgressSeconds (a host sync each, never more often).
  bool early_progress_due() const;
  /// That line, from this process's sums so far in the interval, which stay for end_log_interval.
  void show_early_progress(int64_t epoch, int64_t index, int64_t epoch_steps);
  /// Evaluation where due, with the EMA weights where kept; updates the best result.
  std::optional<EvalResult> evaluate(int64_t epoch, bool last_epoch, bool& new_best);
  /// Counts the evaluations since run.early_stop_metric last improved by more than
  /// run.early_stop_min_delta.
  void track_early_stop(int64_t epoch, const EvalResult& evaluation);
  /// Whether run.early_stop_metric has gone run.early_stop_patience evaluations without improving.
  bool early_stop_due() const;
  void end_epoch(int64_t epoch, bool last_epoch, const std::optional<EvalResult>& evaluation, bool new_best);

  // ---- Checkpoints and the end ----
  /// A checkpoint of the state after step_, in `epoch`; `epoch_ended`: after that epoch's end
  /// (its evaluation and metrics row), which may come before its last step (run.max_steps).
  void write_checkpoint(const fs::path& file, int64_t epoch, bool epoch_ended,
                        const std::map<std::string, double>& values);
  /// Whether the loop stops at this step: a stop signal, or a console that refused a write (with
  /// several processes: on any of them; a collective then).
  bool stop_due(bool collective) const;
  /// After the checkpoint `file`: Interrupted (exit code 130) for a signal, RunError (exit code 4)
  /// for a console that refused a write. `last`: the run's last step and evaluation were done, only
  /// its summary is left.
  [[noreturn]] void stop_for_signal(const fs::path& file, bool last = false) const;
  /// The run's results from the sums; `write`: also logged ("done: ...") and in summary.json.
  TrainResult summarize(bool write = true);
  /// Whether summary.json of a run whose checkpoint is at its last step exists (rank 0's answer).
  bool summary_written();

  Run& run_;
  const config::RunConfig& config_;
  StartPoint start_;
  const TrainHooks& hooks_;
  int64_t steps_per_epoch_;
  int64_t total_steps_;
  int64_t epochs_;
  optim::LrSchedule schedule_;
  RunningSums sums_;
  double resumed_train_seconds_ = 0.0;  // sums_'s training time when this process took over
  int64_t first_epoch_ = 1, first_index_ = 0, step_ = 0;  // where the loop begins; step_ then counts
  int64_t resumed_at_step_ = 0;                          // where this process began
  bool ended_at_start_ = false;  // the epoch's end (evaluation, metrics row) came at the resumed step
  int64_t batch_side_ = 0;                               // the last epoch's side of training images
  std::optional<Ema> ema_;                 // optim.ema_decay
  // Optional only to be destroyed before the group closes (see train()).
  std::optional<TrainStep> train_step_;
  std::optional<Evaluator> evaluator_;
  fs::path run_dir_, checkpoint_dir_;
  std::optional<io::MetricsLog> metrics_;
  std::optional<Progress> progress_;
  TrainResult result_;
  Clock::time_point run_start_;
  Clock::time_point interval_start_;
  Clock::time_point early_progress_shown_;  // the last line before the first log interval
  bool log_interval_ended_ = false;         // in this process
  bool stopped_early_ = false;              // run.early_stop_metric ended the run before run.epochs
  std::chrono::system_clock::time_point started_;
  nlohmann::json provenance_;  // where the results come from (rank 0)
};

Trainer::Trainer(Run& run, StartPoint start, const TrainHooks& hooks, std::chrono::system_clock::time_point started)
    : run_(run),
      config_(run.config()),
      start_(std::move(start)),
      hooks_(hooks),
      steps_per_epoch_(run.train_loader().batches_per_epoch()),
      total_steps_(total_steps_of(config_, steps_per_epoch_)),
      epochs_(epochs_of(total_steps_, steps_per_epoch_)),
      schedule_(config_.schedule, config_.optim.lr, total_steps_, steps_per_epoch_),
      started_(started) {}

TrainResult Trainer::train() {
  try {
    TrainResult result = train_to_the_end();
    leave_group();
    return result;
  } catch (const Interrupted&) {
    // Every rank stops at the same step (they agree on it), so they can leave together too. A
    // peer gone meanwhile leaves this rank to Group's destructor, which aborts.
    try {
      leave_group();
    } catch (const PeerError& error) {
      spdlog::debug("leaving the process group after the stop: {}", error.what());
    }
    throw;
  }
}

TrainResult Trainer::train_to_the_end() {
  restore_or_share_weights();
  train_step_.emplace(run_.model(), run_.optimizer(), run_.scaler(), config_, run_.group());
  evaluator_.emplace(run_.model(), run_.eval_loader(), config_, run_.group());
  // A stop asked for during set-up ends the run here, before anything is written.
  if (hooks_.after_setup) hooks_.after_setup();
  if (stop_due(true)) {
    if (const std::optional<files::WriteError> console = log::console_failure())
      throw RunError(fmt::format("{} during set-up, before step {}; nothing was written: run the same command again "
                                 "with its output going where it can be written",
                                 console->what(), step_ + 1));
    throw Interrupted(fmt::format("stopped by {} during set-up, before step {}; nothing was written: run the same "
                                  "command again",
                                  stop_cause(), step_ + 1));
  }
  result_.epochs = std::min(ended_at_start_ ? epochs_of(step_, steps_per_epoch_) : first_epoch_ - 1, epochs_);
  // A run resumed at its last step after that step's evaluation has nothing left to train: where
  // its summary was written, one line and nothing written; else (stopped after its last
  // evaluation) it writes the summary.
  const bool nothing_left = start_.resume && step_ == total_steps_ && ended_at_start_;
  if (nothing_left && summary_written()) {
    result_.run_dir = start_.run_dir;
    result_.startup_seconds = std::chrono::duration<double>(std::chrono::system_clock::now() - started_).count();
    run_start_ = Clock::now();
    const TrainResult result = summarize(/*write=*/false);
    nlohmann::json fields = result_json(result);
    fields["event"] = "done";  // for --json's readers, as at the end of a run
    const log::JsonFields json_fields(fields);
    spdlog::info("nothing to train: {} is at step {}, the end of this run ({}), and the run's summary is written; "
                 "raise run.max_steps or run.epochs to train further",
                 start_.resume->file.string(), step_, length_text(config_, steps_per_epoch_));
    return result;
  }
  open_run_directory();
  log_start();

  if (run_.main_process()) {
    metrics_.emplace(run_dir_, config_.run.tensorboard);
    const nlohmann::json saved_config = saved_config_json(config_);
    provenance_ = io::provenance(run_.loaded().files, saved_config, started_);
    metrics_->write_run(first_epoch_, step_, provenance_, saved_config);
  }
  progress_.emplace(run_.console_process() && stderr_is_terminal() && !log::json_console());
  result_.run_dir = run_dir_;
  result_.startup_seconds = std::chrono::duration<double>(std::chrono::system_clock::now() - started_).count();
  run_start_ = Clock::now();
  // A run resumed from its early stop's checkpoint stays stopped (unless the patience grew).
  stopped_early_ = early_stop_due() && first_epoch_ <= epochs_;
  if (nothing_left)
    spdlog::info("{} is at step {}, the end of this run ({}), after its last evaluation: nothing left to train; "
                 "writing the run's summary",
                 start_.resume->file.string(), step_, length_text(config_, steps_per_epoch_));
  try {
    for (int64_t epoch = first_epoch_; !nothing_left && epoch <= epochs_ && !stopped_early_; ++epoch) {
      train_epoch(epoch);
      bool new_best = false;
      const std::optional<EvalResult> evaluation = evaluate(epoch, epoch == epochs_, new_best);
      stopped_early_ = evaluation && early_stop_due() && epoch < epochs_;
      // An early stop ends the run as its last epoch would: checkpoint, then the summary.
      end_epoch(epoch, epoch == epochs_ || stopped_early_, evaluation, new_best);
      if (stopped_early_)
        spdlog::info("early stop after epoch {} of {}: {} has not improved on its best, {} at epoch {}, by more "
                     "than {:g} in {} evaluations",
                     epoch, epochs_, config::to_string(config_.run.early_stop_metric),
                     metric_text(config_.run.early_stop_metric, sums_.early_stop_best), sums_.early_stop_best_epoch,
                     config_.run.early_stop_min_delta, sums_.evaluations_without_improvement);
    }
  } catch (const c10::Error& error) {
    if (compat::is_out_of_memory(error)) throw out_of_memory_error(config_, error);
    throw;
  } catch (const files::WriteError& error) {
    throw files::WriteError(fmt::format("{}; the checkpoints already in {} are intact: once it is fixed, the same "
                                        "command with --set checkpoint.resume=auto continues the run",
                                        error.what(), checkpoint_dir_.string()));
  }
  return summarize();
}

void Trainer::leave_group() {
  // Their CUDA graphs hold all-reduces captured on the group's NCCL communicators, whose teardown
  // does not return while the graphs are alive.
  train_step_.reset();
  evaluator_.reset();
  run_.close_group();  // no process leaves while another may still need it
}

void Trainer::restore_or_share_weights() {
  models::ResNet& model = run_.model();
  if (start_.resume) {
    const Checkpoint& checkpoint = start_.resume->checkpoint;
    restore_training_state(checkpoint, start_.resume->file, *model, run_.optimizer(), run_.scaler());
    try {
      sums_ = RunningSums::from_json(checkpoint.meta.progress);
    } catch (const nlohmann::json::exception&) {
      throw DataError(fmt::format(
          "{}: its training progress holds a value of the wrong type; use an earlier checkpoint",
          start_.resume->file.string()));
    }
    resumed_train_seconds_ = sums_.train_seconds + sums_.epoch_seconds;
    const ResumePoint point = resume_point(*start_.resume, steps_per_epoch_);
    first_epoch_ = point.epoch;
    first_index_ = point.index;
    ended_at_start_ = point.epoch_ended;
    step_ = point.step;
    resumed_at_step_ = step_;
  }
  if (dist::Group* group = run_.group()) {
    // Each rank found its checkpoint itself: on machines that do not share run.out_dir they may
    // differ, and ranks at different steps would not issue the same collectives.
    const std::vector<std::string> steps = group->all_gather_text("start_step", std::to_string(step_));
    for (size_t rank = 1; rank < steps.size(); ++rank)
      if (steps[rank] != steps[0])
        throw ConfigError(fmt::format("rank {} starts at step {} and rank 0 at step {} (checkpoint.resume \"{}\"): "
                                      "every process must find the same checkpoint; on several machines, give "
                                      "run.out_dir a folder they share, or copy the run folder to the same path on each",
                                      rank, steps[rank], steps[0], config_.checkpoint.resume));
    // Every rank starts from rank 0's weights and buffers (a resumed run: the same file anyway).
    group->broadcast_from_main(model_state(*model));
    if (config_.distributed.sync_batch_norm)
      model->synchronize_batch_norm(
          [group](const torch::Tensor& values) { return dist::all_reduce_sum_differentiable(*group, values); });
  }
  // optim.ema_decay: from the (broadcast, or resumed) weights on.
  if (config_.optim.ema_decay <= 0.0) return;
  ema_.emplace(*model, config_.optim.ema_decay);
  if (!start_.resume) return;
  const Checkpoint& checkpoint = start_.resume->checkpoint;
  if (checkpoint.ema_weights.empty()) {
    spdlog::warn("{}: no averaged weights in the checkpoint; optim.ema_decay starts its average from the resumed "
                 "weights",
                 start_.resume->file.string());
  } else {
    ema_->load(checkpoint.ema_weights, start_.resume->file);
  }
}

/// Only rank 0 writes: the run directory, logs, metrics and checkpoints. Rank 0 of each other node
/// logs to its console only; the other ranks log warnings and errors only.
void Trainer::open_run_directory() {
  const bool main_process = run_.main_process();
  if (!run_.console_process()) spdlog::set_level(spdlog::level::warn);
  run_dir_ = start_.run_dir;
  if (!main_process) {
    run_dir_ = run_.group()->all_gather_text("run_dir", "")[0];
  } else if (run_dir_.empty()) {
    run_dir_ = io::create_run_dir(config_.run.out_dir, config_.run.name);
  } else {
    std::error_code error;
    fs::create_directories(run_dir_, error);
    if (error)
      throw RunError(fmt::format("{}: cannot create the run folder ({}); set run.out_dir to a writable folder",
                                 run_dir_.string(), error.message()));
    // Rows written after the checkpoint (or by an attempt without one) will be written again.
    io::truncate_metrics(run_dir_, step_, /*epoch_row_at_step_kept=*/ended_at_start_);
  }
  if (run_.group() && main_process) run_.group()->all_gather_text("run_dir", run_dir_.string());
  checkpoint_dir_ = run_dir_ / "checkpoints";
  if (!main_process) return;
  std::error_code error;
  fs::create_directories(checkpoint_dir_, error);
  if (error) throw files::write_error(checkpoint_dir_, "create the folder", error.value());
  log::add_file(run_dir_ / "train.log");
  // Unfinished writes of a run that was killed (SIGKILL, a power cut): never of a living process.
  for (const fs::path& folder : {run_dir_, checkpoint_dir_})
    for (const fs::path& file : files::remove_stale_temporaries(folder))
      spdlog::info("removed {}: an unfinished write of a process that no longer runs", file.string());
  io::write_text_file(run_dir_ / "config.json", saved_config_json(config_).dump(2) + "\n");
}

void Trainer::log_start() const {
  const torch::Device& device = run_.device();
  spdlog::info("ltrain {} | LibTorch {} | device {} | {} CPU threads | seed {}", LTRAIN_VERSION,
               compat::torch_version(), device.str(), torch::get_num_threads(), config_.run.seed);
  spdlog::info("run directory {}{}", run_dir_.string(), run_.main_process() ? "" : " (rank 0's, on its machine)");
  if (const std::string limits = describe_gpu_limits(device, run_.gpu_memory_limit()); !limits.empty())
    spdlog::info("GPU limits: {}", limits);
  if (start_.resume) {
    spdlog::info("resuming from {}: step {}, epoch {} ({} of its {} steps done); {} steps to go",
                 start_.resume->file.string(), step_, first_epoch_, first_index_, steps_per_epoch_,
                 total_steps_ - step_);
    warn_of_changed_settings(start_.resume->checkpoint.meta.config, config_);
    if (start_.run_dir.empty()) {
      const std::string resumed_name = saved_run_name(start_.resume->checkpoint);
      spdlog::info("{}: a new run in {} from its state at step {}",
                   resumed_name != config_.run.name
                       ? fmt::format("run.name \"{}\" is not the checkpoint's run (\"{}\")", config_.run.name,
                                     resumed_name)
                       : std::string("the checkpoint lies in no run folder"),
                   run_dir_.string(), step_);
    }
  } else if (config_.checkpoint.resume == "auto") {
    spdlog::info("checkpoint.resume auto: no valid checkpoint in {}, starting afresh", checkpoint_dir_.string());
  }
  spdlog::info("{}", config::format_table(run_.loaded()));
  const data::TrainLoader& loader = run_.train_loader();
  const int64_t ranks = run_.ranks();
  if (const dist::Group* group = run_.group()) {
    const dist::Environment& environment = group->environment();
    const std::string nodes = environment.local_world_size < ranks
                                  ? fmt::format(" on {} nodes, this is node {},", ranks / environment.local_world_size,
                                                environment.node_rank)
                                  : ",";
    spdlog::info("data-parallel: {} processes ({}){} {} images per process per step{}", ranks, group->backend_name(),
                 nodes, loader.batch_size(), config_.distributed.sync_batch_norm ? ", SyncBatchNorm" : "");
  }
  spdlog::info("model {} ({} stem, width {}): {} parameters{}", config::to_string(config_.model.arch),
               config::to_string(config_.model.stem), config_.model.width, models::count_parameters(*run_.model()),
               config_.model.init_from.empty() ? "" : fmt::format(", weights from {}", config_.model.init_from));
  spdlog::info("data {}: {} training images, {} test images; {} steps per epoch of {} images ({} x {} accumulated), "
               "{} steps in {} epoch(s)",
               config::to_string(config_.data.source), run_.sets().train.size(), run_.sets().test.size(),
               steps_per_epoch_, loader.batch_size() * ranks, config_.optim.accumulation_steps,
               config_.data.batch_size * ranks, total_steps_, epochs_);
  const std::string train_graph =
      config_.cuda_graph.train
          ? fmt::format(" | CUDA graph of the training step after {} eager steps", config_.cuda_graph.warmup_steps)
          : "";
  spdlog::info("precision {}{}{} | optimizer step: {}{}{}", config::to_string(config_.precision.mode),
               run_.scaler().enabled() ? " with a GradScaler" : "", config_.model.channels_last ? " | channels_last" : "",
               run_.optimizer().step_kernel(), train_graph, config_.cuda_graph.eval ? " | CUDA graph of evaluation" : "");
  log::throw_if_file_failed();
}

void Trainer::train_epoch(int64_t epoch) {
  data::TrainLoader& loader = run_.train_loader();
  loader.set_epoch(epoch - 1);
  if (config_.data.progressive_start_size > 0 && loader.batch_side() != batch_side_)
    spdlog::info("epoch {}: training images {}x{} (progressive resizing; full size from epoch {})", epoch,
                 loader.batch_side(), loader.batch_side(), config_.data.progressive_epochs + 1);
  batch_side_ = loader.batch_side();
  const int64_t epoch_steps = std::min(steps_per_epoch_, total_steps_ - (epoch - 1) * steps_per_epoch_);
  const int64_t first = epoch == first_epoch_ ? first_index_ : 0;
  if (first == 0) {
    sums_.epoch = StepTotals();
    sums_.epoch_seconds = 0.0;
  }
  interval_start_ = Clock::now();
  for (int64_t index = first; index < epoch_steps; ++index) {
    run_.optimizer().set_lr(schedule_.at(step_));
    train_step_->run(loader.batch(index));
    if (ema_) ema_->update();
    ++step_;
    if (hooks_.after_step) hooks_.after_step(step_);
    const bool last_of_epoch = index + 1 == epoch_steps;
    // Several processes act on a signal together, at the next log interval, where they agree.
    const bool stop = !run_.group() && stop_due(false);
    // Steps checkpoints inside the epoch; one at its last step waits for the evaluation.
    const bool periodic_checkpoint =
        config_.checkpoint.every_steps > 0 && step_ % config_.checkpoint.every_steps == 0 && !last_of_epoch;
    if (step_ % config_.run.log_every_steps == 0 || last_of_epoch || periodic_checkpoint || stop)
      end_log_interval(epoch, index, epoch_steps, stop, periodic_checkpoint);
    else if (early_progress_due())
      show_early_progress(epoch, index, epoch_steps);
  }
  progress_->clear();
  sums_.train_seconds += sums_.epoch_seconds;
  result_.epochs = epoch;
}

void Trainer::end_log_interval(int64_t epoch, int64_t index, int64_t epoch_steps, bool stop, bool periodic_checkpoint) {
  const StepTotals totals = train_step_->take_totals();
  log_interval_ended_ = true;
  if (run_.group()) stop = stop_due(true);
  const double interval_seconds = seconds_since(interval_start_);
  interval_start_ = Clock::now();
  sums_.epoch_seconds += interval_seconds;
  sums_.epoch.loss_sum += totals.loss_sum;
  sums_.epoch.correct += totals.correct;
  sums_.epoch.images += totals.images;
  check_numerics(config_, totals, step_, epoch, checkpoint_dir_);
  const double lr = schedule_.at(step_ - 1);
  const double images_per_second = static_cast<double>(totals.images) / interval_seconds;
  const double seconds_per_step =
      (sums_.train_seconds + sums_.epoch_seconds) / static_cast<double>(std::max<int64_t>(step_, 1));
  progress_->update({epoch, epochs_, step_, total_steps_, index + 1, epoch_steps, totals.mean_loss(), totals.accuracy(),
                     lr, images_per_second, seconds_per_step * static_cast<double>(total_steps_ - step_)});
  std::map<std::string, double> values{{"lr", lr},
                                       {"train_loss", totals.mean_loss()},
                                       {"train_acc", totals.accuracy()},
                                       {"img_per_s", images_per_second},
                                       {"elapsed_s", run_elapsed()}};
  if (run_.scaler().enabled()) {
    values["loss_scale"] = totals.loss_scale;
    values["skipped_steps"] = static_cast<double>(totals.skipped_steps);
    sums_.last_scale = totals.loss_scale;
    sums_.skipped_steps = totals.skipped_steps;
  }
  // Where the device reports it (CUDA): the caching allocator's counts, no host sync.
  if (const int64_t in_use = compat::memory_in_use_bytes(run_.device()); in_use >= 0) {
    values["gpu_memory_gib"] = static_cast<double>(in_use) / kGiB;
    values["gpu_peak_memory_gib"] = static_cast<double>(compat::peak_memory_bytes(run_.device())) / kGiB;
  }
  if (metrics_) metrics_->write({"step", epoch, step_, values});
  if (stop || periodic_checkpoint) {
    progress_->clear();
    const fs::path file = checkpoint_dir_ / checkpoint_file_name(step_);
    write_checkpoint(file, epoch, /*epoch_ended=*/false, values);
    if (run_.main_process()) prune_checkpoints(checkpoint_dir_, config_.checkpoint.keep_last);
    if (stop) stop_for_signal(file);
  }
  log::throw_if_file_failed();
}

bool Trainer::early_progress_due() const {
  if (log_interval_ended_ || !run_.console_process()) return false;
  return step_ == resumed_at_step_ + 1 || seconds_since(early_progress_shown_) >= kEarlyProgressSeconds;
}

void Trainer::show_early_progress(int64_t epoch, int64_t index, int64_t epoch_steps) {
  const StepTotals totals = train_step_->peek_totals();
  const double seconds_per_step = seconds_since(run_start_) / static_cast<double>(step_ - resumed_at_step_);
  progress_->update({epoch, epochs_, step_, total_steps_, index + 1, epoch_steps, totals.mean_loss(), totals.accuracy(),
                     schedule_.at(step_ - 1), static_cast<double>(totals.images) / seconds_since(interval_start_),
                     seconds_per_step * static_cast<double>(total_steps_ - step_)});
  early_progress_shown_ = Clock::now();
}

std::optional<EvalResult> Trainer::evaluate(int64_t epoch, bool last_epoch, bool& new_best) {
  new_best = false;
  if (!due(epoch, config_.run.eval_every_epochs, last_epoch)) return std::nullopt;
  if (hooks_.before_evaluation) hooks_.before_evaluation(epoch);
  std::optional<Ema::Applied> averaged;  // with optim.ema_decay: evaluate the average
  if (ema_) averaged.emplace(*ema_);
  // Without SyncBatchNorm each rank's running statistics are its own: all evaluate (and rank 0
  // saves) rank 0's, as DistributedDataParallel's broadcast_buffers does.
  if (run_.group()) run_.group()->broadcast_from_main(run_.model()->buffers());
  const EvalResult evaluation = evaluator_->run();
  averaged.reset();
  sums_.final_test_accuracy = evaluation.accuracy;
  sums_.final_test_loss = evaluation.loss;
  if (evaluation.accuracy > sums_.best_test_accuracy || sums_.best_epoch == 0) {
    sums_.best_test_accuracy = evaluation.accuracy;
    sums_.best_epoch = epoch;
  }
  if (config_.run.early_stop_metric != config::BestMetric::none) track_early_stop(epoch, evaluation);
  if (config_.checkpoint.best_metric != config::BestMetric::none) {
    const bool accuracy = config_.checkpoint.best_metric == config::BestMetric::test_acc;
    const double value = accuracy ? evaluation.accuracy : evaluation.loss;
    new_best = !sums_.has_best_metric || (accuracy ? value > sums_.best_metric : value < sums_.best_metric);
    if (new_best) {
      sums_.best_metric = value;
      sums_.has_best_metric = true;
    }
  }
  return evaluation;
}

void Trainer::track_early_stop(int64_t epoch, const EvalResult& evaluation) {
  const bool accuracy = config_.run.early_stop_metric == config::BestMetric::test_acc;
  const double value = accuracy ? evaluation.accuracy : evaluation.loss;
  const double gain = accuracy ? value - sums_.early_stop_best : sums_.early_stop_best - value;
  // A NaN loss is no gain.
  if (sums_.early_stop_best_epoch == 0 || gain > config_.run.early_stop_min_delta) {
    sums_.early_stop_best = value;
    sums_.early_stop_best_epoch = epoch;
    sums_.evaluations_without_improvement = 0;
  } else {
    ++sums_.evaluations_without_improvement;
  }
}

bool Trainer::early_stop_due() const {
  return config_.run.early_stop_metric != config::BestMetric::none &&
         sums_.evaluations_without_improvement >= config_.run.early_stop_patience;
}

/// The epoch's log line and metrics row, then its checkpoints: the state after this epoch.
void Trainer::end_epoch(int64_t epoch, bool last_epoch, const std::optional<EvalResult>& evaluation, bool new_best) {
  const double epoch_images_per_second = static_cast<double>(sums_.epoch.images) / sums_.epoch_seconds;
  std::map<std::string, double> epoch_values{{"lr", schedule_.at(std::max<int64_t>(step_ - 1, 0))},
                                             {"train_loss", sums_.epoch.mean_loss()},
                                             {"train_acc", sums_.epoch.accuracy()},
                                             {"img_per_s", epoch_images_per_second},
                                             {"elapsed_s", run_elapsed()}};
  std::string test_text;
  if (run_.scaler().enabled()) {
    epoch_values["loss_scale"] = sums_.last_scale;
    epoch_values["skipped_steps"] = static_cast<double>(sums_.skipped_steps);
    test_text += fmt::format(" | scale {:g}, {} skipped", sums_.last_scale, sums_.skipped_steps);
  }
  if (evaluation) {
    epoch_values["test_loss"] = evaluation->loss;
    epoch_values["test_acc"] = evaluation->accuracy;
    test_text += fmt::format(" | test loss {:.4f} acc {:.2f}%", evaluation->loss, 100.0 * evaluation->accuracy);
  }
  nlohmann::json fields{{"event", "epoch"}, {"epoch", epoch}, {"epochs", epochs_}, {"step", step_}};
  for (const auto& [key, value] : epoch_values) fields[key] = value;
  {
    const log::JsonFields json_fields(fields);  // this line's only: the checkpoint lines below are not the epoch's
    spdlog::info("epoch {}/{} | train loss {:.4f} acc {:.2f}%{} | {:.0f} img/s | {} elapsed", epoch, epochs_,
                 sums_.epoch.mean_loss(), 100.0 * sums_.epoch.accuracy(), test_text, epoch_images_per_second,
                 format_duration(run_elapsed()));
  }
  if (metrics_) metrics_->write({"epoch", epoch, step_, epoch_values});

  const bool stop = stop_due(true);
  sums_.epoch = StepTotals();
  sums_.epoch_seconds = 0.0;
  const fs::path file = checkpoint_dir_ / checkpoint_file_name(step_);
  if (due(epoch, config_.checkpoint.every_epochs, last_epoch) || stop ||
      (config_.checkpoint.every_steps > 0 && step_ % config_.checkpoint.every_steps == 0)) {
    write_checkpoint(file, epoch, /*epoch_ended=*/true, epoch_values);
    if (run_.main_process()) prune_checkpoints(checkpoint_dir_, config_.checkpoint.keep_last);
  }
  if (new_best) write_checkpoint(checkpoint_dir_ / kBestCheckpointName, epoch, /*epoch_ended=*/true, epoch_values);
  log::throw_if_file_failed();
  // After the last epoch too: the signal's exit code, with the checkpoint of the finished run.
  if (stop) stop_for_signal(file, last_epoch);
}

void Trainer::write_checkpoint(const fs::path& file, int64_t epoch, bool epoch_ended,
                               const std::map<std::string, double>& values) {
  if (!run_.main_process()) return;
  // The steps of `epoch` done; an epoch that ended with all of them done is a whole one.
  const int64_t done = step_ - (epoch - 1) * steps_per_epoch_;
  const bool whole = epoch_ended && done == steps_per_epoch_;
  CheckpointMeta meta;
  meta.epoch = whole ? epoch : epoch - 1;
  meta.step = step_;
  meta.epoch_steps_done = whole ? 0 : done;
  meta.config = config::to_json(config_);
  meta.progress = sums_.to_json();
  meta.progress["wall_seconds"] = run_elapsed();
  meta.progress["epoch_ended"] = epoch_ended;
  for (const auto& [key, value] : values) meta.metrics[key] = value;
  save_checkpoint(file, *run_.model(), &run_.optimizer(), &run_.scaler(), meta,
                  ema_ ? ema_->weights() : NamedTensors{});
  spdlog::info("checkpoint {}", file.string());
}

bool Trainer::stop_due(bool collective) const {
  const bool here = interrupt::stop_requested() || log::console_failure().has_value();
  return collective && run_.group() ? any_rank(*run_.group(), here, run_.device()) : here;
}

void Trainer::stop_for_signal(const fs::path& file, bool last) const {
  const std::string where =
      last ? fmt::format("after the last step ({}) and its evaluation", step_) : fmt::format("after step {}", step_);
  const std::string next = last ? "to write the run's summary" : "to continue";
  // Standard output that refused a write (a closed pipe, a full disk) stops the run as a signal
  // does, with exit code 4 (a RunError: the run's own files are fine).
  if (const std::optional<files::WriteError> console = log::console_failure())
    throw RunError(fmt::format("{}: the run stopped {}; checkpoint {} written: once the output goes where it can be "
                               "written, the same command with --set checkpoint.resume=auto {}",
                               console->what(), where, file.string(), next));
  throw Interrupted(fmt::format("stopped by {} {}; checkpoint {} written: run the same command with --set "
                                "checkpoint.resume=auto (or ={}) {}",
                                stop_cause(), where, file.string(), file.string(), next));
}

bool Trainer::summary_written() {
  const bool here = !start_.run_dir.empty() && fs::exists(start_.run_dir / "summary.json");
  // Rank 0 alone writes the run directory: its answer holds for every rank.
  if (dist::Group* group = run_.group()) return group->all_gather_text("summary_written", here ? "1" : "0")[0] == "1";
  return here;
}

TrainResult Trainer::summarize(bool write) {
  TrainResult result = result_;
  result.steps = step_;
  result.final_test_accuracy = sums_.final_test_accuracy;
  result.final_test_loss = sums_.final_test_loss;
  result.best_test_accuracy = sums_.best_test_accuracy;
  result.best_epoch = sums_.best_epoch;
  result.train_seconds = sums_.train_seconds;
  result.process_wall_seconds = seconds_since(run_start_);
  result.wall_seconds = sums_.wall_seconds + result.process_wall_seconds;
  result.resumed_at_step = resumed_at_step_;
  result.stopped_early = stopped_early_;
  result.process_train_seconds = sums_.train_seconds - resumed_train_seconds_;
  result.images_per_second =
      result.train_seconds > 0
          ? static_cast<double>(step_ * run_.train_loader().batch_size() * run_.ranks()) / result.train_seconds
          : 0.0;
  result.peak_memory_bytes = compat::peak_memory_bytes(run_.device());
  result.peak_reserved_bytes = compat::peak_reserved_bytes(run_.device());
  if (!write) return result;
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
      config_.run.early_stop_metric == config::BestMetric::test_loss
          ? fmt::format(" | test loss {:.4f} (best {:.4f}, epoch {})", result.final_test_loss, sums_.early_stop_best,
                        sums_.early_stop_best_epoch)
          : "";
  spdlog::info("done: {} epoch(s), {} steps in {} (training {}; set-up before them {}{}) | test accuracy {:.2f}% "
               "(best {:.2f}%, epoch {}){} | {:.0f} img/s",
               result.epochs, result.steps, format_duration(result.wall_seconds),
               format_duration(result.train_seconds), format_duration(result.startup_seconds), this_process,
               100.0 * result.final_test_accuracy, 100.0 * result.best_test_accuracy, result.best_epoch, test_loss,
               result.images_per_second);
  if (run_.main_process()) {
    nlohmann::json summary = result_json(result);
    summary["data"] = config::data_summary(config_.data);
    summary["provenance"] = provenance_;
    io::write_text_file(run_dir_ / "summary.json", summary.dump(2) + "\n");
    log::throw_if_file_failed();
    log::remove_file();
  }
  return result;
}

}  // namespace

void check_device_support(const config::LoadedConfig& loaded) {
  resolve_device(loaded);
  check_threads(loaded);
}

RunPlan plan_run(const config::LoadedConfig& loaded) {
  const StartPoint start = choose_start(loaded);
  RunParts parts;  // one process: a dry run joins no group
  parts.weights_from_caller = start.resume.has_value();
  Run run(loaded, parts);
  RunPlan plan;
  plan.device = run.device().str();
  plan.parameters = models::count_parameters(*run.model());
  plan.train_images = run.sets().train.size();
  plan.test_images = run.sets().test.size();
  plan.images_per_step = run.train_loader().batch_size();
  plan.steps_per_epoch = run.train_loader().batches_per_epoch();
  plan.total_steps = total_steps_of(run.config(), plan.steps_per_epoch);
  plan.epochs = epochs_of(plan.total_steps, plan.steps_per_epoch);
  check_steps_left(loaded, start, plan.steps_per_epoch);
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

TrainResult train(const config::LoadedConfig& loaded, const TrainHooks& hooks) {
  const auto started = std::chrono::system_clock::now();
  // From here SIGINT/SIGTERM are requests polled below: before anything is written, after each step.
  const interrupt::StopRequests stop_requests;
  // Everything that can fail on bad input fails here, before the run directory exists.
  StartPoint start = choose_start(loaded);
  RunParts parts;
  parts.data_parallel = true;
  parts.weights_from_caller = start.resume.has_value();  // a resumed run takes the checkpoint's weights
  Run run(loaded, parts);
  check_steps_left(loaded, start, run.train_loader().batches_per_epoch());
  Trainer trainer(run, std::move(start), hooks, started);
  return trainer.train();
}

}  // namespace ltrain::engine
