#pragma once
// Inside the cli module: the command table's entry, what every command's parsing shares, and each
// command's two functions (its options, which its parser, its --help and completion share; its
// run), grouped by the file that defines them. Not a public header: it names cxxopts, which the
// library builds with privately.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <torch/torch.h>

namespace ltrain::cli {

/// One command as ltrain --help lists it, dispatch runs it and shell completion offers it.
struct Command {
  const char* name;     ///< "train", or "bench step" for a command of two words
  const char* summary;  ///< what it does, for ltrain --help
  const char* example;
  cxxopts::Options (*options)();
  int (*run)(int argc, char** argv);   ///< argv[0] is the command's name; returns the exit code
  std::vector<std::string> arguments;  ///< the fixed words it takes as arguments, for completion
};

/// Every command, in the order ltrain --help lists them (dispatch.cpp).
const std::vector<Command>& commands();

// ---- What every command's parsing shares (command_line.cpp) ----

/// Bare KEY=VALUE arguments (Hydra's style) are positional arguments of this hidden option, which
/// keeps them in order with the --set ones; ltrain sweep's, which may name the sweep file's keys
/// too, are the other's.
constexpr const char* kBareOverrides = "bare-overrides";
constexpr const char* kBareSweepOverrides = "bare-sweep-overrides";
/// Options that --help and completion leave out.
constexpr const char* kHiddenGroup = "hidden";

/// A command's options with those every command has (--verbose, --help).
cxxopts::Options command_options(const std::string& program, const std::string& description);

/// --set KEY=VALUE, and bare KEY=VALUE arguments beside it (`bare` names their hidden option).
void add_set_option(cxxopts::Options& options, const char* bare = kBareOverrides);

/// Parses argv for one command; --help prints the help (plus `extra_help`) and returns nullopt.
/// ConfigError for an argument that is no option; --verbose turns debug messages on.
std::optional<cxxopts::ParseResult> parse(cxxopts::Options& options, int argc, char** argv,
                                          const std::string& extra_help = "");

/// Every --config FILE, in the order given (load_files merges them, later over earlier);
/// ConfigError when there is none.
std::vector<std::filesystem::path> config_files(const cxxopts::ParseResult& args, const std::string& program);

/// Whether the switch --`name` is on: given, and not as --`name`=false.
bool flag(const cxxopts::ParseResult& args, const std::string& name);

/// The value of option --`name`; ConfigError when it was not given.
std::string required(const cxxopts::ParseResult& args, const std::string& name, const std::string& program);

/// Every --set value and bare KEY=VALUE argument, in the order given. ConfigError naming a bare
/// argument that is not KEY=VALUE of a config key or section.
std::vector<std::string> overrides(const cxxopts::ParseResult& args, const std::string& program);

/// A device named on the command line (auto, cpu, cuda, cuda:N), checked as run.device is.
torch::Device device_option(const std::string& name);

// ---- The commands, each with its options and its run ----

// train_commands.cpp: a run, the learning-rate range test, checkpoints and the config format.
cxxopts::Options train_options();
int run_train(int argc, char** argv);
cxxopts::Options lr_find_options();
int run_lr_find(int argc, char** argv);
cxxopts::Options eval_options();
int run_eval(int argc, char** argv);
cxxopts::Options export_options();
int run_export(int argc, char** argv);
cxxopts::Options config_options();
int run_config(int argc, char** argv);

// bench_commands.cpp: measurements.
cxxopts::Options bench_step_options();
int run_bench_step(int argc, char** argv);
cxxopts::Options bench_matmul_options();
int run_bench_matmul(int argc, char** argv);
cxxopts::Options sweep_options();
int run_sweep(int argc, char** argv);
cxxopts::Options reproduce_options();
int run_reproduce(int argc, char** argv);

// machine_commands.cpp: this machine's report, and processes on it.
cxxopts::Options doctor_options();
int run_doctor(int argc, char** argv);
cxxopts::Options launch_options();
int run_launch(int argc, char** argv);

// completion.cpp: the shell completion scripts, from commands().
cxxopts::Options completion_options();
int run_completion(int argc, char** argv);

}  // namespace ltrain::cli
