#pragma once
// run.early_stop_metric: the run ends at an epoch's end once its test metric has gone
// run.early_stop_patience evaluations without improving. Private to engine (the trainer's part).
#include <cstdint>
#include <string>

#include "ltrain/config/config.h"
#include "ltrain/engine/evaluator.h"

namespace ltrain::engine {

/// Counts the evaluations since run.early_stop_metric last beat its best by more than
/// run.early_stop_min_delta, and says when run.early_stop_patience of them end the run. Without
/// run.early_stop_metric it counts nothing and never ends a run.
class EarlyStopping {
 public:
  /// Where the count stands: what a checkpoint carries, so that a resumed run counts on.
  struct Standing {
    double best = 0.0;         // the metric's best value (a test loss may be inf or NaN)
    int64_t best_epoch = 0;    // the epoch of that value; 0: no evaluation yet
    int64_t evaluations_without_improvement = 0;
  };

  /// A run's start: no evaluation counted yet.
  explicit EarlyStopping(const config::RunSection& run);
  /// A resumed run's: the count goes on from `standing`.
  EarlyStopping(const config::RunSection& run, const Standing& standing);

  /// Counts the evaluation after `epoch`: a new best, or one more without an improvement.
  void record(int64_t epoch, const EvalResult& evaluation);
  /// Whether run.early_stop_patience evaluations went by without an improvement.
  bool due() const;
  const Standing& standing() const { return standing_; }
  /// Why the run stops after `epoch` of `epochs`: "early stop after epoch 3 of 10: test_loss has
  /// not improved on its best, 0.1550 at epoch 1, by more than 0.01 in 2 evaluations".
  std::string stop_text(int64_t epoch, int64_t epochs) const;

 private:
  config::BestMetric metric_;
  int64_t patience_;
  double min_delta_;
  Standing standing_;
};

}  // namespace ltrain::engine
