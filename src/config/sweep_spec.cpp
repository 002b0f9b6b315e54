// Reading a sweep file (sweep_spec.h) as a run config is read: the strict reader, the overrides of
// its keys, each key read into SweepSpec with its type and limits, then the checks across keys.
#include "ltrain/config/sweep_spec.h"

#include <algorithm>

#include <fmt/format.h>

#include "key_reader.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "sources.h"
#include "strict_json.h"

namespace ltrain::config {
namespace {

using ordered_json = nlohmann::ordered_json;
namespace fs = std::filesystem;

/// Whether the override `spec` ("bench.steps=5", "mode=train") sets a key of the sweep file rather
/// than one of the run config of every point (a sweep's keys and sections and a run config's
/// sections have different names).
bool sets_sweep_key(const std::string& spec) {
  const std::string key = spec.substr(0, spec.find('='));
  return is_sweep_key_or_section(key.substr(0, key.find('.')));
}

/// Checks the run config override `spec` alone, over the defaults: its key, its value's type and
/// limits. (Checks across keys wait for the base config and the point's settings.)
void check_run_override(const std::string& spec, const std::string& source) {
  Document doc;
  apply_override(doc, spec, source, config_keys());
  std::vector<std::string> problems;
  read_run_config(doc, source, problems);
  if (!problems.empty()) throw ConfigError(problems.front());
}

/// The checks across the keys of a sweep file, each failure a ConfigError "<where the key was
/// set>: <key> = <value>: <message>".
class SweepChecks {
 public:
  SweepChecks(const LoadedSweep& sweep, const OrderedDocument& doc)
      : sweep_(sweep), spec_(sweep.spec), doc_(doc), file_(sweep.file.string()) {}

  void run() const {
    check_base();
    check_set();
    check_mode_and_batch_search();
    check_grid_and_zip();
    check_lr_scaling();
  }

 private:
  template <class Json>
  [[noreturn]] void fail(const std::string& key, const Json& value, const std::string& message) const {
    throw ConfigError(fmt::format("{}: {} = {}: {}", source_of(doc_, key, file_), shown(key),
                                  shown_value(value), message));
  }
  template <class T>
  void require(bool ok, const std::string& key, const T& value, const std::string& message) const {
    if (!ok) fail(key, nlohmann::json(value), message);
  }

  void check_base() const {
    require(!spec_.base.empty(), "base", spec_.base,
            "expected the run config the points start from, a path relative to the sweep file");
    // Checked here: otherwise every point would fail alike, and a sweep of failed points succeeds.
    if (const std::string problem = files::not_a_regular_file(sweep_.base); !problem.empty())
      fail("base", nlohmann::json(spec_.base),
           fmt::format("{}: {} (paths are relative to the sweep file)", shown(sweep_.base.string()), problem));
  }

  /// Each of "set" is a run config override: its key one of a run config, its value of that key's
  /// type and within its limits.
  void check_set() const {
    const std::string source = source_of(doc_, "set", file_);
    for (size_t i = 0; i < spec_.set.size(); ++i)
      check_run_override(spec_.set[i], fmt::format("{}: set[{}]", source, i));
  }

  void check_mode_and_batch_search() const {
    if (!spec_.batch_search) return;
    require(spec_.mode == SweepMode::bench, "mode", to_string(spec_.mode),
            "batch_search measures the memory of timed steps: use it with mode \"bench\"");
    require(spec_.batch_search->max >= spec_.batch_search->start, "batch_search.max", spec_.batch_search->max,
            fmt::format("expected at least batch_search.start ({})", spec_.batch_search->start));
  }

  void check_grid_and_zip() const {
    require(!spec_.grid.empty() || !spec_.zip.empty() || spec_.batch_search, "grid", nlohmann::json::object(),
            "a sweep varies something: give a grid, a zip or a batch_search");
    for (const auto& [key, values] : spec_.zip) {
      const auto& [first_key, first_values] = spec_.zip.front();
      require(values.size() == first_values.size(), "zip." + key, values,
              fmt::format("expected {} values, as many as zip.{} has: zip takes the i-th value of every list "
                          "together",
                          first_values.size(), first_key));
      const bool in_grid = std::any_of(spec_.grid.begin(), spec_.grid.end(),
                                       [&zip_key = key](const auto& list) { return list.first == zip_key; });
      require(!in_grid, "zip." + key, values, fmt::format("{} is in grid too; keep it in one of them", key));
    }
    check_point_count();
  }

  void check_point_count() const {
    const double zip_length = spec_.zip.empty() ? 1.0 : static_cast<double>(spec_.zip.front().second.size());
    double points = zip_length;
    for (const auto& [key, values] : spec_.grid) points *= static_cast<double>(values.size());
    if (points <= static_cast<double>(kMaxSweepPoints)) return;
    const char* key = spec_.grid.empty() ? "zip" : "grid";
    const char* count = spec_.grid.empty()  ? "the length of its lists"
                        : spec_.zip.empty() ? "the product of its lists' lengths"
                                            : "the product of its lists' lengths, times zip's length";
    fail(key, doc_.root.at(key),
         fmt::format("{:.4g} points ({}) are more than {}; shorten the lists or split the sweep", points, count,
                     kMaxSweepPoints));
  }

  void check_lr_scaling() const {
    if (!spec_.scale_lr_with) return;
    const LrScaling& lr = *spec_.scale_lr_with;
    require(lr.reference > 0.0, "scale_lr_with.reference", lr.reference,
            "expected a number > 0: the value of scale_lr_with.key at which optim.lr is the base config's (e.g. 256 "
            "for data.batch_size)");
    const auto swept = [&lr](const KeyLists& lists) {
      return std::any_of(lists.begin(), lists.end(), [&lr](const auto& list) { return list.first == lr.key; });
    };
    require(swept(spec_.grid) || swept(spec_.zip) || (spec_.batch_search && lr.key == "data.batch_size"),
            "scale_lr_with.key", lr.key,
            "not a key of the grid or zip (or data.batch_size with batch_search); the LR scales with a value the "
            "sweep varies");
  }

  const LoadedSweep& sweep_;
  const SweepSpec& spec_;
  const OrderedDocument& doc_;
  const std::string file_;  ///< where a key not set by an override was set
};

}  // namespace

LoadedSweep load_sweep(const fs::path& file, const std::vector<std::string>& overrides) {
  const std::string text = read_config_text(file, "give the path of a sweep file (ltrain sweep --help lists its keys)");
  OrderedDocument doc;
  doc.root = parse_or_throw<ordered_json>(text, file.string());  // the grid's keys in the file's order
  if (!doc.root.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of sweep keys at the top level (ltrain sweep --help "
                                  "lists them)",
                                  file.string()));
  LoadedSweep sweep;
  sweep.file = file;
  for (const std::string& spec : overrides) {
    if (sets_sweep_key(spec)) apply_override(doc, spec, override_source(spec), sweep_keys());
    else sweep.point_overrides.push_back(spec);
  }
  const std::string source = file.string();
  KeyReader<ordered_json> reader(doc.root, "", doc, source);
  sweep.spec.visit(reader);
  reader.reject_unknown_keys();
  sweep.base = file.parent_path() / sweep.spec.base;
  SweepChecks(sweep, doc).run();
  for (const std::string& spec : sweep.point_overrides) check_run_override(spec, override_source(spec));
  return sweep;
}

}  // namespace ltrain::config
