// Sources (sources.h): files and their "extends" chains, overrides, and the source of each key.
#include "sources.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "strict_json.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kExtendsKey = "extends";

/// Copies `source_value` over `target`, recursing into objects, and records who set each key.
template <class Json>
void merge(Json& target, const Json& source_value, const std::string& prefix, const std::string& source,
           std::map<std::string, std::string>& origin) {
  for (const auto& [key, value] : source_value.items()) {
    const std::string path = join_key(prefix, key);
    origin[path] = source;
    if (value.is_object()) {
      if (!target.contains(key) || !target[key].is_object()) target[key] = Json::object();
      merge(target[key], value, path, source, origin);
    } else {
      target[key] = value;
    }
  }
}

/// `path` as the chain of files being read holds it (canonical); ConfigError when the chain holds
/// it already ("extends" makes a cycle) or is kMaxNesting files long.
fs::path next_link(const fs::path& path, const std::vector<fs::path>& chain) {
  std::error_code no_canonical_form;
  fs::path canonical = fs::weakly_canonical(path, no_canonical_form);
  if (no_canonical_form) canonical = path.lexically_normal();
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    std::string cycle;
    for (const auto& p : chain) cycle += p.filename().string() + " -> ";
    throw ConfigError(fmt::format("{}: \"extends\" makes a cycle: {}{}; remove one of the links", path.string(),
                                  cycle, path.filename().string()));
  }
  if (chain.size() >= static_cast<size_t>(kMaxNesting))
    throw ConfigError(fmt::format("{}: \"extends\" chains more than {} files; merge some of them", path.string(),
                                  kMaxNesting));
  return canonical;
}

/// The file names the "extends" of `file_doc` (the file `path`) holds, in order; none without it.
std::vector<std::string> extended_names(const json& file_doc, const fs::path& path) {
  const auto extends = file_doc.find(kExtendsKey);
  if (extends == file_doc.end()) return {};
  if (extends->is_string()) return {extends->get<std::string>()};
  if (extends->is_array() && std::all_of(extends->begin(), extends->end(), [](const json& e) { return e.is_string(); }))
    return extends->get<std::vector<std::string>>();
  throw ConfigError(fmt::format("{}: extends = {}: expected a file name or a list of file names", path.string(),
                                shown_value(*extends)));
}

/// The file `name` that `path` extends, relative to `path`'s folder; ConfigError when it is not a
/// regular file.
fs::path extended_file(const fs::path& path, const std::string& name) {
  const fs::path base = (path.parent_path() / name).lexically_normal();
  if (const std::string problem = files::not_a_regular_file(base); !problem.empty())
    throw ConfigError(fmt::format("{}: extends = \"{}\": {}: {} (paths are relative to this file)", path.string(),
                                  shown(name), shown_path(base), problem));
  return base;
}

/// The parts of an override's key: {"section", "name"} or {"section"}; none when it has another
/// form, which names no setting.
std::vector<std::string> key_parts(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream split(key);
  for (std::string part; std::getline(split, part, '.');) parts.push_back(part);
  if (key.size() > kMaxStringBytes || key.back() == '.' || parts.size() > 2 ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    return {};
  return parts;
}

/// The value of an override of `key`: its text read as JSON, or else the text as a string.
template <class Json>
Json override_value(const std::string& text, const std::string& source, const std::string& key) {
  std::string not_json;
  if (std::optional<Json> parsed = parse_strictly<Json>(text, source, key, not_json)) return std::move(*parsed);
  if (const std::string why = string_problem(text); !why.empty())
    throw ConfigError(fmt::format("{}: {} = {}: {}", source, shown(key), shown_value(Json(text)), why));
  return Json(text);
}

/// Whether `keys` has a key `name` of the top level (one outside every section, as a sweep's "mode").
bool is_top_level_key(const ConfigKeys& keys, const std::string& name) {
  return std::any_of(keys.keys.begin(), keys.keys.end(), [&name](const KeyInfo& key) { return key.name == name; });
}

}  // namespace

void read_file_into(Document& doc, const fs::path& path, std::vector<fs::path>& chain) {
  const std::string text = read_config_text(path, "give the path of a run config (the examples are in configs/)");
  const fs::path link = next_link(path, chain);
  json file_doc = parse_or_throw<json>(text, path.string());
  if (!file_doc.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of config sections at the top level", path.string()));
  chain.push_back(link);
  doc.files.push_back(path.string());
  for (const std::string& name : extended_names(file_doc, path)) read_file_into(doc, extended_file(path, name), chain);
  file_doc.erase(kExtendsKey);
  chain.pop_back();
  merge(doc.root, file_doc, "", path.string(), doc.origin);
}

std::string override_source(const std::string& spec) { return "--set " + shown(spec); }

void rename_earlier_keys(Document& doc, const std::string& default_source) {
  static std::mutex noted_mutex;
  static std::set<std::string> noted;  // earlier names already noted in this process
  for (const RenamedKey& renamed : renamed_keys()) {
    const std::string earlier = renamed.earlier, now = renamed.now;
    const std::string section = earlier.substr(0, earlier.find('.'));
    const std::string earlier_key = earlier.substr(section.size() + 1), now_key = now.substr(section.size() + 1);
    const auto found = doc.root.find(section);
    if (found == doc.root.end() || !found->is_object() || !found->contains(earlier_key)) continue;
    const std::string source = source_of(doc, earlier, default_source);
    if (found->contains(now_key))
      throw ConfigError(fmt::format("{}: {} and {} ({}) are one setting under its earlier and its present name; "
                                    "keep {}",
                                    source, earlier, now, source_of(doc, now, default_source), now));
    (*found)[now_key] = std::move((*found)[earlier_key]);
    found->erase(earlier_key);
    for (auto* by_key : {&doc.origin, &doc.override_text}) {
      if (const auto entry = by_key->find(earlier); entry != by_key->end()) {
        (*by_key)[now] = entry->second;
        by_key->erase(entry);
      }
    }
    const std::lock_guard<std::mutex> lock(noted_mutex);
    if (noted.insert(earlier).second)
      spdlog::warn("{}: {} is now called {}; the earlier name still works", source, earlier, now);
  }
}

template <class Json>
void apply_override(BasicDocument<Json>& doc, const std::string& spec, const std::string& source,
                    const ConfigKeys& keys) {
  if (!is_utf8(spec)) throw ConfigError(fmt::format("{}: not valid UTF-8; write the setting in UTF-8", source));
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("{}: expected KEY=VALUE, for example --set optim.lr=0.05", source));
  const std::string key = spec.substr(0, eq);
  const std::string text = spec.substr(eq + 1);
  const std::vector<std::string> parts = key_parts(key);
  Json value = override_value<Json>(text, source, key);
  if (parts.size() == 1 && is_top_level_key(keys, key)) {
    Json replaced = Json::object();
    replaced[key] = std::move(value);
    doc.root.erase(key);
    merge(doc.root, replaced, "", source, doc.origin);
    doc.override_text[key] = text;
    return;
  }
  const bool whole_section = parts.size() == 1 && value.is_object();
  if (parts.size() < 2 && !whole_section)
    throw ConfigError(fmt::format("{}: expected a key of the form section.name, for example optim.lr", source));

  Json& section = doc.root[parts[0]];
  if (!section.is_object()) section = Json::object();
  doc.origin[parts[0]] = source;
  if (whole_section) {
    merge(section, value, parts[0], source, doc.origin);
    return;
  }
  section[parts[1]] = std::move(value);
  doc.origin[key] = source;
  doc.override_text[key] = text;
}

template void apply_override(Document&, const std::string&, const std::string&, const ConfigKeys&);
template void apply_override(OrderedDocument&, const std::string&, const std::string&, const ConfigKeys&);

}  // namespace ltrain::config
