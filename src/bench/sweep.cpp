#include "ltrain/bench/sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/step_bench.h"
#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"

namespace ltrain::bench {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

using Settings = std::vector<std::pair<std::string, json>>;
using KeyLists = std::vector<std::pair<std::string, std::vector<json>>>;

/// "scale_lr_with": optim.lr = base LR * (the point's value of `key`) / reference.
struct LrScaling {
  std::string key;
  double reference = 0.0;
  double base_lr = 0.0;  ///< optim.lr of the base config with "set" and --set, once resolved
};

struct SweepSpec {
  fs::path file;
  fs::path base;
  std::vector<std::string> set;
  std::string mode = "bench";
  KeyLists grid;  ///< every combination, the first key varying slowest
  KeyLists zip;   ///< lists of one length, their i-th values taken together
  int64_t warmup = 10;
  int64_t steps = 30;
  std::optional<BatchSearch> batch_search;
  std::optional<LrScaling> scale_lr;
};

ConfigError spec_error(const fs::path& file, const std::string& message) {
  return ConfigError(fmt::format("{}: {}", file.string(), message));
}

/// `object[key]` as T when present, else `fallback`; ConfigError naming the key otherwise.
template <class T>
T field(const fs::path& file, const json& object, const std::string& where, const char* key, T fallback) {
  if (!object.contains(key)) return fallback;
  try {
    return object.at(key).get<T>();
  } catch (const json::exception&) {
    throw spec_error(file, fmt::format("{}{} = {}: wrong type", where, key, object.at(key).dump()));
  }
}

/// An object of "section.key": [values] in the file's order (`name` is "grid" or "zip").
KeyLists key_lists(const fs::path& file, const nlohmann::ordered_json& document, const char* name) {
  KeyLists lists;
  if (!document.contains(name)) return lists;
  if (!document.at(name).is_object())
    throw spec_error(file, fmt::format("{}: expected an object of \"section.key\": [values]", name));
  for (const auto& [key, ordered_values] : document.at(name).items()) {
    const json values(ordered_values);
    if (!values.is_array() || values.empty())
      throw spec_error(file, fmt::format("{}.{} = {}: expected a non-empty list of values", name, config::shown(key),
                                         config::shown(values.dump())));
    lists.emplace_back(key, std::vector<json>(values.begin(), values.end()));
  }
  return lists;
}

SweepSpec parse_spec(const fs::path& file) {
  const std::string text =
      config::read_config_text(file, "give the path of a sweep file (see ltrain sweep --help for its format)");
  // The document with its keys in the file's order, for the grid; json sorts them.
  const nlohmann::ordered_json ordered = config::parse_ordered_json(text, file.string());
  const json doc(ordered);
  if (!doc.is_object()) throw spec_error(file, "not a JSON object (see ltrain sweep --help)");
  const std::set<std::string> known{"base", "set", "mode", "grid", "zip", "scale_lr_with", "bench", "batch_search"};
  for (const auto& [key, value] : doc.items())
    if (!known.count(key))
      throw spec_error(file, fmt::format("unknown key \"{}\"; a sweep has base, set, mode, grid, zip, scale_lr_with, "
                                         "bench, batch_search",
                                         config::shown(key)));
  SweepSpec spec;
  spec.file = file;
  const std::string base = field<std::string>(file, doc, "", "base", "");
  if (base.empty()) throw spec_error(file, "needs \"base\": the run config the points start from");
  spec.base = file.parent_path() / base;
  // Checked here: otherwise every point would fail alike, and a sweep of failed points succeeds.
  if (const std::string problem = files::not_a_regular_file(spec.base); !problem.empty())
    throw spec_error(file, fmt::format("base = \"{}\": {}: {} (paths are relative to the sweep file)",
                                       config::shown(base), config::shown(spec.base.string()), problem));
  spec.set = field<std::vector<std::string>>(file, doc, "", "set", {});
  spec.mode = field<std::string>(file, doc, "", "mode", "bench");
  if (spec.mode != "bench" && spec.mode != "train")
    throw spec_error(file, fmt::format("mode = \"{}\": use \"bench\" (timed steps) or \"train\" (full runs)", spec.mode));
  spec.grid = key_lists(file, ordered, "grid");
  spec.zip = key_lists(file, ordered, "zip");
  for (const auto& [key, values] : spec.zip) {
    if (values.size() != spec.zip.front().second.size()) {
      std::vector<std::string> lengths;
      for (const auto& [name, list] : spec.zip)
        lengths.push_back(fmt::format("{}: {}", config::shown(name), list.size()));
      throw spec_error(file, fmt::format("zip: lists of different lengths ({}); zip takes the i-th value of every "
                                         "list together, so give them equal lengths",
                                         fmt::join(lengths, ", ")));
    }
    for (const auto& [grid_key, grid_values] : spec.grid)
      if (grid_key == key)
        throw spec_error(file, fmt::format("\"{}\" is in both grid and zip; keep it in one", config::shown(key)));
  }
  double points = spec.zip.empty() ? 1.0 : static_cast<double>(spec.zip.front().second.size());
  for (const auto& [key, values] : spec.grid) points *= static_cast<double>(values.size());
  if (points > static_cast<double>(kMaxSweepPoints))
    throw spec_error(file, fmt::format("grid: {:.4g} points (the product of its lists' lengths{}) are more than {}; "
                                       "shorten the lists or split the sweep",
                                       points, spec.zip.empty() ? "" : ", times zip's length", kMaxSweepPoints));
  const json bench = doc.value("bench", json::object());
  spec.warmup = field<int64_t>(file, bench, "bench.", "warmup", spec.warmup);
  spec.steps = field<int64_t>(file, bench, "bench.", "steps", spec.steps);
  if (spec.warmup < 0 || spec.steps < 1) throw spec_error(file, "bench: warmup must be >= 0 and steps >= 1");
  if (doc.contains("batch_search")) {
    const json& search = doc["batch_search"];
    BatchSearch s;
    s.start = field<int64_t>(file, search, "batch_search.", "start", s.start);
    s.factor = field<double>(file, search, "batch_search.", "factor", s.factor);
    s.memory_fraction = field<double>(file, search, "batch_search.", "memory_fraction", s.memory_fraction);
    s.max = field<int64_t>(file, search, "batch_search.", "max", s.max);
    s.refine = field<int64_t>(file, search, "batch_search.", "refine", s.refine);
    if (s.start < 1 || s.factor <= 1.0 || s.factor > 16.0 || s.memory_fraction <= 0.0 || s.memory_fraction > 1.0 ||
        s.max < s.start || s.max > config::kMaxImages || s.refine < 0)
      throw spec_error(file, fmt::format("batch_search: needs 1 <= start <= max <= {}, 1 < factor <= 16, 0 < "
                                         "memory_fraction <= 1, refine >= 0",
                                         config::kMaxImages));
    if (spec.mode != "bench")
      throw spec_error(file, "batch_search measures the memory of timed steps: use it with mode \"bench\"");
    spec.batch_search = s;
  }
  if (spec.grid.empty() && spec.zip.empty() && !spec.batch_search)
    throw spec_error(file, "needs a \"grid\", a \"zip\" or a \"batch_search\"");
  if (doc.contains("scale_lr_with")) {
    const json& scaling = doc["scale_lr_with"];
    if (!scaling.is_object())
      throw spec_error(file, "scale_lr_with: expected {\"key\": \"data.batch_size\", \"reference\": 256}");
    for (const auto& [key, value] : scaling.items())
      if (key != "key" && key != "reference")
        throw spec_error(file, fmt::format("scale_lr_with: unknown key \"{}\"; it has key and reference",
                                           config::shown(key)));
    LrScaling lr;
    lr.key = field<std::string>(file, scaling, "scale_lr_with.", "key", "");
    lr.reference = field<double>(file, scaling, "scale_lr_with.", "reference", 0.0);
    if (!(lr.reference > 0.0) || !std::isfinite(lr.reference))
      throw spec_error(file, "scale_lr_with.reference: expected a number > 0, the value at which optim.lr is the base "
                             "config's (e.g. 256 for data.batch_size)");
    const auto swept = [&lr](const KeyLists& lists) {
      return std::any_of(lists.begin(), lists.end(), [&lr](const auto& list) { return list.first == lr.key; });
    };
    if (!swept(spec.grid) && !swept(spec.zip) && !(spec.batch_search && lr.key == "data.batch_size"))
      throw spec_error(file, fmt::format("scale_lr_with.key \"{}\": not a key of the grid or zip (or "
                                         "data.batch_size with batch_search); the LR scales with a value the "
                                         "sweep varies",
                                         config::shown(lr.key)));
    spec.scale_lr = lr;
  }
  return spec;
}

std::string settings_text(const Settings& settings) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : settings) parts.push_back(key + "=" + value.dump());
  return fmt::format("{}", fmt::join(parts, " "));
}

/// With scale_lr_with: the point's optim.lr, scaled linearly from the base LR, added last.
/// ConfigError when the point sets optim.lr itself (the two would contradict each other).
void add_scaled_lr(const SweepSpec& spec, int64_t index, Settings& settings) {
  if (!spec.scale_lr) return;
  const LrScaling& lr = *spec.scale_lr;
  std::optional<double> value;
  for (const auto& [key, setting] : settings) {
    const bool sets_lr = key == "optim.lr" || (key == "optim" && setting.is_object() && setting.contains("lr"));
    if (sets_lr)
      throw spec_error(spec.file, fmt::format("point {} ({}) sets optim.lr itself, which scale_lr_with computes from "
                                              "{}; take optim.lr out of the grid and zip (the base config's LR is "
                                              "the one at {} = {:g}), or drop scale_lr_with",
                                              index, settings_text(settings), lr.key, lr.key, lr.reference));
    if (key == lr.key) {
      if (!setting.is_number() || !(setting.get<double>() > 0.0))
        throw spec_error(spec.file, fmt::format("point {} ({}): scale_lr_with needs {} to be a number > 0", index,
                                                settings_text(settings), lr.key));
      value = setting.get<double>();
    }
  }
  if (value) settings.emplace_back("optim.lr", lr.base_lr * *value / lr.reference);
}

/// The overrides of one point: the file's "set", the command line's --set, then the point's settings.
std::vector<std::string> point_overrides(const SweepSpec& spec, const std::vector<std::string>& overrides,
                                         const Settings& settings) {
  std::vector<std::string> sets = spec.set;
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  for (const auto& [key, value] : settings) sets.push_back(key + "=" + value.dump());
  return sets;
}

/// The file, with scale_lr_with's base LR resolved from the base config, "set" and `overrides`.
SweepSpec prepare_spec(const fs::path& file, const std::vector<std::string>& overrides) {
  SweepSpec spec = parse_spec(file);
  if (spec.scale_lr)
    spec.scale_lr->base_lr = config::load_file(spec.base, point_overrides(spec, overrides, {})).config.optim.lr;
  return spec;
}

/// The points: every combination of the grid's values (the first key varying slowest), each with
/// each of zip's tuples, and scale_lr_with's LR (not with batch_search, whose batches come later).
std::vector<Settings> expand(const SweepSpec& spec) {
  std::vector<Settings> points{{}};
  for (const auto& [key, values] : spec.grid) {
    std::vector<Settings> next;
    for (const auto& point : points)
      for (const json& value : values) {
        next.push_back(point);
        next.back().emplace_back(key, value);
      }
    points = std::move(next);
  }
  if (!spec.zip.empty()) {
    std::vector<Settings> next;
    for (const auto& point : points)
      for (size_t i = 0; i < spec.zip.front().second.size(); ++i) {
        next.push_back(point);
        for (const auto& [key, values] : spec.zip) next.back().emplace_back(key, values[i]);
      }
    points = std::move(next);
  }
  if (!spec.batch_search)
    for (size_t i = 0; i < points.size(); ++i) add_scaled_lr(spec, static_cast<int64_t>(i), points[i]);
  return points;
}

class SweepRunner {
 public:
  SweepRunner(SweepSpec spec, fs::path out_dir, std::vector<std::string> overrides)
      : spec_(std::move(spec)), out_dir_(std::move(out_dir)), overrides_(std::move(overrides)) {}

  /// Runs one point; fills `point.values` or `point.error`.
  void run(SweepPoint& point, int64_t index) {
    std::vector<std::string> sets = point_overrides(spec_, overrides_, point.settings);
    if (spec_.mode == "train") {
      sets.push_back("run.out_dir=" + (out_dir_ / "runs").string());
      sets.push_back(fmt::format("run.name=point-{:03d}", index));
    }
    const auto started = std::chrono::steady_clock::now();
    try {
      const config::LoadedConfig loaded = config::load_file(spec_.base, sets);
      if (spec_.mode == "bench") {
        const StepBenchResult r = bench_steps(loaded, spec_.warmup, spec_.steps);
        point.values = {{"img_per_s", r.images_per_second}, {"ms_per_step", r.ms_per_step}};
        if (r.peak_memory_bytes >= 0) point.values["peak_gib"] = static_cast<double>(r.peak_memory_bytes) / kGiB;
        if (r.peak_reserved_bytes >= 0) {
          point.values["reserved_gib"] = static_cast<double>(r.peak_reserved_bytes) / kGiB;
          const int64_t total = compat::device_memory_bytes(engine::resolve_device(loaded));
          if (total > 0) point.values["memory_fraction"] = static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(total);
        }
      } else {
        const engine::TrainResult r = engine::train(loaded);
        point.values = {{"test_acc", r.final_test_accuracy}, {"best_test_acc", r.best_test_accuracy},
                        {"train_s", r.train_seconds},        {"wall_s", r.wall_seconds},
                        {"img_per_s", r.images_per_second}};
      }
    } catch (const Interrupted&) {
      throw;  // Ctrl-C or SIGTERM in a training point stops the sweep, not just the point
    } catch (const UserError& error) {
      point.error = compat::failure_summary(error);
    } catch (const c10::Error& error) {
      point.error = compat::failure_summary(error);
    }
    log_point(point, index, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }

  /// The batch-size search on top of `settings` (BatchSearchPlan); every batch tried is a row.
  void search(const Settings& settings, std::vector<SweepPoint>& out) {
    BatchSearchPlan plan(*spec_.batch_search);
    while (const std::optional<int64_t> batch = plan.next()) {
      SweepPoint point;
      point.settings = settings;
      point.settings.emplace_back("data.batch_size", *batch);
      add_scaled_lr(spec_, static_cast<int64_t>(out.size()), point.settings);
      run(point, static_cast<int64_t>(out.size()));
      const auto fraction = point.values.find("memory_fraction");
      if (point.error.empty() && fraction == point.values.end()) {
        point.error = "batch_search needs a CUDA device (peak memory is measured there)";
        out.push_back(point);
        return;
      }
      plan.record(*batch, point.error.empty() ? std::optional<double>(fraction->second) : std::nullopt);
      out.push_back(point);
    }
  }

  const SweepSpec& spec() const { return spec_; }

 private:
  /// One line per point as it ends: a long sweep shows where it is.
  static void log_point(const SweepPoint& point, int64_t index, double seconds) {
    std::string values;
    const std::string settings = point.settings.empty() ? "" : " " + settings_text(point.settings);
    for (const auto& [key, value] : point.values) values += fmt::format(" {} {:.4g}", key, value);
    spdlog::info("sweep point {}:{} |{} ({:.0f} s)", index, settings,
                 point.error.empty() ? values : " failed: " + point.error, seconds);
  }

  SweepSpec spec_;
  fs::path out_dir_;
  std::vector<std::string> overrides_;
};

std::string cell(const SweepPoint& point, const std::string& column) {
  const auto it = point.values.find(column);
  return it == point.values.end() ? "" : fmt::format("{:.4g}", it->second);
}

std::string setting_text(const json& value) { return value.is_string() ? value.get<std::string>() : value.dump(); }

/// Where the sweep's results come from: SweepResult::provenance.
json sweep_provenance(const fs::path& sweep_file, const SweepSpec& spec, const std::vector<std::string>& overrides,
                      std::chrono::system_clock::time_point started) {
  std::vector<std::string> files{sweep_file.string()};
  json resolved = nullptr;
  std::vector<std::string> sets = spec.set;
  sets.insert(sets.end(), overrides.begin(), overrides.end());
  try {
    const config::LoadedConfig base = config::load_file(spec.base, sets);
    files.insert(files.end(), base.files.begin(), base.files.end());
    resolved = config::to_json(base.config);
  } catch (const ConfigError&) {
    files.push_back(spec.base.string());  // the points' rows say what is wrong
  }
  return io::provenance(files, resolved, started);
}

}  // namespace

BatchSearchPlan::BatchSearchPlan(BatchSearch search) : search_(search), growing_(search.start) {}

std::optional<int64_t> BatchSearchPlan::next() const {
  if (growing_ > 0) return growing_;
  if (over_ == 0 || refined_ >= search_.refine) return std::nullopt;
  // Bisect on multiples of start; stop when no such multiple lies strictly between the two.
  const int64_t lo = under_ > 0 ? under_ : 0;
  const int64_t mid = (lo + over_) / 2 / search_.start * search_.start;
  if (mid <= lo || mid >= over_) return std::nullopt;
  return mid;
}

void BatchSearchPlan::record(int64_t batch, std::optional<double> memory_fraction) {
  const bool under = memory_fraction && *memory_fraction <= search_.memory_fraction;
  if (under) {
    under_ = std::max(under_, batch);
  } else {
    over_ = over_ == 0 ? batch : std::min(over_, batch);
  }
  if (growing_ > 0) {
    const auto grown = static_cast<int64_t>(static_cast<double>(batch) * search_.factor);
    // The growth ends past the fraction, on a failure, exactly at the fraction, or at max.
    const bool reached = memory_fraction && *memory_fraction >= search_.memory_fraction;
    growing_ = under && !reached && grown <= search_.max ? grown : 0;
  } else {
    ++refined_;
  }
}

SweepPlan plan_sweep(const fs::path& sweep_file, const std::vector<std::string>& overrides) {
  const SweepSpec spec = prepare_spec(sweep_file, overrides);
  SweepPlan plan;
  plan.mode = spec.mode;
  plan.base = spec.base;
  plan.set = spec.set;
  plan.batch_search = spec.batch_search;
  for (const Settings& settings : expand(spec)) {
    const int64_t index = static_cast<int64_t>(plan.points.size());
    // A batch-size search starts at its first batch: check the point's config there.
    Settings checked = settings;
    if (spec.batch_search) {
      checked.emplace_back("data.batch_size", spec.batch_search->start);
      add_scaled_lr(spec, index, checked);
    }
    try {
      config::load_file(spec.base, point_overrides(spec, overrides, checked));
    } catch (const ConfigError& error) {
      throw spec_error(sweep_file, fmt::format("point {} ({}) is not a valid config: {}", index,
                                               settings_text(checked), error.what()));
    }
    std::vector<std::string> point;
    for (const auto& [key, value] : settings) point.push_back(key + "=" + value.dump());
    plan.points.push_back(std::move(point));
  }
  return plan;
}

SweepResult run_sweep(const fs::path& sweep_file, const fs::path& out_dir, const std::vector<std::string>& overrides) {
  const auto started = std::chrono::system_clock::now();
  SweepRunner runner(prepare_spec(sweep_file, overrides), out_dir, overrides);
  const std::vector<Settings> points = expand(runner.spec());  // its errors before anything is written
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error || !fs::is_directory(out_dir, error))
    throw ConfigError(fmt::format("{}: cannot create this results folder ({}); choose another --out", out_dir.string(),
                                  error ? error.message() : "something else is there"));
  SweepResult result;
  result.provenance = sweep_provenance(sweep_file, runner.spec(), overrides, started);
  result.mode = runner.spec().mode;
  for (const auto& [key, values] : runner.spec().grid) result.keys.push_back(key);
  for (const auto& [key, values] : runner.spec().zip) result.keys.push_back(key);
  if (runner.spec().batch_search) result.keys.push_back("data.batch_size");
  if (runner.spec().scale_lr) result.keys.push_back("optim.lr");
  result.columns = result.mode == "bench"
                       ? std::vector<std::string>{"img_per_s", "ms_per_step", "peak_gib", "reserved_gib", "memory_fraction"}
                       : std::vector<std::string>{"test_acc", "best_test_acc", "train_s", "wall_s", "img_per_s"};
  for (const Settings& settings : points) {
    if (runner.spec().batch_search) {
      runner.search(settings, result.points);
    } else {
      SweepPoint point;
      point.settings = settings;
      runner.run(point, static_cast<int64_t>(result.points.size()));
      result.points.push_back(point);
    }
    write_sweep_results(result, out_dir);  // a sweep cut short keeps what it measured
  }
  return result;
}

std::string write_sweep_results(const SweepResult& result, const fs::path& out_dir) {
  fs::create_directories(out_dir);
  std::string csv, markdown = "|", rule = "|";
  std::vector<std::string> header = result.keys;
  header.insert(header.end(), result.columns.begin(), result.columns.end());
  header.push_back("error");
  for (size_t i = 0; i < header.size(); ++i) {
    csv += (i ? "," : "") + header[i];
    markdown += " " + header[i] + " |";
    rule += "---|";
  }
  csv += "\n";
  markdown += "\n" + rule + "\n";
  json rows = json::array();
  for (const SweepPoint& point : result.points) {
    std::vector<std::string> cells;
    json row = json::object();
    for (const auto& [key, value] : point.settings) {
      cells.push_back(setting_text(value));
      row[key] = value;
    }
    for (const std::string& column : result.columns) {
      cells.push_back(cell(point, column));
      if (point.values.count(column)) row[column] = point.values.at(column);
    }
    cells.push_back(point.error);
    row["error"] = point.error.empty() ? json(nullptr) : json(point.error);
    rows.push_back(row);
    markdown += "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      // CSV: an error text may hold commas or quotes.
      const bool quote = cells[i].find_first_of(",\"") != std::string::npos;
      std::string escaped = cells[i];
      for (size_t at = escaped.find('"'); at != std::string::npos; at = escaped.find('"', at + 2)) escaped.insert(at, "\"");
      csv += (i ? "," : "") + (quote ? "\"" + escaped + "\"" : escaped);
      markdown += " " + cells[i] + " |";
    }
    csv += "\n";
    markdown += "\n";
  }
  io::write_text_file(out_dir / "results.csv", csv);
  io::write_text_file(out_dir / "results.md", markdown);
  const json results{{"provenance", result.provenance},
                     {"mode", result.mode},
                     {"keys", result.keys},
                     {"columns", result.columns},
                     {"rows", rows}};
  io::write_text_file(out_dir / "results.json", results.dump(2) + "\n");
  return markdown;
}

}  // namespace ltrain::bench
