// ltrain doctor and launch: what this machine offers, and ltrain's processes on it.
#include "commands.h"

#include <algorithm>
#include <cstring>
#include <iostream>

#include <fmt/format.h>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/device/gpu_profile.h"
#include "ltrain/dist/launch.h"
#include "ltrain/engine/device_report.h"

namespace ltrain::cli {

cxxopts::Options doctor_options() {
  cxxopts::Options options = command_options(
      "ltrain doctor",
      "What this machine and build offer: LibTorch, CUDA runtime and driver, cuDNN, NCCL, how "
      "ltrain was built, and for each GPU the code its kernels load and which fast paths run "
      "there (and why not); warns about mismatches. LTRAIN_GPU_PROFILE="
      + device::gpu_profile_names() + " plans the kernels for that card's limits.");
  options.add_options()("device", "also check that this device can be used (cpu, cuda, cuda:N)",
                        cxxopts::value<std::string>(), "D")("json", "print the report as JSON");
  return options;
}

int run_doctor(int argc, char** argv) {
  cxxopts::Options options = doctor_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const engine::DoctorReport report = engine::doctor_report();
  if (flag(*args, "json")) std::cout << engine::to_json(report).dump(2) << "\n";
  else std::cout << engine::to_text(report);
  if (args->count("device")) {
    const torch::Device device = device_option((*args)["device"].as<std::string>());
    if (!flag(*args, "json")) std::cout << fmt::format("device {}: usable\n", device.str());
  }
  return 0;
}

cxxopts::Options launch_options() {
  cxxopts::Options options("ltrain launch",
                           "Starts N ltrain processes on this machine as torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, "
                           "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), each running COMMAND; "
                           "data-parallel training when COMMAND is train. On several machines, one launcher on each "
                           "with --nnodes, its --node-rank and the same --master-addr and --master-port. Signals are "
                           "passed on; when one process fails the others are stopped. Exit code: 0 when every process "
                           "succeeded, 130 when interrupted, the code every failed process gave when they agree, "
                           "else 5 (a line names the first that failed).");
  options.custom_help("-n N [--nnodes M --node-rank R --master-addr A] [--master-port P] -- COMMAND [OPTIONS]");
  // The numbers are read as text, so that a bad one is named with its option (cxxopts' own
  // message names the value alone); dist::check_launch_options checks their ranges.
  options.add_options()("n,nproc-per-node", "processes on this machine (one per GPU on a GPU host)",
                        cxxopts::value<std::string>(), "N")("nnodes", "machines, one launcher on each (default 1)",
                                                            cxxopts::value<std::string>(), "M")(
      "node-rank", "this machine's number, 0 .. M-1; node 0 serves the rendezvous (default 0)",
      cxxopts::value<std::string>(), "R")("master-addr", "address of node 0's machine (default 127.0.0.1)",
                                          cxxopts::value<std::string>(), "A")(
      "master-port", "rendezvous port on node 0's machine (default: a free one; needed with --nnodes)",
      cxxopts::value<std::string>(), "P")("h,help", "show this help");
  return options;
}

namespace {

/// The value of launch's option --`name` as a whole number; ConfigError when it is not one.
int64_t whole_number(const cxxopts::ParseResult& args, const std::string& name) {
  const std::string text = args[name].as<std::string>();
  try {
    size_t used = 0;
    const int64_t number = std::stoll(text, &used);
    if (used == text.size()) return number;
  } catch (const std::exception&) {
  }
  const std::string option = name == "nproc-per-node" ? "-n" : "--" + name;  // as launch's messages name it
  throw ConfigError(fmt::format("ltrain launch: {} expects a number, got \"{}\"", option, config::shown(text)));
}

}  // namespace

int run_launch(int argc, char** argv) {
  // Everything after the first "--" is the command every process runs, passed on untouched; the
  // arguments before it are the launcher's options.
  char** const end = argv + argc;
  char** const dashes = std::find_if(argv, end, [](const char* argument) { return std::strcmp(argument, "--") == 0; });
  cxxopts::Options options = launch_options();
  const auto args = parse(options, static_cast<int>(dashes - argv), argv);
  if (!args) return 0;
  if (!args->count("nproc-per-node")) throw ConfigError("ltrain launch: -n N (the number of processes) is required");
  dist::LaunchOptions launch;
  launch.processes = whole_number(*args, "nproc-per-node");
  if (args->count("nnodes")) launch.nodes = whole_number(*args, "nnodes");
  if (args->count("node-rank")) launch.node_rank = whole_number(*args, "node-rank");
  if (args->count("master-addr")) launch.master_addr = (*args)["master-addr"].as<std::string>();
  if (args->count("master-port")) launch.master_port = whole_number(*args, "master-port");
  if (dashes != end) launch.command.assign(dashes + 1, end);
  return dist::launch(launch);
}

}  // namespace ltrain::cli
