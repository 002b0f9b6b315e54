#pragma once
// The statistics of `ltrain reproduce`: medians, the ratios B / A of paired rounds with their
// range, the rounds' noise, and the verdict a claimed ratio gets against them.
#include <limits>
#include <string>
#include <vector>

namespace ltrain::bench {

/// The middle value of `values` (the mean of the two middle ones for an even count); NaN for none.
double median(std::vector<double> values);

/// How a measured ratio B / A is held against a claimed one.
enum class Comparison {
  at_least,  ///< the claim: B / A >= claimed (speed-ups)
  at_most,   ///< the claim: B / A <= claimed (memory savings)
};

/// The ratios B / A of the rounds (round i's B over round i's A).
struct RatioSpread {
  double median = std::numeric_limits<double>::quiet_NaN();
  double low = std::numeric_limits<double>::quiet_NaN();
  double high = std::numeric_limits<double>::quiet_NaN();
  int rounds = 0;
};
RatioSpread ratio_spread(const std::vector<double>& a, const std::vector<double>& b);

/// "holds" where every round's ratio meets the claim, "does not hold" where none does, and
/// "undecided: ..." where the claimed ratio lies within the rounds' spread.
std::string verdict(const RatioSpread& spread, double claimed, Comparison comparison);

/// The noise of an A/B measurement: the larger of the two sides' ranges over their rounds, each
/// relative to its median (0 with one round a side: no spread was measured).
double rounds_noise(const std::vector<double>& a, const std::vector<double>& b);

/// Whether `ratio` differs from `reference` by less than `noise` (relative to the reference):
/// a difference the rounds do not tell apart from their own spread, not a finding.
bool within_noise(double ratio, double reference, double noise);

}  // namespace ltrain::bench
