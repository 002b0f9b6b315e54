#include "ltrain/config/load.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ltrain/core/errors.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kExtendsKey = "extends";

/// A JSON document being assembled from files and overrides, with the source of every key.
struct Document {
  json root = json::object();
  std::map<std::string, std::string> origin;         // "optim.lr" -> "configs/x.json"
  std::map<std::string, std::string> override_text;  // "run.name" -> "123" as typed after --set
};

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

/// Copies `source_value` over `target`, recursing into objects, and records who set each key.
void merge(json& target, const json& source_value, const std::string& prefix, const std::string& source,
           std::map<std::string, std::string>& origin) {
  for (const auto& [key, value] : source_value.items()) {
    const std::string path = join_key(prefix, key);
    origin[path] = source;
    if (value.is_object()) {
      if (!target.contains(key) || !target[key].is_object()) target[key] = json::object();
      merge(target[key], value, path, source, origin);
    } else {
      target[key] = value;
    }
  }
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw ConfigError(fmt::format("{}: cannot read this config file", path.string()));
  return text.str();
}

void load_file_into(Document& doc, const fs::path& path, std::vector<fs::path>& chain) {
  const fs::path canonical = fs::weakly_canonical(path);
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    std::string cycle;
    for (const auto& p : chain) cycle += p.filename().string() + " -> ";
    throw ConfigError(fmt::format("{}: \"extends\" makes a cycle: {}{}; remove one of the links", path.string(),
                                  cycle, path.filename().string()));
  }
  json file_doc;
  try {
    file_doc = json::parse(read_text(path));
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] ": keep only the human part.
    if (auto close = what.find("] "); close != std::string::npos) what = what.substr(close + 2);
    throw ConfigError(fmt::format("{}: not valid JSON: {}", path.string(), what));
  }
  if (!file_doc.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of config sections at the top level", path.string()));

  chain.push_back(canonical);
  if (file_doc.contains(kExtendsKey)) {
    const json& extends = file_doc[kExtendsKey];
    std::vector<std::string> bases;
    if (extends.is_string()) {
      bases.push_back(extends.get<std::string>());
    } else if (extends.is_array() && std::all_of(extends.begin(), extends.end(), [](const json& e) { return e.is_string(); })) {
      for (const auto& e : extends) bases.push_back(e.get<std::string>());
    } else {
      throw ConfigError(fmt::format("{}: extends = {}: expected a file name or a list of file names", path.string(),
                                    extends.dump()));
    }
    for (const auto& base : bases) {
      const fs::path base_path = (path.parent_path() / base).lexically_normal();
      if (!fs::exists(base_path))
        throw ConfigError(fmt::format("{}: extends = \"{}\": no such file {} (paths are relative to this file)",
                                      path.string(), base, base_path.string()));
      load_file_into(doc, base_path, chain);
    }
    file_doc.erase(kExtendsKey);
  }
  chain.pop_back();
  merge(doc.root, file_doc, "", path.string(), doc.origin);
}

void apply_override(Document& doc, const std::string& spec) {
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("--set {}: expected KEY=VALUE, for example --set optim.lr=0.05", spec));
  const std::string key = spec.substr(0, eq);
  const std::string text = spec.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream split(key);
  for (std::string part; std::getline(split, part, '.');) parts.push_back(part);
  if (parts.size() < 2 || std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    throw ConfigError(fmt::format("--set {}: expected a key of the form section.name, for example optim.lr", spec));

  // The value is JSON when it parses as JSON (numbers, true/false, lists), otherwise a plain string.
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;

  json* node = &doc.root;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path = join_key(path, parts[i]);
    if (!node->contains(parts[i]) || !(*node)[parts[i]].is_object()) (*node)[parts[i]] = json::object();
    node = &(*node)[parts[i]];
    doc.origin[path] = "--set " + spec;
  }
  (*node)[parts.back()] = value;
  doc.origin[key] = "--set " + spec;
  doc.override_text[key] = text;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

/// "unknown key" with the closest known key, or the list of known keys.
[[noreturn]] void throw_unknown_key(const std::string& source, const std::string& prefix, const std::string& key,
                                    const std::vector<std::string>& known) {
  const std::string path = join_key(prefix, key);
  // The closest known key within two edits, or one that the typed key starts with ("optimizer").
  std::string best;
  size_t best_distance = 3;
  for (const auto& k : known) {
    const size_t d = key.rfind(k, 0) == 0 || k.rfind(key, 0) == 0 ? 1 : edit_distance(key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  if (!best.empty())
    throw ConfigError(fmt::format("{}: unknown key \"{}\": did you mean \"{}\"?", source, path, join_key(prefix, best)));
  throw ConfigError(fmt::format("{}: unknown key \"{}\"; the keys {} are: {}", source, path,
                                prefix.empty() ? "at the top level" : "of " + prefix, join(known, ", ")));
}

// ---- Constraint texts ----------------------------------------------------------------------------

[[maybe_unused]] std::string describe_range(const NoLimit&) { return ""; }
std::string describe_range(const Range& r) {
  if (r.hi >= 1e299) return fmt::format("{} {}", r.lo_exclusive ? ">" : ">=", r.lo);
  if (r.lo_exclusive) return fmt::format("> {} and <= {}", r.lo, r.hi);
  return fmt::format("between {} and {}", r.lo, r.hi);
}
[[maybe_unused]] bool in_range(double, const NoLimit&) { return true; }
bool in_range(double value, const Range& r) {
  return (r.lo_exclusive ? value > r.lo : value >= r.lo) && value <= r.hi;
}
template <class C>
std::string with_range(const std::string& noun, const C& constraint) {
  const std::string range = describe_range(constraint);
  return range.empty() ? noun : noun + " " + range;
}

template <class E>
std::string enum_choices(const char* separator) {
  std::vector<std::string> names;
  for (const auto& [value, name] : EnumNames<E>::names) names.push_back(name);
  return join(names, separator);
}

// What the user must give for a field of type T, e.g. "an integer >= 1", "one of sgd, adamw".
template <class T, class C>
std::string expectation(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("an integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("a number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("a list of numbers", c);
  else return "one of " + enum_choices<T>(", ");
}

// The short type column of --help, e.g. "integer >= 1", "sgd|adamw".
template <class T, class C>
std::string type_text(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true|false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("list of numbers", c);
  else return enum_choices<T>("|");
}

template <class T>
json value_to_json(const T& value) {
  if constexpr (std::is_enum_v<T>) return to_string(value);
  else return value;
}

// ---- Visitors over the sections ----------------------------------------------------------------

/// Parses one section's JSON object into its struct, strictly.
class FieldReader {
 public:
  FieldReader(const json& object, std::string section, const Document& doc, const std::string& default_source)
      : object_(object), section_(std::move(section)), doc_(doc), default_source_(default_source) {}

  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const C& constraint = {}) {
    known_.emplace_back(key);
    auto it = object_.find(key);
    if (it == object_.end()) return;
    const std::string path = join_key(section_, key);
    if (!parse(*it, path, field, constraint)) {
      throw ConfigError(fmt::format("{}: {} = {}: expected {}", source_of(path), path, it->dump(),
                                    expectation<T>(constraint)));
    }
  }

  void reject_unknown_keys() const {
    for (const auto& [key, value] : object_.items()) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        throw_unknown_key(source_of(join_key(section_, key)), section_, key, known_);
    }
  }

 private:
  std::string source_of(const std::string& path) const {
    auto it = doc_.origin.find(path);
    return it == doc_.origin.end() ? default_source_ : it->second;
  }

  template <class C>
  bool parse(const json& v, const std::string&, int64_t& out, const C& c) {
    if (!v.is_number_integer()) return false;
    out = v.get<int64_t>();
    return in_range(static_cast<double>(out), c);
  }
  template <class C>
  bool parse(const json& v, const std::string&, double& out, const C& c) {
    if (!v.is_number()) return false;
    out = v.get<double>();
    return in_range(out, c);
  }
  template <class C>
  bool parse(const json& v, const std::string&, bool& out, const C&) {
    if (!v.is_boolean()) return false;
    out = v.get<bool>();
    return true;
  }
  template <class C>
  bool parse(const json& v, const std::string& path, std::string& out, const C&) {
    if (v.is_string()) {
      out = v.get<std::string>();
      return true;
    }
    // `--set run.name=2024` reads as a number; for a string key, take the text as typed.
    auto typed = doc_.override_text.find(path);
    if (typed == doc_.override_text.end() || v.is_object() || v.is_array()) return false;
    out = typed->second;
    return true;
  }
  template <class C>
  bool parse(const json& v, const std::string&, std::vector<double>& out, const C& c) {
    if (!v.is_array()) return false;
    std::vector<double> values;
    for (const auto& e : v) {
      if (!e.is_number() || !in_range(e.get<double>(), c)) return false;
      values.push_back(e.get<double>());
    }
    out = std::move(values);
    return true;
  }
  template <class E, class C, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  bool parse(const json& v, const std::string&, E& out, const C&) {
    if (!v.is_string()) return false;
    for (const auto& [value, name] : EnumNames<E>::names) {
      if (v.get<std::string>() == name) {
        out = value;
        return true;
      }
    }
    return false;
  }

  const json& object_;
  std::string section_;
  const Document& doc_;
  const std::string& default_source_;
  std::vector<std::string> known_;
};

class SectionReader {
 public:
  SectionReader(const Document& doc, const std::string& default_source) : doc_(doc), default_source_(default_source) {}

  template <class S>
  void section(const char* name, S& target) {
    known_.emplace_back(name);
    auto it = doc_.root.find(name);
    if (it == doc_.root.end()) return;
    if (!it->is_object()) {
      throw ConfigError(fmt::format("{}: {} = {}: expected an object of {} keys", source_of(name), name, it->dump(),
                                    name));
    }
    FieldReader reader(*it, name, doc_, default_source_);
    target.visit(reader);
    reader.reject_unknown_keys();
  }

  void reject_unknown_sections() const {
    for (const auto& [key, value] : doc_.root.items()) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        throw_unknown_key(source_of(key), "", key, known_);
    }
  }

 private:
  std::string source_of(const std::string& path) const {
    auto it = doc_.origin.find(path);
    return it == doc_.origin.end() ? default_source_ : it->second;
  }
  const Document& doc_;
  const std::string& default_source_;
  std::vector<std::string> known_;
};

struct JsonWriter {
  json out = json::object();
  json* current = nullptr;

  template <class S>
  void section(const char* name, S& s) {
    out[name] = json::object();
    current = &out[name];
    s.visit(*this);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const C& = {}) {
    (*current)[key] = value_to_json(field);
  }
};

struct KeyDescriber {
  std::vector<std::array<std::string, 3>> rows;  // key, type, default
  std::string prefix;

  template <class S>
  void section(const char* name, S& s) {
    prefix = name;
    s.visit(*this);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const C& constraint = {}) {
    rows.push_back({prefix + "." + key, type_text<T>(constraint), value_to_json(field).dump()});
  }
};

// ---- Checks across keys ------------------------------------------------------------------------

/// Throws config_error(loaded, key, message) unless `ok`.
void require(const LoadedConfig& loaded, bool ok, const std::string& key, const std::string& message) {
  if (!ok) throw config_error(loaded, key, message);
}

bool valid_device(const std::string& device) {
  if (device == "auto" || device == "cpu" || device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void validate(const LoadedConfig& loaded) {
  const RunConfig& c = loaded.config;

  require(loaded, !c.run.name.empty() && c.run.name.find('/') == std::string::npos && c.run.name != "." &&
                    c.run.name != "..",
                "run.name", "expected a folder name without '/'");
  require(loaded, valid_device(c.run.device), "run.device", "expected auto, cpu, cuda or cuda:N");
  require(loaded, c.data.mean.size() == 3, "data.mean", "expected a list of 3 numbers (R, G, B)");
  require(loaded, c.data.std.size() == 3, "data.std", "expected a list of 3 numbers (R, G, B)");
  require(loaded, c.optim.betas.size() == 2, "optim.betas", "expected a list of 2 numbers (beta1, beta2)");
  require(loaded, !c.optim.nesterov || (c.optim.name == OptimizerKind::sgd && c.optim.momentum > 0), "optim.nesterov",
                "Nesterov momentum needs optim.name \"sgd\" and optim.momentum > 0");
  require(loaded, c.schedule.name != ScheduleKind::onecycle || c.schedule.warmup_epochs == 0, "schedule.warmup_epochs",
                "the onecycle schedule has its own warm-up (schedule.pct_start); set schedule.warmup_epochs to 0");
  require(loaded, c.schedule.warmup_epochs < static_cast<double>(c.run.epochs), "schedule.warmup_epochs",
                fmt::format("expected fewer epochs than run.epochs ({})", c.run.epochs));
  require(loaded, std::is_sorted(c.schedule.milestones.begin(), c.schedule.milestones.end()) &&
                    std::adjacent_find(c.schedule.milestones.begin(), c.schedule.milestones.end()) ==
                        c.schedule.milestones.end(),
                "schedule.milestones", "expected epochs in increasing order");
  require(loaded, c.schedule.name != ScheduleKind::multistep || !c.schedule.milestones.empty(), "schedule.milestones",
                "the multistep schedule needs at least one milestone epoch");
  require(loaded, !(c.precision.mode == PrecisionMode::tf32 && loaded.origin.count("precision.tf32") && !c.precision.tf32),
          "precision.tf32", "precision.mode \"tf32\" means TF32 on; use precision.mode \"fp32\" for IEEE float32");
  require(loaded, !(c.precision.deterministic && c.precision.cudnn_benchmark), "precision.cudnn_benchmark",
          "cuDNN autotuning picks algorithms by timing, which is not deterministic; turn off one of "
          "precision.cudnn_benchmark and precision.deterministic");
}

LoadedConfig resolve(Document doc, const std::vector<std::string>& overrides, const std::string& default_source) {
  for (const auto& spec : overrides) apply_override(doc, spec);
  LoadedConfig loaded;
  SectionReader reader(doc, default_source);
  loaded.config.visit_sections(reader);
  reader.reject_unknown_sections();
  loaded.origin = std::move(doc.origin);
  loaded.source = default_source;
  validate(loaded);
  return loaded;
}

}  // namespace

LoadedConfig load_file(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  if (!fs::is_regular_file(path))
    throw ConfigError(fmt::format("{}: no such config file (the examples are in configs/)", path.string()));
  Document doc;
  std::vector<fs::path> chain;
  load_file_into(doc, path, chain);
  return resolve(std::move(doc), overrides, path.string());
}

LoadedConfig load_json(const nlohmann::json& document, const std::string& source,
                       const std::vector<std::string>& overrides) {
  if (!document.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of config sections at the top level", source));
  Document doc;
  doc.root = document;
  return resolve(std::move(doc), overrides, source);
}

ConfigError config_error(const LoadedConfig& loaded, const std::string& key, const std::string& message) {
  auto it = loaded.origin.find(key);
  const std::string& source = it == loaded.origin.end() ? loaded.source : it->second;
  const auto dot = key.find('.');
  const json value = to_json(loaded.config)[key.substr(0, dot)][key.substr(dot + 1)];
  return ConfigError(fmt::format("{}: {} = {}: {}", source, key, value.dump(), message));
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
  for (const auto& [section, keys] : resolved.items()) {
    for (const auto& [key, value] : keys.items()) {
      const std::string path = section + "." + key;
      auto from = loaded.origin.find(path);
      rows.push_back({path, value.is_string() ? value.get<std::string>() : value.dump(),
                      from == loaded.origin.end() ? "default" : from->second});
    }
  }
  size_t key_width = 0, value_width = 0;
  for (const auto& row : rows) key_width = std::max(key_width, row[0].size()), value_width = std::max(value_width, row[1].size());
  std::string out;
  for (const auto& row : rows) out += fmt::format("  {:<{}}  {:<{}}  {}\n", row[0], key_width, row[1], value_width, row[2]);
  return out;
}

std::string describe_keys() {
  KeyDescriber describer;
  RunConfig defaults;
  defaults.visit_sections(describer);
  size_t key_width = 0, type_width = 0;
  for (const auto& row : describer.rows) key_width = std::max(key_width, row[0].size()), type_width = std::max(type_width, row[1].size());
  std::string out;
  for (const auto& row : describer.rows)
    out += fmt::format("  {:<{}}  {:<{}}  (default {})\n", row[0], key_width, row[1], type_width, row[2]);
  return out;
}

}  // namespace ltrain::config
