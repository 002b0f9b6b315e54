#pragma once
// `ltrain reproduce`'s report: a row per claim and what was measured for it, written as REPORT.md
// (the tables) and results.json (every row and raw measurement).
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/bench/claims.h"
#include "ltrain/bench/reproduce_stats.h"

namespace ltrain::bench {

struct ClaimRow {
  std::string claim;     ///< what a guide says, in English
  std::string guide;     ///< which guide says it (a Guide's name), or kNoGuide for a measurement of ltrain's own
  std::string quote;     ///< the guide's line that says it
  int64_t image_size = 0;  ///< the side an A/B step claim was measured at (0: the other rows)
  std::string measured;  ///< what was measured here, with its numbers
  RatioSpread ratio;     ///< B over A where the claim is a ratio
  double claimed = std::numeric_limits<double>::quiet_NaN();  ///< the ratio the claim needs
  std::string verdict;   ///< "holds", "does not hold", "undecided: ...", "measured", "wrong: ..." or
                         ///< "not measurable here: why"
};

struct ReproduceReport {
  nlohmann::json provenance;  ///< io::provenance of the base config with the overrides (null: none)
  /// What the measurements depend on (the resolved config's hash, the options, the device): an
  /// unfinished report is continued only with the same settings.
  nlohmann::json settings;
  bool finished = false;  ///< false while the measurements go on (and in a report cut short)
  std::vector<std::string> reused;  ///< the measurements taken from the unfinished report continued
  std::vector<int64_t> image_sizes;  ///< the sides the A/B step claims were measured at
  std::string device;     ///< doctor's one-line description of the device
  std::string setup;      ///< base config, model, batch, precision, rounds: REPORT.md's header
  std::vector<Guide> guides;  ///< the guides the claims come from, as REPORT.md lists them
  std::vector<ClaimRow> rows;
  nlohmann::json measurements = nlohmann::json::object();  ///< every raw result, by name
};

/// Writes REPORT.md (its header says where the numbers come from: versions, commit, GPUs, base
/// config, image sizes, host, start time, and whether the report is unfinished) and results.json
/// (with "settings" and "finished") into `out_dir`, each atomically; returns REPORT.md's text.
std::string write_report(const ReproduceReport& report, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
