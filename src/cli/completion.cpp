#include "ltrain/cli/completion.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/config/load.h"

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

/// Case branches `KEY) echo 'VALUES' ;;` for the keys with a fixed set of values (both shells).
std::string key_value_cases() {
  std::string out;
  for (const config::KeyInfo& key : config::config_keys().keys)
    if (!key.choices.empty()) out += fmt::format("    {}) echo '{}' ;;\n", key.name, fmt::join(key.choices, " "));
  return out;
}

std::vector<std::string> key_names() {
  std::vector<std::string> names;
  for (const config::KeyInfo& key : config::config_keys().keys) names.push_back(key.name);
  return names;
}

}  // namespace

std::string bash_completion(const std::vector<CommandSpec>& commands, const std::string& version) {
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
      R"SCRIPT(# bash completion for ltrain {version}: its commands, their options and the config keys, as made
# by `ltrain completion bash`. Load it with: source <(ltrain completion bash)
# or save it as ~/.local/share/bash-completion/completions/ltrain.

_ltrain_commands={commands}
_ltrain_keys={keys}

# The options of a command ("bench step" for a command of two words).
_ltrain_options() {{
  case "$1" in
{options_cases}  esac
}}

# The values of a config key that has a fixed set of them.
_ltrain_key_values() {{
  case "$1" in
{key_cases}  esac
}}

# A config override in $cur: a key (completed with its "="), or KEY=VALUE (the key's values).
_ltrain_override() {{
  if [[ $cur == *=* ]]; then
    local key=${{cur%%=*}} value=${{cur#*=}}
    local -a values=($(compgen -W "$(_ltrain_key_values "$key")" -- "$value"))
    # Where "=" breaks words (bash's default) the word being replaced is the value alone.
    if [[ $COMP_WORDBREAKS == *=* ]]; then COMPREPLY=("${{values[@]}}"); else COMPREPLY=("${{values[@]/#/$key=}}"); fi
  else
    COMPREPLY=($(compgen -W "$_ltrain_keys" -S = -- "$cur"))
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
      fmt::arg("keys", single_quoted(fmt::format("{}", fmt::join(key_names(), " ")))),
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
  std::string top, options_cases, argument_cases, two_word, key_specs;
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
  for (const config::KeyInfo& key : config::config_keys().keys)
    key_specs += "  " + described(key.name, key.description) + "\n";
  return fmt::format(
      R"SCRIPT(#compdef ltrain
# zsh completion for ltrain {version}: its commands, their options and the config keys, as made by
# `ltrain completion zsh`. Save it as _ltrain in a folder of $fpath, or load it with:
# source <(ltrain completion zsh)

_ltrain_key_specs=(
{key_specs})

# The values of a config key that has a fixed set of them.
_ltrain_key_values() {{
  case "$1" in
{key_cases}  esac
}}

# A config override: a key (completed with its "="), or KEY=VALUE (the key's values).
_ltrain_override() {{
  if compset -P '*='; then
    local -a values; values=(${{=$(_ltrain_key_values "${{IPREFIX%=}}")}})
    compadd -a values
  else
    _describe -t config-keys 'config key' _ltrain_key_specs -S '=' -q
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
      fmt::arg("version", version), fmt::arg("key_specs", key_specs),
      fmt::arg("key_cases", key_value_cases()), fmt::arg("top", top),
      fmt::arg("two_word", two_word), fmt::arg("options_cases", options_cases),
      fmt::arg("file_cases", option_value_cases(commands, ValueKind::file, "_files; return")),
      fmt::arg("folder_cases", option_value_cases(commands, ValueKind::folder, "_files -/; return")),
      fmt::arg("override_cases", option_value_cases(commands, ValueKind::override_, "_ltrain_override; return")),
      fmt::arg("other_cases", option_value_cases(commands, ValueKind::other, "return")),
      fmt::arg("argument_cases", argument_cases));
}

}  // namespace ltrain::cli
