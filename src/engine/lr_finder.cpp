#include "ltrain/engine/lr_finder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/train_step.h"

namespace ltrain::engine {
namespace {

constexpr double kSmoothing = 0.98;
/// The most points at the start of the ramp that suggest_lr leaves out.
constexpr size_t kSkippedFirstPoints = 10;

void check(const LrFindOptions& options) {
  if (options.steps < 3) throw ConfigError(fmt::format("ltrain lr-find --steps {}: expected 3 or more", options.steps));
  if (!(options.start_lr > 0.0) || !std::isfinite(options.start_lr))
    throw ConfigError(fmt::format("ltrain lr-find --start-lr {:g}: expected a number > 0", options.start_lr));
  if (!(options.end_lr > options.start_lr) || !std::isfinite(options.end_lr))
    throw ConfigError(fmt::format("ltrain lr-find --end-lr {:g}: expected a number above --start-lr {:g}",
                                  options.end_lr, options.start_lr));
}

}  // namespace

double suggest_lr(const std::vector<LrFindPoint>& points) {
  if (points.empty()) return 0.0;
  // The first points' smoothed loss is an average of a few noisy steps, whose chance falls would
  // make the steepest slope (at the lowest rates, where nothing is learnt): they are left out, as
  // PyTorch Lightning's suggestion leaves out its first 10 (here at most a tenth of the points).
  const size_t skipped = std::min<size_t>(kSkippedFirstPoints, points.size() / 10);
  size_t lowest = skipped;
  for (size_t i = skipped + 1; i < points.size(); ++i)
    if (points[i].smoothed_loss < points[lowest].smoothed_loss) lowest = i;
  if (lowest < skipped + 2) return points[lowest].lr / 10.0;
  size_t steepest = skipped + 1;
  double steepest_slope = std::numeric_limits<double>::infinity();
  for (size_t i = skipped + 1; i <= lowest; ++i) {
    const double slope = (points[i].smoothed_loss - points[i - 1].smoothed_loss) /
                         (std::log(points[i].lr) - std::log(points[i - 1].lr));
    if (slope < steepest_slope) steepest_slope = slope, steepest = i;
  }
  return points[steepest].lr;
}

LrFindResult find_lr(const config::LoadedConfig& loaded, const LrFindOptions& options) {
  check(options);
  Run run(loaded, RunParts{});
  TrainStep step(run.model(), run.optimizer(), run.scaler(), run.config());
  data::TrainLoader& loader = run.train_loader();
  const int64_t batches = loader.batches_per_epoch();
  LrFindResult result;
  double average = 0.0, lowest = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < options.steps; ++i) {
    if (i % batches == 0) loader.set_epoch(i / batches);
    const double lr = options.start_lr * std::pow(options.end_lr / options.start_lr,
                                                  static_cast<double>(i) / static_cast<double>(options.steps - 1));
    run.optimizer().set_lr(lr);
    step.run(loader.batch(i % batches));
    // A host sync per step: the test is about each step's loss, not speed.
    const double loss = step.take_totals().mean_loss();
    average = kSmoothing * average + (1.0 - kSmoothing) * loss;
    const double smoothed = average / (1.0 - std::pow(kSmoothing, static_cast<double>(i + 1)));
    result.points.push_back({i + 1, lr, loss, smoothed});
    if (!std::isfinite(smoothed) || smoothed > options.divergence * lowest) {
      result.diverged = i + 1 < options.steps;
      result.points.pop_back();  // a point past divergence says nothing of the slope before it
      break;
    }
    lowest = std::min(lowest, smoothed);
  }
  if (result.points.empty())
    throw RunError(fmt::format("ltrain lr-find: the loss was not finite at the first step (lr {:g}): check the data, "
                               "or lower --start-lr",
                               options.start_lr));
  result.suggested_lr = suggest_lr(result.points);
  result.lowest_loss_lr =
      std::min_element(result.points.begin(), result.points.end(), [](const LrFindPoint& a, const LrFindPoint& b) {
        return a.smoothed_loss < b.smoothed_loss;
      })->lr;
  return result;
}

}  // namespace ltrain::engine
