#include "early_stopping.h"

#include <fmt/format.h>

namespace ltrain::engine {
namespace {

/// A value of `metric` as the log shows it: "18.90%" (test_acc), "0.1550" (test_loss).
std::string metric_text(config::BestMetric metric, double value) {
  return metric == config::BestMetric::test_acc ? fmt::format("{:.2f}%", 100.0 * value) : fmt::format("{:.4f}", value);
}

}  // namespace

EarlyStopping::EarlyStopping(const config::RunSection& run) : EarlyStopping(run, Standing()) {}

EarlyStopping::EarlyStopping(const config::RunSection& run, const Standing& standing)
    : metric_(run.early_stop_metric),
      patience_(run.early_stop_patience),
      min_delta_(run.early_stop_min_delta),
      standing_(standing) {}

void EarlyStopping::record(int64_t epoch, const EvalResult& evaluation) {
  if (metric_ == config::BestMetric::none) return;
  const bool accuracy = metric_ == config::BestMetric::test_acc;
  const double value = accuracy ? evaluation.accuracy : evaluation.loss;
  const double gain = accuracy ? value - standing_.best : standing_.best - value;
  // A NaN loss is no gain.
  if (standing_.best_epoch == 0 || gain > min_delta_) {
    standing_.best = value;
    standing_.best_epoch = epoch;
    standing_.evaluations_without_improvement = 0;
  } else {
    ++standing_.evaluations_without_improvement;
  }
}

bool EarlyStopping::due() const {
  return metric_ != config::BestMetric::none && standing_.evaluations_without_improvement >= patience_;
}

std::string EarlyStopping::stop_text(int64_t epoch, int64_t epochs) const {
  return fmt::format("early stop after epoch {} of {}: {} has not improved on its best, {} at epoch {}, by more than "
                     "{:g} in {} evaluations",
                     epoch, epochs, config::to_string(metric_), metric_text(metric_, standing_.best),
                     standing_.best_epoch, min_delta_, standing_.evaluations_without_improvement);
}

}  // namespace ltrain::engine
