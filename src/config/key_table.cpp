// The keys tables (load.h's ConfigKeys) of run configs and sweep files: every section and key as
// visit() describes it, with its type, limits, default and JSON Schema. --help's key lists, the
// JSON Schemas of both kinds of file and shell completion read them.
#include <algorithm>
#include <optional>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>

#include "key_types.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"

namespace ltrain::config {
namespace {

/// Every section and key of a visited struct's defaults as ConfigKeys describes them; a key outside
/// the sections (a sweep's "mode") is named without one.
struct KeyLister {
  ConfigKeys keys;
  std::string section_name;  ///< the section being listed; "" at the top level

  template <class S>
  void section(const char* name, S& part, const char* description) {
    keys.sections.push_back({name, description});
    section_name = name;
    part.visit(*this);
    section_name.clear();
  }
  template <class S>
  void section(const char* name, std::optional<S>& part, const char* description) {
    S defaults = part.value_or(S{});
    section(name, defaults, description);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* description, const C& constraint = {}) {
    KeyInfo info;
    info.name = section_name.empty() ? key : section_name + "." + key;
    info.description = description;
    info.type = type_text<T>(constraint);
    info.default_value = value_to_json(field);
    if constexpr (std::is_enum_v<T>) {
      for (const auto& [value, spelled] : EnumNames<T>::names) info.choices.emplace_back(spelled);
    } else if constexpr (std::is_same_v<T, bool>) {
      info.choices = {"true", "false"};
    }
    info.schema = key_schema<T>(constraint);
    info.schema["default"] = info.default_value;
    info.schema["description"] = description;
    keys.keys.push_back(std::move(info));
  }
};

/// --help's line width, and the width of its key column.
constexpr size_t kLineWidth = 110;
constexpr size_t kKeyWidth = 28;

/// The words of `text`, wrapped at kLineWidth: lines after the first start with `indent`, and the
/// first is taken to start there too.
std::string wrapped(const std::string& text, const std::string& indent) {
  std::string out;
  size_t column = indent.size();
  bool line_start = true;
  std::istringstream words(text);
  for (std::string word; words >> word; line_start = false) {
    if (!line_start && column + 1 + word.size() > kLineWidth) {
      out += "\n" + indent;
      column = indent.size();
      line_start = true;
    }
    if (!line_start) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
  }
  return out;
}

/// The keys table of a default T, as T::visit (or RunConfig's visit_sections) walks it.
template <class T>
ConfigKeys keys_of() {
  KeyLister lister;
  T defaults;
  if constexpr (std::is_same_v<T, RunConfig>) defaults.visit_sections(lister);
  else defaults.visit(lister);
  return lister.keys;
}

bool names_key_or_section(const ConfigKeys& table, const std::string& name) {
  return std::any_of(table.keys.begin(), table.keys.end(), [&](const KeyInfo& key) { return key.name == name; }) ||
         std::any_of(table.sections.begin(), table.sections.end(),
                     [&](const SectionInfo& section) { return section.name == name; });
}

/// The JSON Schema "properties" of a file `table` describes: each key of the top level, and each
/// section as an object of its keys and no others, in visit() order.
nlohmann::ordered_json properties_of(const ConfigKeys& table) {
  using ordered = nlohmann::ordered_json;
  ordered properties = ordered::object();
  for (const KeyInfo& key : table.keys) {
    const auto dot = key.name.find('.');
    if (dot == std::string::npos) {
      properties[key.name] = key.schema;
      continue;
    }
    const std::string section = key.name.substr(0, dot);
    if (!properties.contains(section)) {
      const auto info = std::find_if(table.sections.begin(), table.sections.end(),
                                     [&section](const SectionInfo& s) { return s.name == section; });
      properties[section] = {{"description", info->description},
                             {"type", "object"},
                             {"properties", ordered::object()},
                             {"additionalProperties", false}};
    }
    properties[section]["properties"][key.name.substr(dot + 1)] = key.schema;
  }
  return properties;
}

/// A JSON Schema (draft 2020-12) document of `properties`, no other keys.
nlohmann::ordered_json schema_document(const char* title, const char* description, nlohmann::ordered_json properties) {
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"title", title},
          {"description", description},
          {"type", "object"},
          {"properties", std::move(properties)},
          {"additionalProperties", false}};
}

}  // namespace

const ConfigKeys& config_keys() {
  static const ConfigKeys keys = keys_of<RunConfig>();
  return keys;
}

const ConfigKeys& sweep_keys() {
  static const ConfigKeys keys = keys_of<SweepSpec>();
  return keys;
}

bool is_key_or_section(const std::string& name) {
  const auto& renamed = renamed_keys();
  return names_key_or_section(config_keys(), name) ||
         std::any_of(renamed.begin(), renamed.end(), [&](const RenamedKey& key) { return name == key.earlier; });
}

const std::vector<RenamedKey>& renamed_keys() {
  static const std::vector<RenamedKey> keys{{"model.own_batchnorm", "model.ltrain_batch_norm"},
                                            {"model.fused_batchnorm", "model.cudnn_batch_norm"},
                                            {"model.own_max_pool", "model.ltrain_max_pool"},
                                            {"distributed.sync_batchnorm", "distributed.sync_batch_norm"}};
  return keys;
}

bool is_sweep_key_or_section(const std::string& name) { return names_key_or_section(sweep_keys(), name); }

std::string describe_keys(const ConfigKeys& table) {
  // argparse's layout, which Lightning's and jsonargparse's help share: the key, then its
  // description and (type, default), wrapped under the description; a key longer than its column
  // has the description on the next line.
  const std::string indent(2 + kKeyWidth + 2, ' ');
  std::string out;
  for (const KeyInfo& key : table.keys) {
    std::string text = "  " + key.name;
    text += text.size() + 2 > indent.size() ? "\n" + indent : std::string(indent.size() - text.size(), ' ');
    // Spaces around an enum's "|", so that a long list of choices wraps like words.
    std::string type = key.type;
    for (size_t at = type.find('|'); at != std::string::npos; at = type.find('|', at + 3)) type.replace(at, 1, " | ");
    out += text + wrapped(fmt::format("{} ({}, default {})", key.description, type, key.default_value.dump()), indent) +
           "\n";
  }
  return out;
}

nlohmann::ordered_json json_schema() {
  using ordered = nlohmann::ordered_json;
  ordered properties = ordered::object();
  properties["extends"] = {
      {"description", "the config file (or files, in order) this one builds on, relative to this file"},
      {"anyOf", ordered::array({{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}})}};
  properties.update(properties_of(config_keys()));
  return schema_document("ltrain run config",
                         "A run config of ltrain (ltrain train --config FILE); every key is optional and has a "
                         "default.",
                         std::move(properties));
}

nlohmann::ordered_json sweep_schema() {
  return schema_document("ltrain sweep file",
                         "A sweep of ltrain (ltrain sweep --config FILE): a base run config and the settings its "
                         "points vary; base is required, and a grid, a zip or a batch_search.",
                         properties_of(sweep_keys()));
}

nlohmann::ordered_json key_lists_schema() {
  using ordered = nlohmann::ordered_json;
  ordered properties = ordered::object();
  const nlohmann::ordered_json run_properties = properties_of(config_keys());
  for (const KeyInfo& key : config_keys().keys) {
    ordered value = key.schema;
    value.erase("default");
    value.erase("description");
    properties[key.name] = {{"description", key.description}, {"type", "array"}, {"items", value}};
  }
  for (const SectionInfo& section : config_keys().sections) {
    ordered value = run_properties[section.name];
    value.erase("description");
    properties[section.name] = {{"description", section.description}, {"type", "array"}, {"items", value}};
  }
  return {{"type", "object"}, {"properties", properties}, {"additionalProperties", false}};
}

}  // namespace ltrain::config
