#include "ltrain/cli/dispatch.h"

#include <algorithm>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "ltrain/config/load.h"
#include "ltrain/core/build_info.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/device/gpu_profile.h"

namespace ltrain::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> list{
      {"train", "train a model", "ltrain train --config configs/quickstart.json optim.lr=0.1", train_options,
       run_train, {}},
      {"lr-find", "learning-rate range test", "ltrain lr-find --config configs/quickstart.json", lr_find_options,
       run_lr_find, {}},
      {"eval", "evaluate a checkpoint", "ltrain eval --checkpoint RUN/checkpoints/step-00000390.ltc", eval_options,
       run_eval, {}},
      {"export", "weights to safetensors", "ltrain export --checkpoint CKPT --out resnet.safetensors", export_options,
       run_export, {}},
      {"bench step", "training-step throughput", "ltrain bench step --config CONFIG", bench_step_options,
       run_bench_step, {}},
      {"bench matmul", "matmul TFLOP/s per precision", "ltrain bench matmul [--device cuda]", bench_matmul_options,
       run_bench_matmul, {}},
      {"doctor", "versions, GPUs, warnings", "ltrain doctor [--json] [--device cuda]", doctor_options, run_doctor,
       {}},
      {"sweep", "a grid of configs, or a batch-size search",
       "ltrain sweep --config configs/sweeps/precision-batch.json", sweep_options, run_sweep, {}},
      {"reproduce", "the guides' claims measured here", "ltrain reproduce --config configs/bench/resnet50-step.json",
       reproduce_options, run_reproduce, {}},
      {"launch", "N data-parallel processes", "ltrain launch -n 2 -- train --config configs/quickstart.json",
       launch_options, run_launch, {}},
      {"config", "the config format as JSON Schema", "ltrain config --schema > ltrain.schema.json", config_options,
       run_config, {}},
      {"completion", "shell completion (bash, zsh, fish)", "source <(ltrain completion bash)", completion_options,
       run_completion, {"bash", "zsh", "fish"}},
  };
  return list;
}

namespace {

constexpr const char* kUsageFooter = R"(
"ltrain COMMAND --help" lists a command's options with their defaults.
"ltrain --version" prints the version and the LibTorch it was built against.
Several processes: ltrain launch, or torchrun --nproc-per-node 2 --no-python build/ltrain train ...
(several machines: ltrain launch --help)
exit codes: 0 success, 1 internal error, 2 usage or config error, 3 data error,
            4 run failed (non-finite loss, out of memory, a file or standard output
            that refuses a write), 5 another data-parallel process
            failed or hung (ltrain launch: a process failed), 6 an output file exists
            (ltrain export without --force), 7 a sweep's point failed, 127 ltrain-core
            missing beside ltrain, 130 interrupted
)";

/// A command's line in ltrain --help.
std::string usage_line(const Command& command) {
  return fmt::format("  {:<13} {:<44} {}\n", command.name, std::string(command.summary) + ":", command.example);
}

/// ltrain --help: the commands, each with what it does and an example, from commands().
std::string usage() {
  std::string out =
      "usage: ltrain COMMAND [OPTIONS]\n\nTrains torchvision-style ResNets on CIFAR-10 and CIFAR-100 from JSON run "
      "configs.\n\ncommands:\n";
  for (const Command& command : commands()) out += usage_line(command);
  return out + kUsageFooter;
}

std::string version() {
  return fmt::format("ltrain {} (commit {}, LibTorch {}{})\n", LTRAIN_VERSION, source_commit(),
                     compat::torch_version(), compat::built_with_cuda() ? ", CUDA" : ", CPU only");
}

/// The command `word` (and `second`, for one of two words) names; nullptr if none.
const Command* find_command(const std::string& word, const std::string& second) {
  for (const Command& command : commands())
    if (command.name == word || command.name == word + " " + second) return &command;
  return nullptr;
}

/// `word` alone, or with a `second` that names none of its commands ("ltrain bench", "ltrain bench
/// fly"): the list of its commands for --help, else a ConfigError that says which they are. A word
/// that begins no command is an unknown command.
int explain_first_word(const std::string& word, const std::string& second) {
  std::string group_usage;
  std::vector<std::string> second_words;
  for (const Command& command : commands())
    if (std::string(command.name).rfind(word + " ", 0) == 0) {
      second_words.push_back(std::string(command.name).substr(word.size() + 1));
      group_usage += usage_line(command);
    }
  if (second_words.empty()) {
    std::vector<std::string> first_words;
    for (const Command& command : commands()) {
      const std::string name = command.name;
      first_words.push_back(name.substr(0, name.find(' ')));
    }
    if (const std::string closest = config::closest_key(word, first_words); !closest.empty())
      throw ConfigError(fmt::format("unknown command \"{}\": did you mean \"{}\"? (ltrain --help lists the commands)",
                                    config::shown(word), closest));
    throw ConfigError(fmt::format("unknown command \"{}\"; run ltrain --help for the list", config::shown(word)));
  }
  if (second == "--help" || second == "-h") {
    std::cout << group_usage;
    return 0;
  }
  if (second.empty())
    throw ConfigError(fmt::format("ltrain {} needs one of: {}; see ltrain {} --help", word,
                                  fmt::join(second_words, ", "), word));
  throw ConfigError(fmt::format("unknown command \"ltrain {} {}\"; use one of: {} (see ltrain {} --help)", word,
                                config::shown(second), fmt::join(second_words, ", "), word));
}

/// The names of `command`'s options without their dashes: the long ones, or the short ones.
std::vector<std::string> option_names(const Command& command, bool long_names) {
  std::vector<std::string> names;
  const cxxopts::Options options = command.options();
  for (const std::string& group : options.groups())
    for (const cxxopts::HelpOptionDetails& option : options.group_help(group).options) {
      if (long_names) names.insert(names.end(), option.l.begin(), option.l.end());
      else if (!option.s.empty()) names.push_back(option.s);
    }
  return names;
}

/// The config key an option's name stands for: "lr" and "optim.lr" for optim.lr, "batch-size" for
/// data.batch_size; "" when it names no key, or the last part of several (name: run.name, ...).
std::string key_of_option(const std::string& name) {
  std::string underscored = name;
  std::replace(underscored.begin(), underscored.end(), '-', '_');
  std::string found;
  for (const config::KeyInfo& key : config::config_keys().keys) {
    if (key.name == underscored) return key.name;
    if (key.name.substr(key.name.find('.') + 1) != underscored) continue;
    if (!found.empty()) return "";
    found = key.name;
  }
  return found;
}

/// The ConfigError for an option `command` does not have: the first such in argv (up to "--", after
/// which the arguments are not options), with the --set override it likely meant, or the option of
/// the nearest name.
ConfigError unknown_option(const Command& command, int argc, char** argv) {
  const std::string program = std::string("ltrain ") + command.name;
  const std::vector<std::string> long_names = option_names(command, true);
  const std::vector<std::string> short_names = option_names(command, false);
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--") break;
    if (argument.size() < 2 || argument[0] != '-') continue;
    const bool long_form = argument[1] == '-';
    const size_t equals = argument.find('=');
    const std::string name = long_form ? argument.substr(2, equals == std::string::npos ? std::string::npos : equals - 2)
                                       : argument.substr(1, 1);
    const std::vector<std::string>& known = long_form ? long_names : short_names;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::string option = (long_form ? "--" : "-") + name;
    std::string hint;
    if (option == "-m" || option == "--multirun") {
      // Hydra's multirun, `-m optim.lr=0.1,0.2`: a sweep here.
      hint = "; several runs over lists of values are a sweep: ltrain sweep --base CONFIG --grid optim.lr=0.1,0.2 "
             "(see ltrain sweep --help)";
    } else if (const std::string key = key_of_option(name); long_form && !key.empty()) {
      const bool next_is_value = i + 1 < argc && argv[i + 1][0] != '-';
      const std::string value =
          equals != std::string::npos ? argument.substr(equals + 1) : next_is_value ? argv[i + 1] : "VALUE";
      hint = fmt::format(": did you mean --set {}={}? (see {} --help)", key, config::shown(value), program);
    } else if (const std::string closest = config::closest_key(name, known); long_form && !closest.empty()) {
      hint = fmt::format(": did you mean --{}? (see {} --help)", closest, program);
    } else {
      hint = fmt::format("; see {} --help", program);
    }
    return ConfigError(fmt::format("{}: unknown option \"{}\"{}", program, config::shown(option), hint));
  }
  return ConfigError(fmt::format("{}: unknown option; see {} --help", program, program));
}

/// The option given the value cxxopts could not read, found in the arguments (cxxopts' message names
/// the value alone): "--steps \"1e99\": not a value of the option's kind ...". Where no option holds
/// that value, cxxopts' own message.
ConfigError unreadable_value(const Command& command, int argc, char** argv, const std::string& cxxopts_message) {
  const std::string program = std::string("ltrain ") + command.name;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--") break;
    if (argument.size() < 2 || argument[0] != '-') continue;
    const size_t equals = argument.find('=');
    const bool value_attached = equals != std::string::npos;
    if (!value_attached && i + 1 >= argc) continue;
    const std::string option = value_attached ? argument.substr(0, equals) : argument;
    const std::string value = value_attached ? argument.substr(equals + 1) : argv[i + 1];
    // cxxopts quotes the value with ‘’, or with '' where built without Unicode.
    const bool named = cxxopts_message.find("\u2018" + value + "\u2019") != std::string::npos ||
                       cxxopts_message.find("'" + value + "'") != std::string::npos;
    if (!named) continue;
    return ConfigError(fmt::format("{}: {} \"{}\": not a value of the option's kind (a number in its range, or true or "
                                   "false for a switch); see {} --help",
                                   program, option, config::shown(value), program));
  }
  return ConfigError(fmt::format("{}: {}; see {} --help", program, cxxopts_message, program));
}

/// Runs `command` on its arguments, argv[0] its name; a parse error of cxxopts becomes a ConfigError
/// that names the command's help.
int run(const Command& command, int argc, char** argv) {
  try {
    return command.run(argc, argv);
  } catch (const cxxopts::exceptions::no_such_option&) {
    throw unknown_option(command, argc, argv);
  } catch (const cxxopts::exceptions::incorrect_argument_type& error) {
    throw unreadable_value(command, argc, argv, error.what());
  } catch (const cxxopts::exceptions::exception& error) {
    throw ConfigError(fmt::format("ltrain {}: {}; see ltrain {} --help", command.name, error.what(), command.name));
  }
}

}  // namespace

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << usage();
    return static_cast<int>(ExitCode::usage);
  }
  const std::string word = argv[1];
  if (word == "--help" || word == "-h" || word == "help") {
    std::cout << usage();
    return 0;
  }
  if (word == "--version") {
    std::cout << version();
    return 0;
  }
  // The doctor reports a bad LTRAIN_GPU_PROFILE among its warnings; the launcher's children check it;
  // completion scripts are text.
  if (word != "doctor" && word != "launch" && word != "completion") device::check_gpu_profile_setting();
  const std::string second = argc >= 3 ? argv[2] : "";
  const Command* command = find_command(word, second);
  if (command == nullptr) return explain_first_word(word, second);
  // A command of two words ("bench step") takes argv[2] as its second.
  const int words = std::string(command->name) == word ? 1 : 2;
  return run(*command, argc - words, argv + words);
}

}  // namespace ltrain::cli
