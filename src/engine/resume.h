#pragma once
// Where a run starts (afresh, or from the checkpoint checkpoint.resume names), how far it goes,
// and the loop's progress that a checkpoint carries so that a resumed run continues exactly.
// Private to engine: the trainer's and the dry-run plan's part.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "early_stopping.h"
#include "ltrain/config/load.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/train_step.h"

namespace ltrain::engine {

// ---- How far a run goes ----

/// A run's length in optimizer steps: run.epochs of `steps_per_epoch`, capped by run.max_steps.
struct RunLength {
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t epochs = 0;         // the epochs total_steps begin (the last one may be cut short)
  bool by_max_steps = false;  // run.max_steps, not run.epochs, sets where the run ends
};

RunLength run_length(const config::RunConfig& config, int64_t steps_per_epoch);

/// The epochs `steps` begin, at `steps_per_epoch` steps per epoch.
int64_t epochs_of(int64_t steps, int64_t steps_per_epoch);

/// "run.epochs 3 of 78 steps" or "run.max_steps 100": what sets the run's length.
std::string length_text(const config::RunConfig& config, const RunLength& length);

// ---- Where a run starts ----

/// Where a run starts: its directory and, when it resumes, the checkpoint it resumes from.
struct StartPoint {
  std::filesystem::path run_dir;  // empty: a new one under run.out_dir
  std::optional<FoundCheckpoint> resume;
};

/// checkpoint.resume -> the run directory and checkpoint to continue from. ConfigError for a file
/// that is not there, DataError for a checkpoint that cannot be resumed (named, with why); nothing
/// is created here.
StartPoint choose_start(const config::LoadedConfig& loaded);

/// ConfigError naming run.max_steps (or run.epochs) when the checkpoint a run resumes from is past
/// the steps the config runs: one line before anything is written, with the setting that goes on.
void check_steps_left(const config::LoadedConfig& loaded, const StartPoint& start, const RunLength& length);

/// The run.name `checkpoint` was written under ("" when its config lacks one).
std::string saved_run_name(const Checkpoint& checkpoint);

/// Warns of each setting that changed since `saved` (a checkpoint's config) and changes what the
/// run computes: where it writes, how often it logs or checkpoints, and checkpoint.resume itself
/// are no news.
void warn_of_changed_settings(const nlohmann::json& saved, const config::RunConfig& config);

// ---- The progress a checkpoint carries ----

/// What the loop accumulates beyond the model and optimizer.
struct RunningSums {
  StepTotals epoch;            // loss, hits and images of the epoch in progress
  double epoch_seconds = 0.0;  // its time in training steps
  double train_seconds = 0.0;  // time in training steps of the epochs before it
  double wall_seconds = 0.0;   // the run's time after set-up, its earlier processes' up to this checkpoint
  double final_test_accuracy = 0.0;
  double final_test_loss = 0.0;
  double best_test_accuracy = 0.0;
  int64_t best_epoch = 0;
  double best_metric = 0.0;  // checkpoint.best_metric's value in best.ltc
  bool has_best_metric = false;
  double last_scale = 0.0;  // the GradScaler's scale and skipped steps at the last read (fp16)
  int64_t skipped_steps = 0;
};

/// Where a loop begins: the step, the epoch it falls in and the steps of that epoch done, and
/// whether that epoch's end (its evaluation, its metrics row) came at this step. A fresh run:
/// step 0 of epoch 1.
struct ResumePoint {
  int64_t step = 0;
  int64_t epoch = 1;  // the epoch the next step (or the pending evaluation) belongs to
  int64_t index = 0;  // steps of that epoch done
  bool epoch_ended = false;
};

/// What a resumed run takes from its checkpoint besides the tensors.
struct ResumeState {
  RunningSums sums;
  EarlyStopping::Standing early_stop;
  ResumePoint point;
};

/// The checkpoint's progress (CheckpointMeta::progress) for `sums` and `early_stop`; `epoch_ended`:
/// written after its epoch's end (evaluation, metrics row). JSON keeps the numbers exactly; inf
/// and NaN (a diverged run's test loss) travel as strings.
nlohmann::json progress_json(const RunningSums& sums, const EarlyStopping::Standing& early_stop, bool epoch_ended);

/// The progress of `found` read back, and where its run picks up at `steps_per_epoch` steps per
/// epoch: taken from the step alone, so that a run whose epoch was cut short by run.max_steps, or
/// which now has another run.max_steps or run.epochs, goes on from where it stood. DataError
/// naming the file when the progress holds a value of the wrong type.
ResumeState read_resume_state(const FoundCheckpoint& found, int64_t steps_per_epoch);

}  // namespace ltrain::engine
