// A config as others see it: JSON (to_json, what config.json and --print-config hold), the
// settings that changed between two of them, the start-up table of the settings that differ from
// the defaults, and the data set it trains on.
#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "key_types.h"
#include "ltrain/config/load.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;

/// Writes each visited field into `out`, section by section.
struct JsonWriter {
  json out = json::object();
  json* current = nullptr;

  template <class S>
  void section(const char* name, S& s, const char* /*description*/) {
    out[name] = json::object();
    current = &out[name];
    s.visit(*this);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* /*description*/, const C& = {}) {
    (*current)[key] = value_to_json(field);
  }
};

}  // namespace

nlohmann::json data_summary(const DataSection& data) {
  json summary{{"source", to_string(data.source)}, {"classes", data.classes()}};
  if (data.source == DataSource::cifar100) summary["cifar100_labels"] = to_string(data.cifar100_labels);
  return summary;
}

nlohmann::json to_json(const RunConfig& config) {
  JsonWriter writer;
  RunConfig copy = config;  // visit() hands out mutable references; the writer only reads them
  copy.visit_sections(writer);
  return writer.out;
}

std::vector<std::string> changed_settings(const nlohmann::json& before, const nlohmann::json& after) {
  static const json defaults = to_json(RunConfig{});
  std::vector<std::string> changes;
  for (const auto& [section, keys] : after.items()) {
    for (const auto& [key, value] : keys.items()) {
      const bool known = before.contains(section) && before[section].contains(key);
      const json fallback = defaults.contains(section) ? defaults[section].value(key, json()) : json();
      const json& old = known ? before[section][key] : fallback;
      if (old != value) changes.push_back(fmt::format("{}.{} ({} -> {})", section, key, old.dump(), value.dump()));
    }
  }
  return changes;
}

std::string format_table(const LoadedConfig& loaded) {
  const json resolved = to_json(loaded.config);
  std::vector<std::array<std::string, 3>> rows{{"key", "value", "from"}};
  for (const KeyInfo& key : config_keys().keys) {
    const auto dot = key.name.find('.');
    const json& value = resolved[key.name.substr(0, dot)][key.name.substr(dot + 1)];
    if (value == key.default_value) continue;
    // A document loaded whole (a checkpoint's config) records no origin per key.
    auto from = loaded.origin.find(key.name);
    rows.push_back({key.name, value.is_string() ? value.get<std::string>() : value.dump(),
                    from == loaded.origin.end() ? loaded.source : from->second});
  }
  const size_t changed = rows.size() - 1;
  if (changed == 0) return "every setting is at its default\n";
  size_t key_width = 0, value_width = 0;
  for (const auto& row : rows) {
    key_width = std::max(key_width, row[0].size());
    value_width = std::max(value_width, row[1].size());
  }
  std::string out = fmt::format("{} setting{} from the defaults:\n", changed, changed == 1 ? " differs" : "s differ");
  for (const auto& row : rows)
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", row[0], key_width, row[1], value_width, row[2]);
  return out;
}

}  // namespace ltrain::config
