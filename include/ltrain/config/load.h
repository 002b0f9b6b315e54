#pragma once
// Reading, overriding, validating and printing a RunConfig.
// Errors are ConfigError with one line: "<source>: <key.path> = <value>: expected ...",
// where <source> is the file that set the key (or the --set flag).
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/config.h"
#include "ltrain/core/errors.h"

namespace ltrain::config {

/// A resolved config and where each key's value came from.
struct LoadedConfig {
  RunConfig config;
  /// "optim.lr" -> "configs/x.json" or "--set optim.lr=0.05"; keys left at their default are absent.
  std::map<std::string, std::string> origin;
  /// The top config file (or document) the config was loaded from.
  std::string source;
};

/// A ConfigError about `key` ("section.name"): "<file that set it>: <key> = <value>: <message>".
/// For checks that need more than the config, e.g. whether the device exists.
ConfigError config_error(const LoadedConfig& loaded, const std::string& key, const std::string& message);

/// Reads `path`, following "extends" (relative to the file that names it), applies each
/// "key.path=value" override in order (the value is JSON, or else a plain string) and validates.
LoadedConfig load_file(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

/// Builds a config from a JSON document (e.g. one saved in a run directory or a checkpoint).
/// `source` names the document in error messages.
LoadedConfig load_json(const nlohmann::json& document, const std::string& source,
                       const std::vector<std::string>& overrides = {});

/// Every key with its value: {"run": {...}, "model": {...}, ...}.
nlohmann::json to_json(const RunConfig& config);

/// Keys whose values differ from `before` to `after` (both as to_json writes them), each as
/// "section.key (old -> new)". A key `before` lacks (a config written before the key existed)
/// counts as its default, which is what that older run used.
std::vector<std::string> changed_settings(const nlohmann::json& before, const nlohmann::json& after);

/// The resolved config as an aligned table: key, value, and where the value came from.
std::string format_table(const LoadedConfig& loaded);

/// One line per key for --help: "  optim.lr  number > 0  (default 0.1)".
std::string describe_keys();

}  // namespace ltrain::config
