#include "ltrain/bench/reproduce_stats.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace ltrain::bench {

double median(std::vector<double> values) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

RatioSpread ratio_spread(const std::vector<double>& a, const std::vector<double>& b) {
  RatioSpread spread;
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) ratios.push_back(b[i] / a[i]);
  if (ratios.empty()) return spread;
  const auto [low, high] = std::minmax_element(ratios.begin(), ratios.end());
  spread.low = *low;
  spread.high = *high;
  spread.median = median(ratios);
  spread.rounds = static_cast<int>(ratios.size());
  return spread;
}

std::string verdict(const RatioSpread& spread, double claimed, Comparison comparison) {
  const bool every_round_meets = comparison == Comparison::at_least ? spread.low >= claimed : spread.high <= claimed;
  const bool no_round_meets = comparison == Comparison::at_least ? spread.high < claimed : spread.low > claimed;
  if (every_round_meets) return "holds";
  if (no_round_meets) return "does not hold";
  return fmt::format("undecided: the claimed {:.2f}x lies within the rounds' {:.2f}-{:.2f}x", claimed, spread.low,
                     spread.high);
}

double rounds_noise(const std::vector<double>& a, const std::vector<double>& b) {
  double noise = 0.0;
  for (const std::vector<double>* side : {&a, &b}) {
    if (side->size() < 2) continue;
    const auto [low, high] = std::minmax_element(side->begin(), side->end());
    const double middle = median(*side);
    if (middle > 0.0) noise = std::max(noise, (*high - *low) / middle);
  }
  return noise;
}

bool within_noise(double ratio, double reference, double noise) {
  return std::abs(ratio / reference - 1.0) < noise;
}

}  // namespace ltrain::bench
