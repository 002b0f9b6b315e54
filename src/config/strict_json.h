#pragma once
// Strict JSON reading, shared by run configs, their overrides and sweep files: nlohmann's SAX
// parser builds the document under the reader's limits (load.h): nesting depth, a key set twice
// in one object, string length, control characters, UTF-8, numbers a double holds. Its errors name
// the line and column, or the key path of the value. Also how values are quoted in messages.
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"

namespace ltrain::config {

/// "prefix.key", or "key" where the prefix is empty (the top level).
std::string join_key(const std::string& prefix, const std::string& key);

/// `path` as a message shows it (shown()); a relative one followed by where it leads from the
/// working directory: "configs/x.json (/home/me/ltrain/configs/x.json)".
std::string shown_path(const std::filesystem::path& path);

/// Whether `text` is valid UTF-8 (no overlong forms, UTF-16 surrogates or code points past U+10FFFF).
bool is_utf8(const std::string& text);

/// What is wrong with a string of a config (a value or a key), as the end of a message; "" when
/// nothing is.
std::string string_problem(const std::string& text);

/// A JSON value as error messages quote it (see shown()).
template <class Json>
std::string shown_value(const Json& value) {
  return shown(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

/// The strict parse of `text` from `source`, the values' key paths starting at `prefix`; nullopt
/// when `text` is not JSON at all, with nlohmann's description in `syntax_error`. ConfigError
/// when it is JSON that breaks a limit. For nlohmann::json and nlohmann::ordered_json.
template <class Json>
std::optional<Json> parse_strictly(const std::string& text, const std::string& source, const std::string& prefix,
                                   std::string& syntax_error);

/// parse_strictly, with text that is not JSON a ConfigError "<source>: not valid JSON: ...".
template <class Json>
Json parse_or_throw(const std::string& text, const std::string& source);

/// Whether `value` holds objects and lists more than `levels` deep (looks no deeper than that).
bool nested_deeper_than(const nlohmann::json& value, int levels);

}  // namespace ltrain::config
