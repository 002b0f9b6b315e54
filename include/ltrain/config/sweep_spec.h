#pragma once
// The sweep file (`ltrain sweep --config SWEEP.json`) described as a run config is: one plain
// struct per section, defaults in the declarations, each key listed once in visit() with its
// one-line description and limits. The same strict reader reads it, its errors have the same form
// ("<file>: <key.path> = <value>: expected ...", "did you mean"), and the same walk of visit()
// makes `ltrain sweep --help`'s key list, its JSON Schema (`ltrain sweep --schema`) and shell
// completion's sweep keys. What a sweep runs is bench/sweep.h's; configs/sweeps/README.md has
// examples.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/config.h"
#include "ltrain/config/load.h"

namespace ltrain::config {

/// The most points a sweep may have (the product of its grid lists' lengths, times its zip lists' length).
constexpr int64_t kMaxSweepPoints = 10000;
/// The most warm-up or timed steps of a point in mode bench.
constexpr int64_t kMaxBenchSteps = 1000000;
/// The most timed rounds of a point in mode bench.
constexpr int64_t kMaxBenchRounds = 100;

enum class SweepMode { bench, train };
template <>
struct EnumNames<SweepMode> {
  static constexpr std::array<std::pair<SweepMode, const char*>, 2> names{
      {{SweepMode::bench, "bench"}, {SweepMode::train, "train"}}};
};

/// Run config keys ("section.key", or a whole section) with their lists of values, in the file's
/// order: grid and zip.
using KeyLists = std::vector<std::pair<std::string, std::vector<nlohmann::json>>>;

/// "scale_lr_with": each point's optim.lr = the base config's LR * (the point's value of `key`) /
/// `reference`, the linear scaling rule.
struct LrScaling {
  /// The swept key the LR is proportional to (in grid or zip, or data.batch_size with batch_search).
  std::string key;
  /// The value of `key` at which optim.lr is the base config's (e.g. 256 for data.batch_size).
  double reference = 0.0;

  template <class V>
  void visit(V& v) {
    v("key", key, "the swept key optim.lr is proportional to, e.g. data.batch_size (required)");
    v("reference", reference, "the value of key at which optim.lr is the base config's, e.g. 256 (required)",
      Range{0, 1e9, true});
  }
};

/// "bench": the steps each point of mode bench runs.
struct TimedSteps {
  /// Steps run before the timing starts (cuDNN autotuning, a graph capture, caches).
  int64_t warmup = 10;
  /// Steps timed per round.
  int64_t steps = 30;
  /// Timed rounds of `steps` steps, one after another: the median round is the point's, and the
  /// rounds' range is its spread.
  int64_t rounds = 3;

  template <class V>
  void visit(V& v) {
    v("warmup", warmup, "steps run before the timing starts", between(0, kMaxBenchSteps));
    v("steps", steps, "steps timed per round", between(1, kMaxBenchSteps));
    v("rounds", rounds, "timed rounds of steps: the median round is the point's, their range its spread",
      between(1, kMaxBenchRounds));
  }
};

/// "batch_search": per point, data.batch_size grows from `start` by `factor` while the step's peak
/// memory stays under `memory_fraction` of the GPU (up to `max`), then `refine` bisections between
/// the largest batch under the fraction and the smallest past it.
struct BatchSearch {
  int64_t start = 256;
  double factor = 2.0;
  double memory_fraction = 0.9;
  int64_t max = 65536;
  int64_t refine = 3;  ///< bisections after the growth passes the fraction; batches stay multiples of start

  template <class V>
  void visit(V& v) {
    v("start", start, "the first batch; the others are multiples of it", between(1, kMaxImages));
    v("factor", factor, "the batch's growth per step of the search", Range{1, 16, true});
    v("memory_fraction", memory_fraction, "the share of the GPU's memory the largest batch may use",
      Range{0, 1, true});
    v("max", max, "the largest batch tried", between(1, kMaxImages));
    v("refine", refine, "bisections after the growth passes the fraction", between(0, 64));
  }
};

/// A sweep file: a base run config, the settings every point shares, the settings that vary, and
/// what each point runs.
struct SweepSpec {
  /// The run config the points start from, relative to the sweep file.
  std::string base;
  /// "key=value" run config overrides of every point (before the command line's --set).
  std::vector<std::string> set;
  /// bench: timed steps per point (img/s, ms/step, peak memory); train: a full run per point.
  SweepMode mode = SweepMode::bench;
  /// Every combination of these lists' values, the first key varying slowest.
  KeyLists grid;
  /// Lists of one length whose i-th values go together; the points are grid x zip.
  KeyLists zip;
  std::optional<LrScaling> scale_lr_with;
  TimedSteps bench;
  std::optional<BatchSearch> batch_search;

  template <class V>
  void visit(V& v) {
    v("base", base, "the run config the points start from, relative to the sweep file (required)");
    v("set", set, "\"key=value\" run config overrides of every point");
    v("mode", mode, "bench: timed steps per point; train: a full run per point");
    v("grid", grid, "run config keys with lists of values: every combination, the first key varying slowest");
    v("zip", zip, "run config keys with lists of one length whose i-th values go together (points: grid x zip)");
    v.section("scale_lr_with", scale_lr_with, "each point's optim.lr scaled linearly with a swept key");
    v.section("bench", bench, "the steps of each point of mode bench");
    v.section("batch_search", batch_search,
              "per point, the largest data.batch_size under a fraction of the GPU's memory (mode bench)");
  }
};

/// A sweep file read and checked.
struct LoadedSweep {
  SweepSpec spec;
  std::filesystem::path file;
  /// spec.base, relative to the folder of `file`.
  std::filesystem::path base;
  /// The command line's overrides of run config keys: every point's, after spec.set.
  std::vector<std::string> point_overrides;
};

/// Reads the sweep file `file` and checks it: each key's type and limits, unknown keys, grid and
/// zip keys (run config keys or sections), "set" and the run config overrides among `overrides`
/// (each key's type and limits), and the checks across keys (a base config that is a file, zip
/// lists of one length, at most kMaxSweepPoints points, ...). Each override KEY=VALUE whose key
/// is a sweep key or section ("bench.steps=5", "mode=train") applies to the file, in order; the
/// others are run config overrides of every point. ConfigError "<file or --set>: <key> = <value>:
/// <what is expected>" otherwise.
LoadedSweep load_sweep(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});

/// Every section and key of a sweep file, described (top-level keys are named without a section:
/// "base", "bench.steps").
const ConfigKeys& sweep_keys();

/// Whether `name` is a key ("bench.steps", "mode") or a section ("bench") of a sweep file.
bool is_sweep_key_or_section(const std::string& name);

/// A JSON Schema (draft 2020-12) of a sweep file: every key and section with its type, enumeration,
/// limits, default and description, grid and zip with every run config key and section (each a
/// list of the key's values), no other keys (additionalProperties false).
nlohmann::ordered_json sweep_schema();

}  // namespace ltrain::config
