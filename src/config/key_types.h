#pragma once
// What a field's type and limits mean in words and in JSON Schema: the messages' "expected an
// integer >= 1", --help's "integer >= 1", the schema's {"type": "integer", "minimum": 1}, and
// whether a value is within the limits. The reader and the keys table both take them from here.
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/config.h"
#include "ltrain/config/sweep_spec.h"

namespace ltrain::config {

/// A limit in words: ">= 1", "> 0 and <= 1000", "between 0 and 1"; "" for none.
inline std::string describe_range(const NoLimit&) { return ""; }
inline std::string describe_range(const Range& r) {
  if (r.hi >= 1e299) return fmt::format("{} {}", r.lo_exclusive ? ">" : ">=", r.lo);
  if (r.lo_exclusive) return fmt::format("> {} and <= {}", r.lo, r.hi);
  return fmt::format("between {} and {}", r.lo, r.hi);
}
inline bool in_range(double, const NoLimit&) { return true; }
inline bool in_range(double value, const Range& r) {
  return (r.lo_exclusive ? value > r.lo : value >= r.lo) && value <= r.hi;
}
template <class C>
std::string with_range(const std::string& noun, const C& constraint) {
  const std::string range = describe_range(constraint);
  return range.empty() ? noun : noun + " " + range;
}

/// Whether enum E has the names "on" and "off": a setting spelled so also takes true and false,
/// as written while it was a boolean.
template <class E>
constexpr bool spelled_on_off() {
  bool on = false, off = false;
  for (const auto& [value, name] : EnumNames<E>::names) {
    on = on || std::string_view(name) == "on";
    off = off || std::string_view(name) == "off";
  }
  return on && off;
}

template <class E>
std::string enum_choices(const char* separator) {
  std::vector<std::string> names;
  for (const auto& [value, name] : EnumNames<E>::names) names.push_back(name);
  return fmt::format("{}", fmt::join(names, separator));
}

/// What the user must give for a field of type T, e.g. "an integer >= 1", "one of sgd, adamw".
template <class T, class C>
std::string expectation(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("an integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("a number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("a list of numbers", c);
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "a list of strings";
  else if constexpr (std::is_same_v<T, KeyLists>)
    return "an object of run config keys (section.key, or a section), each with a non-empty list of values";
  else return "one of " + enum_choices<T>(", ");
}

/// The short type column of --help, e.g. "integer >= 1", "sgd|adamw".
template <class T, class C>
std::string type_text(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true|false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("list of numbers", c);
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "list of strings";
  else if constexpr (std::is_same_v<T, KeyLists>) return "object of key: [values]";
  else return enum_choices<T>("|");
}

/// A field's value as JSON: an enumeration by its spelled name, key lists as an object.
template <class T>
nlohmann::json value_to_json(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return to_string(value);
  } else if constexpr (std::is_same_v<T, KeyLists>) {
    nlohmann::json lists = nlohmann::json::object();
    for (const auto& [key, values] : value) lists[key] = values;
    return lists;
  } else {
    return value;
  }
}

inline void add_limits(nlohmann::ordered_json&, const NoLimit&) {}
inline void add_limits(nlohmann::ordered_json& schema, const Range& r) {
  schema[r.lo_exclusive ? "exclusiveMinimum" : "minimum"] = r.lo;
  if (r.hi < 1e299) schema["maximum"] = r.hi;
}

/// The schema of a number's value: JSON Schema's integer for int64_t (limits as integers there).
template <class C>
nlohmann::ordered_json number_schema(const char* type, const C& constraint) {
  nlohmann::ordered_json schema{{"type", type}};
  add_limits(schema, constraint);
  if (std::string(type) == "integer")
    for (const char* limit : {"minimum", "exclusiveMinimum", "maximum"})
      if (schema.contains(limit)) schema[limit] = static_cast<int64_t>(schema[limit].get<double>());
  return schema;
}

/// The JSON Schema of key lists: an object whose keys are every run config key and section, each
/// with a list of values of that key (key_table.cpp).
nlohmann::ordered_json key_lists_schema();

/// The JSON Schema (draft 2020-12) of a field of type T: type, enumeration, limits.
template <class T, class C>
nlohmann::ordered_json key_schema(const C& constraint) {
  if constexpr (std::is_same_v<T, bool>) return {{"type", "boolean"}};
  else if constexpr (std::is_same_v<T, int64_t>) return number_schema("integer", constraint);
  else if constexpr (std::is_same_v<T, double>) return number_schema("number", constraint);
  else if constexpr (std::is_same_v<T, std::string>) return {{"type", "string"}};
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return {{"type", "array"}, {"items", number_schema("number", constraint)}};
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return {{"type", "array"}, {"items", {{"type", "string"}}}};
  else if constexpr (std::is_same_v<T, KeyLists>)
    return key_lists_schema();
  else {
    nlohmann::ordered_json names = nlohmann::ordered_json::array();
    for (const auto& [value, name] : EnumNames<T>::names) names.push_back(name);
    nlohmann::ordered_json spelled = {{"type", "string"}, {"enum", names}};
    if constexpr (spelled_on_off<T>())
      return {{"anyOf", nlohmann::ordered_json::array({spelled, {{"type", "boolean"}}})}};
    return spelled;
  }
}

}  // namespace ltrain::config
