#pragma once
// Shell completion scripts (`ltrain completion bash|zsh|fish`), generated from the commands' own option
// lists (those their --help prints), the config keys with their values (config::config_keys()) and
// the sweep file's keys (config::sweep_keys()), so that a new option or key is completed without
// touching the scripts.
#include <string>
#include <vector>

namespace ltrain::cli {

/// One option of a command.
struct Flag {
  std::vector<std::string> names;  ///< "--config", "-n"
  std::string description;
  /// The placeholder of its value as --help shows it: "" for a switch; "FILE" or "NAME.json" (a
  /// file), "DIR" (a folder) and "KEY=VALUE" (a config override) are completed, others are not.
  std::string value;
};

struct CommandSpec {
  std::string name;  ///< "train", or "bench step" for a command of two words
  std::string description;
  std::vector<Flag> flags;
  bool overrides = false;              ///< takes bare KEY=VALUE config overrides as arguments
  std::vector<std::string> arguments;  ///< the fixed words it takes as arguments ("bash", "zsh")
  bool sweep_keys = false;             ///< its overrides may name the sweep file's keys too (ltrain sweep)
};

/// A bash script that defines _ltrain and registers it with `complete -F _ltrain ltrain`:
/// commands, each command's options, files and folders after options that take them, config
/// keys (and for a command with `sweep_keys`, the sweep file's keys) after --set and as bare KEY=
/// arguments, and the values of enumerations and switches after KEY=. `version` is named in its
/// first lines.
std::string bash_completion(const std::vector<CommandSpec>& commands, const std::string& version);

/// The same for zsh (#compdef ltrain, with the descriptions of commands, options and keys), loaded
/// from a folder of $fpath as _ltrain or sourced.
std::string zsh_completion(const std::vector<CommandSpec>& commands, const std::string& version);

/// The same for fish (`complete -c ltrain` lines with the descriptions of commands, options and
/// keys), saved as ~/.config/fish/completions/ltrain.fish or sourced.
std::string fish_completion(const std::vector<CommandSpec>& commands, const std::string& version);

}  // namespace ltrain::cli
