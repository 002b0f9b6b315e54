#pragma once
// Reading, overriding, validating and printing a RunConfig.
// Errors are ConfigError with one line: "<source>: <key.path> = <value>: expected ...",
// where <source> is the file that set the key (or the --set flag). Values quoted in messages
// are cut to kMaxShownChars characters.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/config.h"
#include "ltrain/core/errors.h"

namespace ltrain::config {

// ---- The reader's limits: input past them is a ConfigError, never a crash or a hang ----------

/// The largest config or sweep file read, in bytes.
constexpr std::size_t kMaxConfigFileBytes = std::size_t{4} << 20;
/// The most objects and lists inside one another (a run config needs 2, a sweep file 4).
constexpr int kMaxNesting = 32;
/// The longest string value or key, in bytes (a path of PATH_MAX).
constexpr std::size_t kMaxStringBytes = 4096;
/// The longest value quoted in an error message, in characters; longer ones end in "...".
constexpr std::size_t kMaxShownChars = 80;

/// A resolved config and where each key's value came from.
struct LoadedConfig {
  RunConfig config;
  /// "optim.lr" -> "configs/x.json" or "--set optim.lr=0.05"; keys left at their default are absent.
  /// A key whose default follows data.source (data.root, mean, std, model.num_classes for cifar100)
  /// and was left out is recorded where data.source was set.
  std::map<std::string, std::string> origin;
  /// The top config file (or document) the config was loaded from.
  std::string source;
  /// The config files read: the top file, then each file it extends, depth first in the order
  /// named (paths as the reader opened them); empty for a config built from a JSON document.
  std::vector<std::string> files;
};

/// A ConfigError about `key` ("section.name"): "<file that set it>: <key> = <value>: <message>".
/// For checks that need more than the config, e.g. whether the device exists.
ConfigError config_error(const LoadedConfig& loaded, const std::string& key, const std::string& message);

/// The text of the config (or sweep) file `path`. ConfigError "<path>: <what is wrong>; <hint>"
/// when it is not a regular file (a directory, a FIFO, a device: refused before reading) or is
/// larger than kMaxConfigFileBytes.
std::string read_config_text(const std::filesystem::path& path, const std::string& hint);

/// JSON `text` from `source`, parsed strictly: at most kMaxNesting levels, no key twice in one
/// object, strings of at most kMaxStringBytes bytes without control characters (U+0000 to U+001F,
/// DEL), numbers a double holds. ConfigError "<source>: ..." naming the line and column or the key path otherwise.
nlohmann::json parse_json(const std::string& text, const std::string& source);
/// parse_json, keeping the keys in the text's order.
nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& source);

/// `text` as it is quoted in an error message: at most kMaxShownChars characters (then "..."),
/// control characters and bytes that are not UTF-8 written as \xNN, so it stays one line.
std::string shown(const std::string& text);

/// Reads `path`, following "extends" (relative to the file that names it), applies each
/// "key.path=value" override in order (the value is JSON, or else a plain string), gives the keys
/// left out whose defaults follow data.source the source's values (with cifar100: data.root
/// data/cifar-100-binary, CIFAR-100's data.mean and data.std, model.num_classes 100 or 20) and
/// validates.
LoadedConfig load_file(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

/// Checks a caller adds to loading (what the device can run, say): a ConfigError it throws joins
/// the config's own problems, so that one run names them all.
using MoreChecks = std::function<void(const LoadedConfig&)>;

/// load_file of several files merged in order, each with its "extends": a key a later file sets
/// replaces an earlier file's (objects merge key by key, lists are replaced whole), then the
/// overrides. `paths` holds at least one file; the last names the config in messages about keys
/// left at their defaults. Every value out of its type or limits, every check across keys that
/// fails and `more_checks`' refusals (run on the config with such values at their defaults) come
/// in one ConfigError, a line each.
LoadedConfig load_files(const std::vector<std::filesystem::path>& paths,
                        const std::vector<std::string>& overrides = {}, const MoreChecks& more_checks = {});

/// Builds a config from a JSON document (e.g. one saved in a run directory or a checkpoint).
/// `source` names the document in error messages.
LoadedConfig load_json(const nlohmann::json& document, const std::string& source,
                       const std::vector<std::string>& overrides = {});

/// The data set a config trains on, as result files name it: {"source": "cifar100", "classes": 100,
/// "cifar100_labels": "fine"} (the last for CIFAR-100 only).
nlohmann::json data_summary(const DataSection& data);

/// data.root's default for `source` (data/cifar-10-batches-bin; data/cifar-100-binary for cifar100).
std::string default_data_root(DataSource source);

/// Every key with its value: {"run": {...}, "model": {...}, ...}.
nlohmann::json to_json(const RunConfig& config);

/// Keys whose values differ from `before` to `after` (both as to_json writes them), each as
/// "section.key (old -> new)". A key `before` lacks (a config written before the key existed)
/// counts as its default, which is what that older run used.
std::vector<std::string> changed_settings(const nlohmann::json& before, const nlohmann::json& after);

/// The settings whose values differ from the defaults, as "N settings differ from the defaults:"
/// and an aligned table of key, value and where the value came from (to_json has every key).
std::string format_table(const LoadedConfig& loaded);

/// One key as --help, the JSON Schema and shell completion describe it (from visit()).
struct KeyInfo {
  std::string name;                   ///< "optim.lr"
  std::string description;            ///< one line
  std::string type;                   ///< in words: "number > 0 and <= 1000", "sgd|adamw"
  nlohmann::json default_value;
  std::vector<std::string> choices;   ///< an enumeration's values, "true" and "false" for a switch; else none
  nlohmann::ordered_json schema;      ///< its JSON Schema: type, enum, limits, default, description
};
struct SectionInfo {
  std::string name;
  std::string description;
};
/// The keys of a kind of file (a run config; a sweep file, sweep_spec.h), in visit() order.
struct ConfigKeys {
  std::vector<SectionInfo> sections;
  std::vector<KeyInfo> keys;  ///< "section.key", or "key" for one outside the sections (a sweep's "mode")
};

/// Every section and key of RunConfig, described.
const ConfigKeys& config_keys();

/// Whether `name` is a key ("optim.lr") or a section ("optim") of RunConfig, or a key's earlier name.
bool is_key_or_section(const std::string& name);

/// The one of `known` closest to `key`: within two edits, or one that `key` starts with or that
/// starts with `key` ("optimizer" and "optim"); the first of equals; "" when none is close. For
/// "did you mean" in messages about keys, commands and options.
std::string closest_key(const std::string& key, const std::vector<std::string>& known);

/// The key or section of RunConfig closest to `name` ("optim.lr" for "optim.lrr"), keys first;
/// "" when none is close.
std::string closest_key_or_section(const std::string& name);

/// A key renamed since it was introduced: files, overrides and saved configs may still use the
/// earlier name, which is read as the new one with a one-line note.
struct RenamedKey {
  const char* earlier;  ///< "model.own_batchnorm"
  const char* now;      ///< "model.ltrain_batch_norm"
};

/// Every renamed key.
const std::vector<RenamedKey>& renamed_keys();

/// --help's list of the keys of `keys` (a run config's, or sweep_keys()): each key with its
/// description, (type, default), wrapped under the description.
std::string describe_keys(const ConfigKeys& keys = config_keys());

/// A JSON Schema (draft 2020-12) of a run config file: every section and key with its type,
/// enumeration, limits, default and description, no other keys (additionalProperties false), and
/// "extends".
nlohmann::ordered_json json_schema();

}  // namespace ltrain::config
