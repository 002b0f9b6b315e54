#pragma once
// Reading a document into the visited structs, key by key: each value's type and limits (the
// "expected ..." of a message), strings the reader refuses, and unknown keys with the closest
// known one ("did you mean").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "key_types.h"
#include "ltrain/config/config.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"
#include "sources.h"
#include "strict_json.h"

namespace ltrain::config {

/// ConfigError "<source>: unknown key "<prefix.key>": did you mean "<prefix.closest>"?", or with the
/// list of `known` when none is close.
[[noreturn]] void throw_unknown_key(const std::string& source, const std::string& prefix, const std::string& key,
                                    const std::vector<std::string>& known);

/// The same for a key of a sweep's grid or zip (`prefix`), which must be a run config key or section.
[[noreturn]] void throw_unknown_run_key(const std::string& source, const std::string& prefix, const std::string& key);

/// Reads the JSON object `object`, the value at `path` of `doc` ("" for the document itself), into
/// the fields and sections that a struct's visit() names, strictly: each value of the type and
/// within the limits of its field, and no key that visit() does not name (reject_unknown_keys).
/// A section's object is read by a KeyReader of its own. With `problems`, a value of the wrong type
/// or out of its limits, a section that is no object and an unknown key each add their line there
/// (the field keeps its default) and reading goes on, so that one run names them all; without, the
/// first is thrown.
template <class Json>
class KeyReader {
 public:
  KeyReader(const Json& object, std::string path, const BasicDocument<Json>& doc, const std::string& default_source,
            std::vector<std::string>* problems = nullptr)
      : object_(object), path_(std::move(path)), doc_(doc), default_source_(default_source), problems_(problems) {}

  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* /*description*/, const C& constraint = {}) {
    known_.emplace_back(key);
    const auto it = object_.find(key);
    if (it == object_.end()) return;
    const std::string path = join_key(path_, key);
    T value = field;
    if (parse(*it, path, value, constraint))
      field = std::move(value);
    else
      report(ConfigError(fmt::format("{}: {} = {}: expected {}", source_of(path), path, shown_value(*it),
                                     expectation<T>(constraint))));
  }

  template <class S>
  void section(const char* name, S& part, const char* /*description*/) {
    known_.emplace_back(name);
    const auto it = object_.find(name);
    if (it != object_.end()) read_section(*it, name, part);
  }

  /// A section the file may leave out, which then stays empty (a sweep's batch_search).
  template <class S>
  void section(const char* name, std::optional<S>& part, const char* /*description*/) {
    known_.emplace_back(name);
    const auto it = object_.find(name);
    if (it != object_.end()) read_section(*it, name, part.emplace());
  }

  void reject_unknown_keys() const {
    for (const auto& [key, value] : object_.items()) {
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      try {
        throw_unknown_key(source_of(join_key(path_, key)), path_, key, known_);
      } catch (const ConfigError& error) {
        report(error);
      }
    }
  }

 private:
  /// Adds `error`'s line to the problems, or throws it where none are gathered.
  void report(const ConfigError& error) const {
    if (!problems_) throw error;
    problems_->push_back(error.what());
  }

  const std::string& source_of(const std::string& path) const {
    return config::source_of(doc_, path, default_source_);
  }

  template <class S>
  void read_section(const Json& value, const char* name, S& part) const {
    const std::string path = join_key(path_, name);
    if (!value.is_object()) {
      report(ConfigError(fmt::format("{}: {} = {}: expected an object of {} keys", source_of(path), path,
                                     shown_value(value), path)));
      return;
    }
    KeyReader reader(value, path, doc_, default_source_, problems_);
    part.visit(reader);
    reader.reject_unknown_keys();
  }

  template <class C>
  bool parse(const Json& v, const std::string&, int64_t& out, const C& c) {
    // An unsigned JSON number past int64's range would wrap around to a negative one.
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.template get<uint64_t>() > INT64_MAX)) return false;
    out = v.template get<int64_t>();
    return in_range(static_cast<double>(out), c);
  }
  template <class C>
  bool parse(const Json& v, const std::string&, double& out, const C& c) {
    if (!v.is_number() || !std::isfinite(v.template get<double>())) return false;
    out = v.template get<double>();
    return in_range(out, c);
  }
  template <class C>
  bool parse(const Json& v, const std::string&, bool& out, const C&) {
    if (!v.is_boolean()) return false;
    out = v.template get<bool>();
    return true;
  }
  template <class C>
  bool parse(const Json& v, const std::string& path, std::string& out, const C&) {
    if (v.is_string()) {
      out = v.template get<std::string>();
      // A document built elsewhere (a checkpoint's saved config) has not been through the reader.
      if (const std::string why = string_problem(out); !why.empty())
        throw ConfigError(fmt::format("{}: {} = {}: {}", source_of(path), path, shown_value(v), why));
      return true;
    }
    // `--set run.name=2024` reads as a number; for a string key, take the text as typed.
    auto typed = doc_.override_text.find(path);
    if (typed == doc_.override_text.end() || v.is_object() || v.is_array()) return false;
    out = typed->second;
    return true;
  }
  template <class C>
  bool parse(const Json& v, const std::string&, std::vector<double>& out, const C& c) {
    if (!v.is_array()) return false;
    std::vector<double> values;
    for (const auto& e : v) {
      if (!e.is_number() || !std::isfinite(e.template get<double>()) || !in_range(e.template get<double>(), c))
        return false;
      values.push_back(e.template get<double>());
    }
    out = std::move(values);
    return true;
  }
  template <class C>
  bool parse(const Json& v, const std::string&, std::vector<std::string>& out, const C&) {
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_string(); })) return false;
    out = v.template get<std::vector<std::string>>();
    return true;
  }
  /// Run config keys with lists of values: each key one of RunConfig's, each list non-empty.
  template <class C>
  bool parse(const Json& v, const std::string& path, KeyLists& out, const C&) {
    if (!v.is_object()) return false;
    KeyLists lists;
    for (const auto& [key, values] : v.items()) {
      const std::string key_path = join_key(path, key);
      if (!is_key_or_section(key)) throw_unknown_run_key(source_of(key_path), path, key);
      if (!values.is_array() || values.empty())
        throw ConfigError(fmt::format("{}: {} = {}: expected a non-empty list of values", source_of(key_path),
                                      shown(key_path), shown_value(values)));
      const nlohmann::json list(values);
      lists.emplace_back(key, std::vector<nlohmann::json>(list.begin(), list.end()));
    }
    out = std::move(lists);
    return true;
  }
  template <class E, class C, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  bool parse(const Json& v, const std::string&, E& out, const C&) {
    std::string spelled;
    if (v.is_string()) spelled = v.template get<std::string>();
    else if (spelled_on_off<E>() && v.is_boolean()) spelled = v.template get<bool>() ? "on" : "off";
    else return false;
    for (const auto& [value, name] : EnumNames<E>::names) {
      if (spelled == name) {
        out = value;
        return true;
      }
    }
    return false;
  }

  const Json& object_;
  std::string path_;
  const BasicDocument<Json>& doc_;
  const std::string& default_source_;
  std::vector<std::string>* problems_;
  std::vector<std::string> known_;
};

/// The RunConfig `doc` holds, read key by key over the defaults (no checks across keys, no
/// defaults that follow data.source: load.cpp's resolve adds those). Each value it cannot take
/// adds a line to `problems` (KeyReader), the key left at its default.
RunConfig read_run_config(const Document& doc, const std::string& default_source, std::vector<std::string>& problems);

}  // namespace ltrain::config
