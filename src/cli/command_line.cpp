// What every command's parsing shares: the options each has, --help, --set and bare overrides.
#include "commands.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"
#include "ltrain/engine/setup.h"

namespace ltrain::cli {

cxxopts::Options command_options(const std::string& program, const std::string& description) {
  cxxopts::Options options(program, description);
  options.add_options()("verbose", "log debug messages too")("h,help", "show this help");
  return options;
}

void add_set_option(cxxopts::Options& options, const char* bare) {
  const std::string description =
      "override a config key, repeatable: --set optim.lr=0.05, --set data.mean=[0.5,0.5,0.5], "
      "--set 'optim={\"lr\":0.05,\"momentum\":0.8}'; or without --set: optim.lr=0.05";
  options.add_options()("set",
                        std::string(bare) == kBareSweepOverrides
                            ? description + "; a sweep key (bench.steps=5, mode=train) overrides the sweep file's"
                            : description,
                        cxxopts::value<std::string>(), "KEY=VALUE");
  options.add_options(kHiddenGroup)(bare, "", cxxopts::value<std::vector<std::string>>());
  options.parse_positional({bare});
  options.positional_help("[KEY=VALUE...]");
}

std::optional<cxxopts::ParseResult> parse(cxxopts::Options& options, int argc, char** argv,
                                          const std::string& extra_help) {
  cxxopts::ParseResult result = options.parse(argc, argv);
  if (flag(result, "help")) {
    std::cout << options.help({""}) << extra_help;
    return std::nullopt;
  }
  if (!result.unmatched().empty())
    throw ConfigError(fmt::format("unexpected argument \"{}\"; see {} --help", result.unmatched().front(),
                                  options.program()));
  if (flag(result, "verbose")) spdlog::set_level(spdlog::level::debug);
  return result;
}

std::vector<std::filesystem::path> config_files(const cxxopts::ParseResult& args, const std::string& program) {
  std::vector<std::filesystem::path> files;
  for (const cxxopts::KeyValue& argument : args.arguments())
    if (argument.key() == "config") files.emplace_back(argument.value());
  if (files.empty()) throw ConfigError(fmt::format("{} needs --config; see {} --help", program, program));
  return files;
}

bool flag(const cxxopts::ParseResult& args, const std::string& name) {
  return args.count(name) > 0 && args[name].as<bool>();
}

std::string required(const cxxopts::ParseResult& args, const std::string& name, const std::string& program) {
  if (!args.count(name)) throw ConfigError(fmt::format("{} needs --{}; see {} --help", program, name, program));
  return args[name].as<std::string>();
}

namespace {

/// ConfigError for `key=a,b,...` where `key` takes no text with commas (a number, a switch, a list,
/// one of several words: "optim.lr=0.1,0.2", "precision.mode=fp16,bf16"): Hydra's sweep syntax,
/// which runs one config per value. Here that is `ltrain sweep --grid`; ltrain train takes one.
void refuse_value_lists(const std::string& text, const std::string& program) {
  const auto equals = text.find('=');
  if (equals == std::string::npos) return;
  const std::string key = text.substr(0, equals), value = text.substr(equals + 1);
  if (value.find(',') == std::string::npos || nlohmann::json::accept(value)) return;
  const auto& keys = config::config_keys().keys;
  const auto info = std::find_if(keys.begin(), keys.end(), [&](const config::KeyInfo& k) { return k.name == key; });
  if (info == keys.end()) return;
  bool every_item_a_value = !info->default_value.is_string();
  if (!info->choices.empty()) {
    every_item_a_value = true;
    std::stringstream items(value);
    for (std::string item; std::getline(items, item, ',');)
      every_item_a_value = every_item_a_value &&
                           std::find(info->choices.begin(), info->choices.end(), item) != info->choices.end();
  }
  if (!every_item_a_value) return;
  throw ConfigError(fmt::format("{}: \"{}\": {} takes one value; a run per value of a list is a sweep: ltrain sweep "
                                "--base CONFIG --grid {} (see ltrain sweep --help)",
                                program, config::shown(text), key, config::shown(text)));
}

}  // namespace

std::vector<std::string> overrides(const cxxopts::ParseResult& args, const std::string& program) {
  // arguments() holds each as typed; a list option's own values would be split at the commas that
  // JSON lists and objects hold.
  std::vector<std::string> specs;
  for (const cxxopts::KeyValue& argument : args.arguments()) {
    if (argument.key() == "set") {
      refuse_value_lists(argument.value(), program);
      specs.push_back(argument.value());
    }
    const bool sweep_keys = argument.key() == kBareSweepOverrides;
    if (argument.key() != kBareOverrides && !sweep_keys) continue;
    const std::string& text = argument.value();
    const auto equals = text.find('=');
    if (equals == std::string::npos || equals == 0)
      throw ConfigError(fmt::format("{}: unexpected argument \"{}\"; arguments besides options are config "
                                    "overrides KEY=VALUE, e.g. optim.lr=0.05 (see {} --help)",
                                    program, config::shown(text), program));
    const std::string key = text.substr(0, equals);
    if (!config::is_key_or_section(key) && !(sweep_keys && config::is_sweep_key_or_section(key))) {
      if (const std::string closest = config::closest_key_or_section(key); !closest.empty())
        throw ConfigError(fmt::format("{}: argument \"{}\": \"{}\" is not a config key: did you mean \"{}\"?",
                                      program, config::shown(text), config::shown(key), closest));
      throw ConfigError(fmt::format("{}: argument \"{}\": \"{}\" is not a config key{}; {} --help lists them", program,
                                    config::shown(text), config::shown(key), sweep_keys ? " or sweep key" : "",
                                    program));
    }
    refuse_value_lists(text, program);
    specs.push_back(text);
  }
  return specs;
}

torch::Device device_option(const std::string& name) {
  return engine::resolve_device(config::load_json({{"run", {{"device", name}}}}, "--device"));
}

}  // namespace ltrain::cli
