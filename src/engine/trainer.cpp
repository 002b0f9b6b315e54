#include "ltrain/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "early_stopping.h"
#include "ltrain/amp/precision.h"
#include "ltrain/core/files.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/log.h"
#include "ltrain/core/progress.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/dist/group.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/ema.h"
#include "ltrain/engine/evaluator.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"
#include "ltrain/optim/schedule.h"
#include "resume.h"
#include "run_report.h"

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

double seconds_since(std::chrono::system_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::system_clock::now() - start).count();
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
  if (precision_plan(config.precision).grad_scaler) {
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

/// The config as a run directory's config.json keeps it: checkpoint.resume says how one process
/// started, not what the run is, so the file holds "none" (run again, it starts a new run).
nlohmann::json saved_config_json(const config::RunConfig& config) {
  nlohmann::json saved = config::to_json(config);
  saved["checkpoint"]["resume"] = config::CheckpointSection{}.resume;
  return saved;
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
/// meets them. Built from a Run (the objects) and a StartPoint (where it begins). Where it starts
/// and what a checkpoint carries are resume.h's; what it reports beside the loop, run_report.h's;
/// when it stops early, early_stopping.h's.
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
  /// The checkpoint's weights, optimizer and scaler, its sums and early stopping, and where it
  /// picks up.
  void resume_from_checkpoint();
  /// Every rank starts from rank 0's weights and buffers, at the same step.
  void share_weights(dist::Group& group);
  /// optim.ema_decay: the average from the weights now in the model, or the checkpoint's average.
  void start_ema();
  /// Interrupted (exit code 130) for a signal, RunError (exit code 4) for a console that refused a
  /// write: a stop asked for during set-up, before anything is written.
  [[noreturn]] void stop_during_setup() const;
  /// A run resumed at its end whose summary is written: its results and one line, nothing written.
  TrainResult report_nothing_to_train();
  void open_run_directory();
  /// metrics.csv/jsonl (and the TensorBoard events) with the run's first row and provenance.
  void open_metrics();
  /// The run's time after set-up so far: its earlier processes' up to the checkpoint this one
  /// resumed from, and this process's.
  double run_elapsed() const { return sums_.wall_seconds + seconds_since(run_start_); }

  // ---- Epochs ----
  /// The epochs from begin_ to the last, or to an early stop.
  void train_epochs();
  void train_epoch(int64_t epoch);
  /// The log interval ending at step_: the loop's only host sync. Reads the step totals, logs,
  /// writes metrics, and a checkpoint where one is due (or a stop was asked for).
  void end_log_interval(int64_t epoch, int64_t index, int64_t epoch_steps, bool stop, bool periodic_checkpoint);
  /// Whether a progress line is due before this process's first log interval: after its first
  /// step, then every kEarlyProgressSeconds (a host sync each, never more often).
  bool early_progress_due() const;
  /// That line, from this process's sums so far in the interval, which stay for end_log_interval.
  void show_early_progress(int64_t epoch, int64_t index, int64_t epoch_steps);
  /// Evaluation where due, with the EMA weights where kept; updates the best result and early
  /// stopping's count.
  std::optional<EvalResult> evaluate(int64_t epoch, bool last_epoch, bool& new_best);
  /// Whether `evaluation` beats checkpoint.best_metric's best so far (then it is the best).
  bool take_best_metric(const EvalResult& evaluation);
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
  /// The run's results from the sums.
  TrainResult result() const;
  /// The results logged ("done: ...") and in summary.json.
  TrainResult summarize();
  /// Whether summary.json of a run whose checkpoint is at its last step exists (rank 0's answer).
  bool summary_written();

  Run& run_;
  const config::RunConfig& config_;
  StartPoint start_;
  const TrainHooks& hooks_;
  RunLength length_;
  optim::LrSchedule schedule_;
  RunningSums sums_;
  EarlyStopping early_stopping_;
  double resumed_train_seconds_ = 0.0;  // sums_'s training time when this process took over
  ResumePoint begin_;                   // where this process's loop begins (a fresh run: step 0)
  int64_t step_ = 0;                    // the steps done
  int64_t batch_side_ = 0;              // the last epoch's side of training images
  std::optional<Ema> ema_;              // optim.ema_decay
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
      length_(run_length(config_, run.train_loader().batches_per_epoch())),
      schedule_(schedule_options(config_.schedule), config_.optim.lr, length_.total_steps, length_.steps_per_epoch),
      early_stopping_(config_.run),
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
  if (hooks_.after_setup) hooks_.after_setup();
  if (stop_due(true)) stop_during_setup();
  result_.epochs = std::min(begin_.epoch_ended ? epochs_of(step_, length_.steps_per_epoch) : begin_.epoch - 1,
                            length_.epochs);
  // A run resumed at its last step after that step's evaluation has nothing left to train: where
  // its summary was written, one line and nothing written; else (stopped after its last
  // evaluation) it writes the summary.
  const bool nothing_left = start_.resume && step_ == length_.total_steps && begin_.epoch_ended;
  if (nothing_left && summary_written()) return report_nothing_to_train();

  open_run_directory();
  log_start(run_, start_, begin_, length_, run_dir_);
  open_metrics();
  progress_.emplace(run_.console_process() && stderr_is_terminal() && !log::json_console());
  result_.run_dir = run_dir_;
  result_.startup_seconds = seconds_since(started_);
  run_start_ = Clock::now();
  // A run resumed from its early stop's checkpoint stays stopped (unless the patience grew).
  stopped_early_ = early_stopping_.due() && begin_.epoch <= length_.epochs;
  if (nothing_left)
    spdlog::info("{} is at step {}, the end of this run ({}), after its last evaluation: nothing left to train; "
                 "writing the run's summary",
                 start_.resume->file.string(), step_, length_text(config_, length_));
  else
    train_epochs();
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
  if (start_.resume) resume_from_checkpoint();
  if (dist::Group* group = run_.group()) share_weights(*group);
  // optim.ema_decay: from the (broadcast, or resumed) weights on.
  if (config_.optim.ema_decay > 0.0) start_ema();
}

void Trainer::resume_from_checkpoint() {
  const FoundCheckpoint& found = *start_.resume;
  restore_training_state(found.checkpoint, found.file, *run_.model(), run_.optimizer(), run_.scaler());
  const ResumeState state = read_resume_state(found, length_.steps_per_epoch);
  sums_ = state.sums;
  early_stopping_ = EarlyStopping(config_.run, state.early_stop);
  resumed_train_seconds_ = sums_.train_seconds + sums_.epoch_seconds;
  begin_ = state.point;
  step_ = begin_.step;
}

void Trainer::share_weights(dist::Group& group) {
  // Each rank found its checkpoint itself: on machines that do not share run.out_dir they may
  // differ, and ranks at different steps would not issue the same collectives.
  const std::vector<std::string> steps = group.all_gather_text("start_step", std::to_string(step_));
  for (size_t rank = 1; rank < steps.size(); ++rank)
    if (steps[rank] != steps[0])
      throw ConfigError(fmt::format("rank {} starts at step {} and rank 0 at step {} (checkpoint.resume \"{}\"): "
                                    "every process must find the same checkpoint; on several machines, give "
                                    "run.out_dir a folder they share, or copy the run folder to the same path on each",
                                    rank, steps[rank], steps[0], config_.checkpoint.resume));
  // Every rank starts from rank 0's weights and buffers (a resumed run: the same file anyway).
  group.broadcast_from_main(model_state(*run_.model()));
  if (config_.distributed.sync_batch_norm)
    run_.model()->synchronize_batch_norm(
        [shared = &group](const torch::Tensor& values) { return dist::all_reduce_sum_differentiable(*shared, values); });
}

void Trainer::start_ema() {
  ema_.emplace(*run_.model(), config_.optim.ema_decay);
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

void Trainer::stop_during_setup() const {
  if (const std::optional<files::WriteError> console = log::console_failure())
    throw RunError(fmt::format("{} during set-up, before step {}; nothing was written: run the same command again "
                               "with its output going where it can be written",
                               console->what(), step_ + 1));
  throw Interrupted(fmt::format("stopped by {} during set-up, before step {}; nothing was written: run the same "
                                "command again",
                                stop_cause(), step_ + 1));
}

TrainResult Trainer::report_nothing_to_train() {
  result_.run_dir = start_.run_dir;
  result_.startup_seconds = seconds_since(started_);
  run_start_ = Clock::now();
  const TrainResult done = result();
  log_nothing_to_train(done, start_.resume->file, length_text(config_, length_));
  return done;
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
    io::truncate_metrics(run_dir_, step_, /*epoch_row_at_step_kept=*/begin_.epoch_ended);
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

void Trainer::open_metrics() {
  if (!run_.main_process()) return;
  metrics_.emplace(run_dir_, config_.run.tensorboard);
  const nlohmann::json saved_config = saved_config_json(config_);
  provenance_ = io::provenance(run_.loaded().files, saved_config, started_);
  metrics_->write_run(begin_.epoch, step_, provenance_, saved_config);
}

void Trainer::train_epochs() {
  try {
    for (int64_t epoch = begin_.epoch; epoch <= length_.epochs && !stopped_early_; ++epoch) {
      train_epoch(epoch);
      bool new_best = false;
      const std::optional<EvalResult> evaluation = evaluate(epoch, epoch == length_.epochs, new_best);
      stopped_early_ = evaluation && early_stopping_.due() && epoch < length_.epochs;
      // An early stop ends the run as its last epoch would: checkpoint, then the summary.
      end_epoch(epoch, epoch == length_.epochs || stopped_early_, evaluation, new_best);
      if (stopped_early_) spdlog::info("{}", early_stopping_.stop_text(epoch, length_.epochs));
    }
  } catch (const c10::Error& error) {
    if (compat::is_out_of_memory(error)) throw out_of_memory_error(config_, error);
    throw;
  } catch (const files::WriteError& error) {
    throw files::WriteError(fmt::format("{}; the checkpoints already in {} are intact: once it is fixed, the same "
                                        "command with --set checkpoint.resume=auto continues the run",
                                        error.what(), checkpoint_dir_.string()));
  }
}

void Trainer::train_epoch(int64_t epoch) {
  data::TrainLoader& loader = run_.train_loader();
  loader.set_epoch(epoch - 1);
  if (config_.data.progressive_start_size > 0 && loader.batch_side() != batch_side_)
    spdlog::info("epoch {}: training images {}x{} (progressive resizing; full size from epoch {})", epoch,
                 loader.batch_side(), loader.batch_side(), config_.data.progressive_epochs + 1);
  batch_side_ = loader.batch_side();
  const int64_t epoch_steps =
      std::min(length_.steps_per_epoch, length_.total_steps - (epoch - 1) * length_.steps_per_epoch);
  const int64_t first = epoch == begin_.epoch ? begin_.index : 0;
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
  progress_->update({epoch, length_.epochs, step_, length_.total_steps, index + 1, epoch_steps, totals.mean_loss(),
                     totals.accuracy(), lr, images_per_second,
                     seconds_per_step * static_cast<double>(length_.total_steps - step_)});
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
  return step_ == begin_.step + 1 || seconds_since(early_progress_shown_) >= kEarlyProgressSeconds;
}

void Trainer::show_early_progress(int64_t epoch, int64_t index, int64_t epoch_steps) {
  const StepTotals totals = train_step_->peek_totals();
  const double seconds_per_step = seconds_since(run_start_) / static_cast<double>(step_ - begin_.step);
  progress_->update({epoch, length_.epochs, step_, length_.total_steps, index + 1, epoch_steps, totals.mean_loss(),
                     totals.accuracy(), schedule_.at(step_ - 1),
                     static_cast<double>(totals.images) / seconds_since(interval_start_),
                     seconds_per_step * static_cast<double>(length_.total_steps - step_)});
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
  early_stopping_.record(epoch, evaluation);
  new_best = take_best_metric(evaluation);
  return evaluation;
}

bool Trainer::take_best_metric(const EvalResult& evaluation) {
  if (config_.checkpoint.best_metric == config::BestMetric::none) return false;
  const bool accuracy = config_.checkpoint.best_metric == config::BestMetric::test_acc;
  const double value = accuracy ? evaluation.accuracy : evaluation.loss;
  if (sums_.has_best_metric && !(accuracy ? value > sums_.best_metric : value < sums_.best_metric)) return false;
  sums_.best_metric = value;
  sums_.has_best_metric = true;
  return true;
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
  nlohmann::json fields{{"event", "epoch"}, {"epoch", epoch}, {"epochs", length_.epochs}, {"step", step_}};
  for (const auto& [key, value] : epoch_values) fields[key] = value;
  {
    const log::JsonFields json_fields(fields);  // this line's only: the checkpoint lines below are not the epoch's
    spdlog::info("epoch {}/{} | train loss {:.4f} acc {:.2f}%{} | {:.0f} img/s | {} elapsed", epoch, length_.epochs,
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
  const int64_t done = step_ - (epoch - 1) * length_.steps_per_epoch;
  const bool whole = epoch_ended && done == length_.steps_per_epoch;
  CheckpointMeta meta;
  meta.epoch = whole ? epoch : epoch - 1;
  meta.step = step_;
  meta.epoch_steps_done = whole ? 0 : done;
  meta.config = config::to_json(config_);
  RunningSums sums = sums_;
  sums.wall_seconds = run_elapsed();  // up to this checkpoint
  meta.progress = progress_json(sums, early_stopping_.standing(), epoch_ended);
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

TrainResult Trainer::result() const {
  TrainResult result = result_;
  result.steps = step_;
  result.final_test_accuracy = sums_.final_test_accuracy;
  result.final_test_loss = sums_.final_test_loss;
  result.best_test_accuracy = sums_.best_test_accuracy;
  result.best_epoch = sums_.best_epoch;
  result.train_seconds = sums_.train_seconds;
  result.process_wall_seconds = seconds_since(run_start_);
  result.wall_seconds = sums_.wall_seconds + result.process_wall_seconds;
  result.resumed_at_step = begin_.step;
  result.stopped_early = stopped_early_;
  result.process_train_seconds = sums_.train_seconds - resumed_train_seconds_;
  result.images_per_second =
      result.train_seconds > 0
          ? static_cast<double>(step_ * run_.train_loader().images_per_step() * run_.ranks()) / result.train_seconds
          : 0.0;
  result.peak_memory_bytes = compat::peak_memory_bytes(run_.device());
  result.peak_reserved_bytes = compat::peak_reserved_bytes(run_.device());
  return result;
}

TrainResult Trainer::summarize() {
  const TrainResult done = result();
  log_summary(done, config_, early_stopping_.standing());
  if (run_.main_process()) {
    write_summary(run_dir_, done, config_, provenance_);
    log::throw_if_file_failed();
    log::remove_file();
  }
  return done;
}

}  // namespace

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
  check_steps_left(loaded, start, run_length(loaded.config, run.train_loader().batches_per_epoch()));
  Trainer trainer(run, std::move(start), hooks, started);
  return trainer.train();
}

}  // namespace ltrain::engine
