#pragma once
// Runs the claims of a catalogue (claims.h), a row each: the A/B step claims over a cache of step
// measurements (each variant, image size and round measured once, reused by every claim that
// compares it and by a report continued), the matmul test, the statements about cards, the
// claims no machine here measures, and the batch-size search (reproduce_batch_search.cpp).
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "ltrain/bench/claims.h"
#include "ltrain/bench/reproduce.h"
#include "ltrain/bench/reproduce_report.h"
#include "ltrain/bench/step_bench.h"
#include "ltrain/config/load.h"
#include "ltrain/core/environment.h"

namespace ltrain::bench {

/// One side of an A/B claim as measured: its variant's name and, per round, its images/s and
/// its peak memory in bytes (negative where the device does not measure it: the CPU).
struct SideRounds {
  std::string name;
  std::vector<double> images_per_second;
  std::vector<double> peak_bytes;
};

/// A speed or memory claim judged on the numbers of its rounds (round i of B against round i of
/// A): `row` with what was measured, the ratio, the ratio claimed and the verdict the threshold
/// gives. Speed: B's images/s over A's against claim.threshold (none: "measured"; a verdict
/// within the rounds' noise is undecided). Memory: B's peak over A's against 1 - claim.threshold,
/// with the time per image B pays.
ClaimRow judge_step_claim(const Claim& claim, ClaimRow row, const SideRounds& a, const SideRounds& b);

/// `row` with the verdict "not measurable here: <why>".
ClaimRow not_measurable(ClaimRow row, const std::string& why);

/// A row for `claim` with its text, guide and quote, and no measurement yet.
ClaimRow claim_row(const Claim& claim, const std::string& text, int64_t image_size = 0);

/// Step benchmarks of the base config with a variant's keys set, each (variant, image size,
/// round) run once and kept. A variant that fails is not tried again.
class StepMeasurements {
 public:
  /// `earlier`: the "steps" measurements of an unfinished report continued (null: none); those of
  /// the variants in `variants` (names and settings filled) with the same settings are reused.
  StepMeasurements(const ReproduceOptions& options, const config::LoadedConfig& base, const c10::Device& device,
                   const nlohmann::json& earlier, const std::vector<Variant>& variants);

  /// Called after each measurement (a round or a failure), when json() holds it.
  void after_each(std::function<void()> saved) { after_each_ = std::move(saved); }

  /// The measurements taken from the earlier report: "fp32 at 32x32 (2 round(s))".
  const std::vector<std::string>& reused() const { return reused_; }

  /// Round `round` of `variant` at `image_size`, or nullopt with `error()` saying why.
  const std::optional<StepBenchResult>& step(const Variant& variant, int64_t image_size, int64_t round);

  std::string error(const Variant& variant, int64_t image_size) const;

  /// {"<image size>": {"<variant>": {"settings": [...], "rounds": [...]} or {"settings", "error"}}}.
  const nlohmann::json& json() const { return json_; }

 private:
  std::vector<std::string> image_size_settings(int64_t image_size) const;
  void reuse(const nlohmann::json& earlier, const std::vector<Variant>& variants);

  const ReproduceOptions& options_;
  const config::LoadedConfig& base_;
  const c10::Device device_;
  std::function<void()> after_each_;
  std::vector<std::string> reused_;
  std::map<std::string, std::deque<std::optional<StepBenchResult>>> results_;  // a deque: results stay where they are
  std::map<std::string, std::string> errors_;
  std::optional<StepBenchResult> failed_;
  nlohmann::json json_ = nlohmann::json::object();
};

/// A speed or memory claim's row at `image_size`: its variants (filled with `values`) measured
/// over `rounds` rounds, A then B in each, and judged; "not measurable here: why" where a side fails.
ClaimRow run_step_claim(StepMeasurements& measurements, const ClaimCatalogue& catalogue, const Claim& claim,
                        const StepValues& values, int64_t image_size, int64_t rounds);

/// A matmul claim's rows, one per precision ("measured", or "not measurable here: why"); each
/// result is appended to `results`.
std::vector<ClaimRow> run_matmul_claim(const Claim& claim, const ReproduceOptions& options, const c10::Device& device,
                                       nlohmann::json& results);

/// A card claim's row: "wrong: ...", measured with what this device is (`gpu`, null on the CPU;
/// `device`, its one-line description) beside the published figures.
ClaimRow card_claim_row(const Claim& claim, const std::optional<env::Gpu>& gpu, const std::string& device);

/// An unmeasurable claim's row: "not measurable here: why".
ClaimRow unmeasurable_claim_row(const Claim& claim);

/// A batch_search claim's row: from claim.start_batch, doubling then bisecting until
/// claim.memory_fraction of the GPU's memory is reserved, fp16 with the whole step graphed
/// (ltrain's fastest step), as a sweep in `out_dir`/batch-search (continued on a rerun unless
/// options.fresh). Not measurable without a CUDA device or with options.batch_search off.
ClaimRow run_batch_search_claim(const Claim& claim, const ReproduceOptions& options, const config::LoadedConfig& base,
                                const c10::Device& device, const std::filesystem::path& out_dir);

}  // namespace ltrain::bench
