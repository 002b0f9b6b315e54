#pragma once
// `ltrain reproduce`: the GPU guides' claims as A/B measurements on this machine. Each claim is
// tied to the guide and the line that makes it, and measured with ltrain's own step benchmark (the
// same config with one switch flipped, A and B alternating over several rounds, at each image size
// asked for), the matmul test, the batch-size search, or set against what the driver reports and
// the cards' published figures. A verdict is given only where the measured spread allows one.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ltrain::bench {

struct ReproduceOptions {
  std::filesystem::path base_config;   ///< the run config every measurement starts from
  std::vector<std::string> overrides;  ///< --set, applied to every measurement
  int64_t warmup = 10;                 ///< untimed steps per measurement
  int64_t steps = 30;                  ///< timed steps per measurement
  int64_t rounds = 3;                  ///< A/B rounds per claim: A, B, A, B, ...
  /// Sides of the images the A/B claims are measured at; empty: the base config's data.image_size.
  /// A side other than 32 measures on random images of that side (data.source synthetic).
  std::vector<int64_t> image_sizes;
  int64_t matmul_size = 8192;
  int64_t matmul_products = 100;
  bool batch_search = true;            ///< the 4090D guide's batch-size search (a GPU only)
  /// Start over; otherwise an unfinished report of the same settings in the report folder is
  /// continued, its measurements reused.
  bool fresh = false;
};

/// The three guides, as REPORT.md names them.
struct Guide {
  std::string name;   ///< "RTX 5090 guide"
  std::string title;  ///< the article's own title
  std::string about;  ///< its title in English
};
const std::vector<Guide>& guides();

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

struct ClaimRow {
  std::string claim;     ///< what a guide says, in English
  std::string guide;     ///< which guide says it (a Guide's name), or "none" for a measurement of ltrain's own
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
  std::vector<ClaimRow> rows;
  nlohmann::json measurements = nlohmann::json::object();  ///< every raw result, by name
};

/// The figures NVIDIA publishes for a card the guides speak of or the report may run on.
struct PublishedCard {
  std::string name;          ///< as the driver names it, e.g. "NVIDIA GeForce RTX 4090 D"
  std::string architecture;  ///< "Ada Lovelace"
  int major = 0;             ///< compute capability
  int minor = 0;
  int multiprocessors = 0;
  int cuda_cores = 0;
  std::string memory;        ///< "24 GB GDDR6X"
  std::string bandwidth;     ///< "1,008 GB/s"
};
/// The card whose driver name is `gpu_name`, or null for one not in the table.
const PublishedCard* published_card(const std::string& gpu_name);

/// Runs every measurement, writing the report so far (write_report, unfinished) into `out_dir`
/// after each, so that a run cut short keeps them; `out_dir` receives the batch search's sweep
/// files too. Unless options.fresh, an unfinished report in `out_dir` of the same settings is
/// continued: its measurements are reused (ReproduceReport::reused); ConfigError for one of
/// other settings, which it would replace. The report returned is finished.
ReproduceReport reproduce(const ReproduceOptions& options, const std::filesystem::path& out_dir);

/// Writes REPORT.md (its header says where the numbers come from: versions, commit, GPUs, base
/// config, image sizes, host, start time, and whether the report is unfinished) and results.json
/// (with "settings" and "finished") into `out_dir`, each atomically; returns REPORT.md's text.
std::string write_report(const ReproduceReport& report, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
