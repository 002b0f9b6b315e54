#include "ltrain/cli/completion.h"

#include <algorithm>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"

namespace ltrain::cli {
namespace {

/// What a shell completes after an option (see Flag::value).
enum class ValueKind { none, file, folder, override_, other };

ValueKind value_kind(const std::string& value) {
  if (value.empty()) return ValueKind::none;
  if (value == "DIR") return ValueKind::folder;
  if (value == "KEY=VALUE") return ValueKind::override_;
  if (value == "FILE" || (value.size() > 5 && value.compare(value.size() - 5, 5, ".json") == 0)) return ValueKind::file;
  return ValueKind::other;
}

/// The first words of the commands, in order ("bench" once for "bench step" and "bench matmul").
std::vector<std::string> top_words(const std::vector<CommandSpec>& commands) {
  std::vector<std::string> words;
  for (const CommandSpec& command : commands) {
    const std::string word = command.name.substr(0, command.name.find(' '));
    if (std::find(words.begin(), words.end(), word) == words.end()) words.push_back(word);
  }
  return words;
}

/// `text` inside single quotes for either shell.
std::string single_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// "name:description" for zsh's _describe, inside single quotes (a colon in the name escaped).
std::string described(const std::string& name, const std::string& description) {
  std::string escaped;
  for (char c : name) escaped += c == ':' ? std::string("\\:") : std::string(1, c);
  return single_quoted(escaped + ":" + description);
}

std::vector<std::string> flag_names(const CommandSpec& command) {
  std::vector<std::string> names;
  for (const Flag& flag : command.flags) names.insert(names.end(), flag.names.begin(), flag.names.end());
  return names;
}

/// One case branch `"COMMAND OPTION"|...) ACTION ;;` for the options whose value is of `kind`
/// (both shells; "" when there are none).
std::string option_value_cases(const std::vector<CommandSpec>& commands, ValueKind kind, const std::string& action) {
  std::vector<std::string> patterns;
  for (const CommandSpec& command : commands)
    for (const Flag& flag : command.flags)
      if (value_kind(flag.value) == kind)
        for (const std::string& name : flag.names) patterns.push_back("\"" + command.name + " " + name + "\"");
  if (patterns.empty()) return "";
  return fmt::format("    {}) {} ;;\n", fmt::join(patterns, "|"), action);
}

/// Case branches `KEY) echo 'VALUES' ;;` for the config and sweep keys with a fixed set of values
/// (both shells; no sweep key has a config key's name).
std::string key_value_cases() {
  std::string out;
  for (const config::ConfigKeys* table : {&config::config_keys(), &config::sweep_keys()})
    for (const config::KeyInfo& key : table->keys)
      if (!key.choices.empty()) out += fmt::format("    {}) echo '{}' ;;\n", key.name, fmt::join(key.choices, " "));
  return out;
}

std::vector<std::string> key_names(const config::ConfigKeys& table) {
  std::vector<std::string> names;
  for (const config::KeyInfo& key : table.keys) names.push_back(key.name);
  return names;
}

/// zsh's _describe specs "key:description" of the keys of `table`, one a line.
std::string key_specs(const config::ConfigKeys& table) {
  std::string out;
  for (const config::KeyInfo& key : table.keys) out += "  " + described(key.name, key.description) + "\n";
  return out;
}

/// fish's `case` branches that name a command of two words by its first two ("bench step").
std::string two_word_fish_cases(const std::vector<CommandSpec>& commands) {
  std::string out;
  for (const std::string& word : top_words(commands))
    if (std::any_of(commands.begin(), commands.end(),
                    [&word](const CommandSpec& command) { return command.name.rfind(word + " ", 0) == 0; }))
      out += fmt::format("        case {}\n            if set -q words[3]\n                echo \"{} $words[3]\"\n"
                         "            else\n                echo {}\n            end\n",
                         word, word, word);
  return out;
}

/// The case pattern `"sweep"|...` of the commands whose overrides may name sweep keys ("" for none).
std::string sweep_key_commands(const std::vector<CommandSpec>& commands) {
  std::vector<std::string> names;
  for (const CommandSpec& command : commands)
    if (command.sweep_keys) names.push_back("\"" + command.name + "\"");
  return fmt::format("{}", fmt::join(names, "|"));
}

}  // namespace

std::string bash_completion(const std::vector<CommandSpec>& commands, const std::string& version) {
  const std::string sweep_commands = sweep_key_commands(commands);
  std::string options_cases, argument_cases, two_word;
  for (const CommandSpec& command : commands) {
    options_cases += fmt::format("    \"{}\") echo {} ;;\n", command.name,
                                 single_quoted(fmt::format("{}", fmt::join(flag_names(command), " "))));
    if (command.overrides) argument_cases += fmt::format("    \"{}\") _ltrain_override ;;\n", command.name);
    if (!command.arguments.empty())
      argument_cases += fmt::format("    \"{}\") COMPREPLY=($(compgen -W {} -- \"$cur\")) ;;\n", command.name,
                                    single_quoted(fmt::format("{}", fmt::join(command.arguments, " "))));
  }
  for (const std::string& word : top_words(commands)) {
    std::vector<std::string> second;
    for (const CommandSpec& command : commands)
      if (command.name.rfind(word + " ", 0) == 0) second.push_back(command.name.substr(word.size() + 1));
    if (!second.empty())
      two_word += fmt::format(
          "  if [[ $command == {} ]]; then\n"
          "    if ((${{#words[@]}} <= 2)); then COMPREPLY=($(compgen -W {} -- \"$cur\")); return; fi\n"
          "    command=\"{} ${{words[2]}}\"\n"
          "  fi\n",
          word, single_quoted(fmt::format("{} --help", fmt::join(second, " "))), word);
  }
  return fmt::format(
      R"SCRIPT(# bash completion for ltrain {version}: its commands, their options, the config keys and the
# sweep file's keys, as made by `ltrain completion bash`. Load it with:
# source <(ltrain completion bash), or save it as ~/.local/share/bash-completion/completions/ltrain.

_ltrain_commands={commands}
_ltrain_keys={keys}
_ltrain_sweep_keys={sweep_keys}

# The options of a command ("bench step" for a command of two words).
_ltrain_options() {{
  case "$1" in
{options_cases}  esac
}}

# The values of a config or sweep key that has a fixed set of them.
_ltrain_key_values() {{
  case "$1" in
{key_cases}  esac
}}

# The keys $command's overrides may name: config keys, and for ltrain sweep the sweep file's too.
_ltrain_override_keys() {{
  case "$command" in
{sweep_key_case}    *) echo "$_ltrain_keys" ;;
  esac
}}

# An override in $cur: a key (completed with its "="), or KEY=VALUE (the key's values).
_ltrain_override() {{
  if [[ $cur == *=* ]]; then
    local key=${{cur%%=*}} value=${{cur#*=}}
    local -a values=($(compgen -W "$(_ltrain_key_values "$key")" -- "$value"))
    # Where "=" breaks words (bash's default) the word being replaced is the value alone.
    if [[ $COMP_WORDBREAKS == *=* ]]; then COMPREPLY=("${{values[@]}}"); else COMPREPLY=("${{values[@]/#/$key=}}"); fi
  else
    COMPREPLY=($(compgen -W "$(_ltrain_override_keys)" -S = -- "$cur"))
    compopt -o nospace 2>/dev/null
  fi
}}

_ltrain() {{
  # The words before the cursor, read from the line itself: bash splits COMP_WORDS at "=" too.
  local line=${{COMP_LINE:0:COMP_POINT}}
  local cur=${{line##*[[:space:]]}}
  local -a words
  read -ra words <<< "${{line:0:${{#line}}-${{#cur}}}}"
  COMPREPLY=()
  # ltrain launch -n N -- COMMAND ...: COMMAND is completed as ltrain's own.
  local i
  if [[ ${{words[1]-}} == launch ]]; then
    for ((i = 2; i < ${{#words[@]}}; i++)); do
      if [[ ${{words[i]}} == -- ]]; then words=(ltrain "${{words[@]:i+1}}"); break; fi
    done
  fi
  if ((${{#words[@]}} <= 1)); then
    COMPREPLY=($(compgen -W "$_ltrain_commands --help --version" -- "$cur"))
    return
  fi
  local command=${{words[1]}}
{two_word}  local prev=${{words[${{#words[@]}}-1]}}
  case "$command $prev" in
{file_cases}{folder_cases}{override_cases}{other_cases}  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_ltrain_options "$command")" -- "$cur"))
    return
  fi
  case "$command" in
{argument_cases}  esac
}}

complete -F _ltrain ltrain
)SCRIPT",
      fmt::arg("version", version),
      fmt::arg("commands", single_quoted(fmt::format("{}", fmt::join(top_words(commands), " ")))),
      fmt::arg("keys", single_quoted(fmt::format("{}", fmt::join(key_names(config::config_keys()), " ")))),
      fmt::arg("sweep_keys", single_quoted(fmt::format("{}", fmt::join(key_names(config::sweep_keys()), " ")))),
      fmt::arg("sweep_key_case", sweep_commands.empty() ? ""
                                                        : fmt::format("    {}) echo \"$_ltrain_keys $_ltrain_sweep_keys\" ;;\n",
                                                                      sweep_commands)),
      fmt::arg("options_cases", options_cases), fmt::arg("key_cases", key_value_cases()),
      fmt::arg("two_word", two_word),
      fmt::arg("file_cases", option_value_cases(commands, ValueKind::file,
                                                "COMPREPLY=($(compgen -f -- \"$cur\")); compopt -o filenames "
                                                "2>/dev/null; return")),
      fmt::arg("folder_cases", option_value_cases(commands, ValueKind::folder,
                                                  "COMPREPLY=($(compgen -d -- \"$cur\")); compopt -o filenames "
                                                  "2>/dev/null; return")),
      fmt::arg("override_cases", option_value_cases(commands, ValueKind::override_, "_ltrain_override; return")),
      fmt::arg("other_cases", option_value_cases(commands, ValueKind::other, "return")),
      fmt::arg("argument_cases", argument_cases));
}

std::string zsh_completion(const std::vector<CommandSpec>& commands, const std::string& version) {
  const std::string sweep_commands = sweep_key_commands(commands);
  std::string top, options_cases, argument_cases, two_word;
  for (const std::string& word : top_words(commands)) {
    std::vector<std::string> descriptions, second;
    for (const CommandSpec& command : commands) {
      if (command.name == word) descriptions.push_back(command.description);
      if (command.name.rfind(word + " ", 0) == 0) {
        descriptions.push_back(command.name.substr(word.size() + 1) + ": " + command.description);
        second.push_back(described(command.name.substr(word.size() + 1), command.description));
      }
    }
    top += "    " + described(word, fmt::format("{}", fmt::join(descriptions, "; "))) + "\n";
    if (!second.empty())
      two_word += fmt::format(
          "  if [[ $command == {} ]]; then\n"
          "    if (( ${{#before}} <= 2 )); then\n"
          "      local -a subcommands; subcommands=({})\n"
          "      _describe -t commands 'ltrain {}' subcommands\n"
          "      return\n"
          "    fi\n"
          "    command=\"{} ${{before[3]}}\"\n"
          "  fi\n",
          word, fmt::join(second, " "), word, word);
  }
  for (const CommandSpec& command : commands) {
    std::vector<std::string> flags;
    for (const Flag& flag : command.flags)
      for (const std::string& name : flag.names) flags.push_back(described(name, flag.description));
    options_cases += fmt::format("      \"{}\") flags=({}) ;;\n", command.name, fmt::join(flags, " "));
    if (command.overrides) argument_cases += fmt::format("    \"{}\") _ltrain_override ;;\n", command.name);
    if (!command.arguments.empty())
      argument_cases += fmt::format("    \"{}\") compadd -- {} ;;\n", command.name, fmt::join(command.arguments, " "));
  }
  return fmt::format(
      R"SCRIPT(#compdef ltrain
# zsh completion for ltrain {version}: its commands, their options, the config keys and the sweep
# file's keys, as made by `ltrain completion zsh`. Save it as _ltrain in a folder of $fpath, or load
# it with: source <(ltrain completion zsh)

_ltrain_key_specs=(
{key_specs})
_ltrain_sweep_key_specs=(
{sweep_key_specs})

# The values of a config or sweep key that has a fixed set of them.
_ltrain_key_values() {{
  case "$1" in
{key_cases}  esac
}}

# An override: a key (completed with its "="), or KEY=VALUE (the key's values). The keys are
# config keys, and for ltrain sweep the sweep file's too.
_ltrain_override() {{
  if compset -P '*='; then
    local -a values; values=(${{=$(_ltrain_key_values "${{IPREFIX%=}}")}})
    compadd -a values
  else
    _describe -t config-keys 'config key' _ltrain_key_specs -S '=' -q
    case "$command" in
{sweep_key_case}    esac
  fi
}}

_ltrain() {{
  local -a before; before=("${{(@)words[1,CURRENT-1]}}")
  local cur=${{words[CURRENT]}}
  # ltrain launch -n N -- COMMAND ...: COMMAND is completed as ltrain's own.
  local i
  if [[ ${{before[2]}} == launch ]]; then
    for (( i = 3; i <= ${{#before}}; i++ )); do
      if [[ ${{before[i]}} == -- ]]; then before=(ltrain "${{(@)before[i+1,-1]}}"); break; fi
    done
  fi
  if (( ${{#before}} <= 1 )); then
    local -a commands; commands=(
{top}    )
    _describe -t commands 'ltrain command' commands
    compadd -- --help --version
    return
  fi
  local command=${{before[2]}}
{two_word}  local prev=${{before[-1]}}
  case "$command $prev" in
{file_cases}{folder_cases}{override_cases}{other_cases}  esac
  if [[ $cur == -* ]]; then
    local -a flags
    case "$command" in
{options_cases}    esac
    _describe -t options 'option' flags
    return
  fi
  case "$command" in
{argument_cases}  esac
}}

if [[ ${{zsh_eval_context[-1]}} == loadautofunc ]]; then
  _ltrain "$@"
else
  compdef _ltrain ltrain
fi
)SCRIPT",
      fmt::arg("version", version), fmt::arg("key_specs", key_specs(config::config_keys())),
      fmt::arg("sweep_key_specs", key_specs(config::sweep_keys())),
      fmt::arg("sweep_key_case",
               sweep_commands.empty()
                   ? ""
                   : fmt::format("      {}) _describe -t sweep-keys 'sweep key' _ltrain_sweep_key_specs -S '=' -q ;;\n",
                                 sweep_commands)),
      fmt::arg("key_cases", key_value_cases()), fmt::arg("top", top),
      fmt::arg("two_word", two_word), fmt::arg("options_cases", options_cases),
      fmt::arg("file_cases", option_value_cases(commands, ValueKind::file, "_files; return")),
      fmt::arg("folder_cases", option_value_cases(commands, ValueKind::folder, "_files -/; return")),
      fmt::arg("override_cases", option_value_cases(commands, ValueKind::override_, "_ltrain_override; return")),
      fmt::arg("other_cases", option_value_cases(commands, ValueKind::other, "return")),
      fmt::arg("argument_cases", argument_cases));
}

namespace {

/// `text` inside fish's single quotes, where a backslash escapes a quote and a backslash.
std::string fish_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

}  // namespace

std::string fish_completion(const std::vector<CommandSpec>& commands, const std::string& version) {
  std::string lines;
  for (const std::string& word : top_words(commands)) {
    std::vector<std::string> descriptions;
    for (const CommandSpec& command : commands) {
      if (command.name == word) descriptions.push_back(command.description);
      if (command.name.rfind(word + " ", 0) == 0) {
        descriptions.push_back(command.name.substr(word.size() + 1) + ": " + command.description);
        lines += fmt::format("complete -c ltrain -f -n '__ltrain_command_is {}' -a {} -d {}\n", word,
                             fish_quoted(command.name.substr(word.size() + 1)), fish_quoted(command.description));
      }
    }
    lines += fmt::format("complete -c ltrain -f -n __ltrain_needs_command -a {} -d {}\n", fish_quoted(word),
                         fish_quoted(fmt::format("{}", fmt::join(descriptions, "; "))));
  }
  for (const CommandSpec& command : commands) {
    const std::string condition = fish_quoted("__ltrain_command_is " + command.name);
    for (const Flag& flag : command.flags) {
      std::string names;
      for (const std::string& name : flag.names)
        names += name.rfind("--", 0) == 0 ? " -l " + name.substr(2) : " -s " + name.substr(1);
      std::string value;
      switch (value_kind(flag.value)) {
        case ValueKind::none: value = " -f"; break;
        case ValueKind::file: value = " -r -F"; break;
        case ValueKind::folder: value = " -x -a '(__fish_complete_directories)'"; break;
        case ValueKind::override_: value = " -x -a '(__ltrain_overrides)'"; break;
        case ValueKind::other: value = " -x"; break;
      }
      lines += fmt::format("complete -c ltrain -n {}{}{} -d {}\n", condition, names, value,
                           fish_quoted(flag.description));
    }
    if (command.overrides) lines += fmt::format("complete -c ltrain -f -n {} -a '(__ltrain_overrides)'\n", condition);
    if (!command.arguments.empty())
      lines += fmt::format("complete -c ltrain -f -n {} -a {}\n", condition,
                           fish_quoted(fmt::format("{}", fmt::join(command.arguments, " "))));
  }
  std::string key_cases;
  for (const config::ConfigKeys* table : {&config::config_keys(), &config::sweep_keys()})
    for (const config::KeyInfo& key : table->keys)
      if (!key.choices.empty())
        key_cases += fmt::format("        case {}\n            printf '%s\\n' {}\n", fish_quoted(key.name),
                                 fmt::join(key.choices, " "));
  std::vector<std::string> sweep_commands;
  for (const CommandSpec& command : commands)
    if (command.sweep_keys) sweep_commands.push_back(fish_quoted(command.name));
  return fmt::format(
      R"SCRIPT(# fish completion for ltrain {version}: its commands, their options, the config keys and the
# sweep file's keys, as made by `ltrain completion fish`. Load it with:
# ltrain completion fish | source, or save it as ~/.config/fish/completions/ltrain.fish.

set -g __ltrain_keys {keys}
set -g __ltrain_sweep_keys {sweep_keys}

# The command on the line ("train", "bench step"; "bench" before its second word), "" before one.
# After ltrain launch ... --, the command the processes run.
function __ltrain_command
    set -l words (commandline -opc)
    set -l dashes (contains -i -- -- $words)
    if test "$words[2]" = launch; and test -n "$dashes"
        set words ltrain $words[(math $dashes + 1)..-1]
    end
    test (count $words) -ge 2; or return
    switch "$words[2]"
{two_word}        case '*'
            echo $words[2]
    end
end

function __ltrain_needs_command
    set -l command (__ltrain_command)
    test -z "$command"
end

function __ltrain_command_is
    set -l command (__ltrain_command)
    test "$command" = "$argv"
end

# The values of a config or sweep key that has a fixed set of them.
function __ltrain_key_values
    switch $argv[1]
{key_cases}    end
end

# An override in the current word: a key with its "=", or KEY=VALUE (the key's values). The keys
# are config keys, and for ltrain sweep the sweep file's too.
function __ltrain_overrides
    set -l token (commandline -ct)
    if string match -q -- '*=*' $token
        set -l key (string split -m 1 = -- $token)[1]
        for value in (__ltrain_key_values $key)
            echo "$key=$value"
        end
        return
    end
    set -l keys $__ltrain_keys
    set -l command (__ltrain_command)
    switch "$command"
{sweep_case}    end
    printf '%s=\n' $keys
end

complete -c ltrain -f
complete -c ltrain -f -n __ltrain_needs_command -l help -d 'list the commands'
complete -c ltrain -f -n __ltrain_needs_command -l version -d 'the version and the LibTorch it was built against'
{lines})SCRIPT",
      fmt::arg("version", version),
      fmt::arg("keys", fmt::join(key_names(config::config_keys()), " ")),
      fmt::arg("sweep_keys", fmt::join(key_names(config::sweep_keys()), " ")),
      fmt::arg("two_word", two_word_fish_cases(commands)), fmt::arg("key_cases", key_cases),
      fmt::arg("sweep_case",
               sweep_commands.empty()
                   ? ""
                   : fmt::format("        case {}\n            set keys $keys $__ltrain_sweep_keys\n",
                                 fmt::join(sweep_commands, " "))),
      fmt::arg("lines", lines));
}

cxxopts::Options completion_options() {
  cxxopts::Options options = command_options(
      "ltrain completion",
      "Print a shell completion script for ltrain's commands, options and config keys (bash, zsh or fish). bash: "
      "source <(ltrain completion bash), or save it as ~/.local/share/bash-completion/completions/ltrain; zsh: save "
      "it as _ltrain in a folder of $fpath, or source <(ltrain completion zsh); fish: ltrain completion fish | "
      "source, or save it as ~/.config/fish/completions/ltrain.fish.");
  options.add_options(kHiddenGroup)("shell", "", cxxopts::value<std::string>());
  options.parse_positional({"shell"});
  options.positional_help("bash|zsh|fish");
  return options;
}

namespace {

/// The commands with their options as shell completion sees them.
std::vector<CommandSpec> completion_specs() {
  std::vector<CommandSpec> specs;
  for (const Command& command : commands()) {
    CommandSpec spec{command.name, command.summary, {}, false, command.arguments};
    const cxxopts::Options options = command.options();
    for (const std::string& group : options.groups()) {
      for (const cxxopts::HelpOptionDetails& option : options.group_help(group).options) {
        if (group == kHiddenGroup) {
          spec.sweep_keys = spec.sweep_keys || option.l.front() == kBareSweepOverrides;
          spec.overrides = spec.overrides || option.l.front() == kBareOverrides || spec.sweep_keys;
          continue;
        }
        Flag flag{{}, option.desc, option.is_boolean ? "" : option.arg_help};
        if (!option.s.empty()) flag.names.push_back("-" + option.s);
        for (const std::string& name : option.l) flag.names.push_back("--" + name);
        spec.flags.push_back(flag);
      }
    }
    specs.push_back(spec);
  }
  return specs;
}

}  // namespace

int run_completion(int argc, char** argv) {
  cxxopts::Options options = completion_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string shell = args->count("shell") ? (*args)["shell"].as<std::string>() : "";
  if (shell == "bash") std::cout << bash_completion(completion_specs(), LTRAIN_VERSION);
  else if (shell == "zsh") std::cout << zsh_completion(completion_specs(), LTRAIN_VERSION);
  else if (shell == "fish") std::cout << fish_completion(completion_specs(), LTRAIN_VERSION);
  else if (shell.empty())
    throw ConfigError("ltrain completion needs the shell: ltrain completion bash, zsh or fish");
  else
    throw ConfigError(
        fmt::format("ltrain completion {}: no script for this shell; use bash, zsh or fish", config::shown(shell)));
  return 0;
}

}  // namespace ltrain::cli
