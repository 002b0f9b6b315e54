// ltrain: parse the command line, call the library, map errors to exit codes. Nothing else.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <cxxopts.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/bench/reproduce.h"
#include "ltrain/bench/step_bench.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/cli/completion.h"
#include "ltrain/config/load.h"
#include "ltrain/core/build_info.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/log.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/dist/launch.h"
#include "ltrain/engine/device_report.h"
#include "ltrain/engine/saved_model.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/kernels/device_fit.h"

namespace {

using ltrain::ExitCode;

constexpr const char* kUsageFooter = R"(
"ltrain COMMAND --help" lists a command's options with their defaults.
"ltrain --version" prints the version and the LibTorch it was built against.
Several processes: ltrain launch, or torchrun --nproc-per-node 2 --no-python build/ltrain train ...
(several machines: ltrain launch --help)
exit codes: 0 success, 1 internal error, 2 usage or config error, 3 data error,
            4 run failed (non-finite loss, out of memory), 5 another data-parallel process
            failed or hung (ltrain launch: a process failed), 130 interrupted
)";

/// Bare KEY=VALUE arguments (Hydra's style) are positional arguments of this hidden option, which
/// keeps them in order with the --set ones.
constexpr const char* kBareOverrides = "bare-overrides";
constexpr const char* kHiddenGroup = "hidden";

/// A command's options with those every command has (--verbose, --help). Each command builds
/// its options in a function of its own, which its parser, its --help and shell completion share.
cxxopts::Options command_options(const std::string& program, const std::string& description) {
  cxxopts::Options options(program, description);
  options.add_options()("verbose", "log debug messages too")("help", "show this help");
  return options;
}

/// Parses argv for one command; --help prints the help (plus `extra_help`) and returns nullopt.
std::optional<cxxopts::ParseResult> parse(cxxopts::Options& options, int argc, char** argv,
                                          const std::string& extra_help = "") {
  cxxopts::ParseResult result = options.parse(argc, argv);
  if (result.count("help")) {
    std::cout << options.help({""}) << extra_help;
    return std::nullopt;
  }
  if (!result.unmatched().empty())
    throw ltrain::ConfigError(fmt::format("unexpected argument \"{}\"; see {} --help", result.unmatched().front(),
                                          options.program()));
  if (result.count("verbose")) spdlog::set_level(spdlog::level::debug);
  return result;
}

std::string required(const cxxopts::ParseResult& args, const std::string& name, const std::string& program) {
  if (!args.count(name)) throw ltrain::ConfigError(fmt::format("{} needs --{}; see {} --help", program, name, program));
  return args[name].as<std::string>();
}

/// Every --set value and bare KEY=VALUE argument, in the order given (arguments() holds each as
/// typed; a list option's own values would be split at the commas that JSON lists and objects hold).
/// ConfigError naming a bare argument that is not KEY=VALUE of a config key or section.
std::vector<std::string> overrides(const cxxopts::ParseResult& args, const std::string& program) {
  std::vector<std::string> specs;
  for (const cxxopts::KeyValue& argument : args.arguments()) {
    if (argument.key() == "set") specs.push_back(argument.value());
    if (argument.key() != kBareOverrides) continue;
    const std::string& text = argument.value();
    const auto equals = text.find('=');
    if (equals == std::string::npos || equals == 0)
      throw ltrain::ConfigError(fmt::format("{}: unexpected argument \"{}\"; arguments besides options are config "
                                            "overrides KEY=VALUE, e.g. optim.lr=0.05 (see {} --help)",
                                            program, ltrain::config::shown(text), program));
    if (const std::string key = text.substr(0, equals); !ltrain::config::is_key_or_section(key))
      throw ltrain::ConfigError(fmt::format("{}: argument \"{}\": \"{}\" is not a config key; {} --help lists them",
                                            program, ltrain::config::shown(text), ltrain::config::shown(key),
                                            program));
    specs.push_back(text);
  }
  return specs;
}

/// --set KEY=VALUE, and bare KEY=VALUE arguments beside it.
void add_set_option(cxxopts::Options& options) {
  options.add_options()("set",
                        "override a config key, repeatable: --set optim.lr=0.05, --set data.mean=[0.5,0.5,0.5], "
                        "--set 'optim={\"lr\":0.05,\"momentum\":0.8}'; or without --set: optim.lr=0.05",
                        cxxopts::value<std::string>(), "KEY=VALUE");
  options.add_options(kHiddenGroup)(kBareOverrides, "", cxxopts::value<std::vector<std::string>>());
  options.parse_positional({kBareOverrides});
  options.positional_help("[KEY=VALUE...]");
}

cxxopts::Options train_options() {
  cxxopts::Options options = command_options("ltrain train", "Train a model from a JSON run config.");
  options.add_options()("config", "run config (JSON)", cxxopts::value<std::string>(), "FILE")(
      "print-config", "print the resolved config (every key, JSON) and exit")(
      "dry-run", "check the config, the data, the model and the device as a run would, print one summary line and "
                 "exit; writes nothing");
  add_set_option(options);
  return options;
}

int run_train(int argc, char** argv) {
  cxxopts::Options options = train_options();
  const auto args = parse(options, argc, argv,
                          "\nConfig keys (JSON key == --set key == bare KEY=VALUE):\n" +
                              ltrain::config::describe_keys());
  if (!args) return 0;
  const auto loaded =
      ltrain::config::load_file(required(*args, "config", "ltrain train"), overrides(*args, options.program()));
  if (args->count("print-config")) {
    std::cout << ltrain::config::to_json(loaded.config).dump(2) << "\n";
    return 0;
  }
  if (args->count("dry-run")) {
    const ltrain::engine::RunPlan plan = ltrain::engine::plan_run(loaded);
    std::cout << "dry run: " << ltrain::engine::to_text(loaded.config, plan) << "; nothing was written\n";
    return 0;
  }
  ltrain::engine::train(loaded);
  return 0;
}

cxxopts::Options config_options() {
  cxxopts::Options options = command_options("ltrain config", "Describe the run config format.");
  options.add_options()("schema", "print a JSON Schema (draft 2020-12) of run config files, for editors and checkers");
  return options;
}

int run_config(int argc, char** argv) {
  cxxopts::Options options = config_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  if (!args->count("schema")) throw ltrain::ConfigError("ltrain config needs --schema; see ltrain config --help");
  std::cout << ltrain::config::json_schema().dump(2) << "\n";
  return 0;
}

cxxopts::Options eval_options() {
  cxxopts::Options options =
      command_options("ltrain eval", "Evaluate a checkpoint on the test set (its saved config, with overrides).");
  options.add_options()("checkpoint", "checkpoint file (.ltc)", cxxopts::value<std::string>(), "FILE")(
      "json", "print the result as JSON on stdout");
  add_set_option(options);
  return options;
}

int run_eval(int argc, char** argv) {
  cxxopts::Options options = eval_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string path = required(*args, "checkpoint", "ltrain eval");
  const ltrain::engine::CheckpointEvaluation evaluation =
      ltrain::engine::evaluate_checkpoint(path, overrides(*args, options.program()));
  const ltrain::engine::EvalResult& result = evaluation.result;
  if (args->count("json")) {
    std::cout << nlohmann::json{{"checkpoint", path},
                                {"step", evaluation.step},
                                {"data", ltrain::config::data_summary(evaluation.data)},
                                {"accuracy", result.accuracy},
                                {"loss", result.loss},
                                {"correct", result.correct},
                                {"images", result.images}}
                     .dump()
              << "\n";
  } else {
    std::cout << fmt::format("{} (step {}): test accuracy {:.2f}% ({}/{}) on {} ({} classes), loss {:.4f}\n", path,
                             evaluation.step, 100.0 * result.accuracy, result.correct, result.images,
                             ltrain::config::to_string(evaluation.data.source), evaluation.data.classes(), result.loss);
  }
  return 0;
}

cxxopts::Options export_options() {
  cxxopts::Options options = command_options("ltrain export",
                                             "Write a checkpoint's model weights (the averaged ones with "
                                             "optim.ema_decay) as safetensors with torchvision's names.");
  options.add_options()("checkpoint", "checkpoint file (.ltc)", cxxopts::value<std::string>(), "FILE")(
      "out", "output file (.safetensors)", cxxopts::value<std::string>(), "FILE");
  return options;
}

int run_export(int argc, char** argv) {
  cxxopts::Options options = export_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string path = required(*args, "checkpoint", "ltrain export");
  const std::string out = required(*args, "out", "ltrain export");
  // Writing replaces the target with a new file: only ever a regular file, never a device or a FIFO.
  if (const std::string problem = ltrain::files::not_writable_as_regular_file(out); !problem.empty())
    throw ltrain::ConfigError(fmt::format("ltrain export --out {}: {}; give the path of a new or regular file "
                                          "(.safetensors)",
                                          out, problem));
  const size_t tensors = ltrain::engine::export_weights(path, out);
  std::cout << fmt::format("wrote {} ({} tensors)\n", out, tensors);
  return 0;
}

cxxopts::Options bench_step_options() {
  cxxopts::Options options =
      command_options("ltrain bench step", "Time training steps of a config (after warm-up steps).");
  options.add_options()("config", "run config (JSON)", cxxopts::value<std::string>(), "FILE")(
      "warmup", "untimed steps first", cxxopts::value<int64_t>()->default_value("10"), "N")(
      "steps", "timed steps", cxxopts::value<int64_t>()->default_value("50"), "N")(
      "json", "print the result as JSON on stdout")(
      "profile", "after timing, profile a few more steps and write the Chrome trace here",
      cxxopts::value<std::string>(), "TRACE.json");
  add_set_option(options);
  return options;
}

int run_bench_step(int argc, char** argv) {
  cxxopts::Options options = bench_step_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const auto loaded =
      ltrain::config::load_file(required(*args, "config", "ltrain bench step"), overrides(*args, options.program()));
  const std::string profile_trace = args->count("profile") ? (*args)["profile"].as<std::string>() : "";
  const int64_t warmup = (*args)["warmup"].as<int64_t>();
  const int64_t steps = (*args)["steps"].as<int64_t>();
  if (warmup < 0 || steps < 1) throw ltrain::ConfigError("ltrain bench step: --warmup must be >= 0 and --steps >= 1");
  const ltrain::bench::StepBenchResult result = ltrain::bench::bench_steps(loaded, warmup, steps, profile_trace);
  if (args->count("json")) {
    std::cout << ltrain::bench::to_json(result).dump() << "\n";
  } else {
    std::cout << fmt::format("{} batch {}{}: {:.2f} ms/step, {:.0f} img/s, peak memory {}\n", result.device,
                             result.batch_size, result.cuda_graph ? " (CUDA graph)" : "", result.ms_per_step,
                             result.images_per_second,
                             result.peak_memory_bytes < 0
                                 ? std::string("n/a")
                                 : fmt::format("{:.2f} GiB", static_cast<double>(result.peak_memory_bytes) / (1 << 30)));
  }
  return 0;
}

/// A device named on the command line (auto, cpu, cuda, cuda:N), checked as run.device is.
torch::Device device_option(const std::string& name) {
  return ltrain::engine::resolve_device(ltrain::config::load_json({{"run", {{"device", name}}}}, "--device"));
}

cxxopts::Options bench_matmul_options() {
  cxxopts::Options options = command_options(
      "ltrain bench matmul",
      "Square matmul throughput per precision (the 4090 guide's test): TFLOP/s = 2 n^3 "
      "products / time, timed with CUDA events on a GPU.");
  options.add_options()("device", "auto | cpu | cuda | cuda:N", cxxopts::value<std::string>()->default_value("auto"),
                        "D")("size", "matrix side n", cxxopts::value<int64_t>()->default_value("8192"), "N")(
      "warmup", "untimed products first", cxxopts::value<int64_t>()->default_value("10"), "N")(
      "iters", "timed products", cxxopts::value<int64_t>()->default_value("100"), "N")(
      "precision", "comma-separated: fp32, tf32, fp16, bf16",
      cxxopts::value<std::string>()->default_value("fp32,tf32,fp16,bf16"), "LIST")(
      "json", "print one JSON object per precision on stdout");
  return options;
}

int run_bench_matmul(int argc, char** argv) {
  cxxopts::Options options = bench_matmul_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const int64_t n = (*args)["size"].as<int64_t>(), warmup = (*args)["warmup"].as<int64_t>();
  const int64_t iters = (*args)["iters"].as<int64_t>();
  if (n < 1 || warmup < 0 || iters < 1)
    throw ltrain::ConfigError("ltrain bench matmul: --size and --iters must be >= 1 and --warmup >= 0");
  std::vector<ltrain::config::PrecisionMode> precisions;
  std::stringstream list((*args)["precision"].as<std::string>());
  for (std::string name; std::getline(list, name, ',');) {
    bool known = false;
    for (const auto& [mode, spelled] : ltrain::config::EnumNames<ltrain::config::PrecisionMode>::names)
      if (name == spelled) precisions.push_back(mode), known = true;
    if (!known)
      throw ltrain::ConfigError(fmt::format("ltrain bench matmul: --precision {}: unknown precision \"{}\"; use fp32, "
                                            "tf32, fp16 or bf16",
                                            (*args)["precision"].as<std::string>(), name));
  }
  const torch::Device device = device_option((*args)["device"].as<std::string>());
  for (const auto& result : ltrain::bench::bench_matmul(device, precisions, n, warmup, iters)) {
    if (args->count("json")) {
      std::cout << ltrain::bench::to_json(result).dump() << "\n";
    } else if (result.error.empty()) {
      std::cout << fmt::format("{} matmul n={} {:<5} ({}): {:.4g} TFLOP/s ({:.3f} ms per product)\n", device.str(), n,
                               result.precision, result.dtype, result.tflops, result.ms_per_product);
    } else {
      std::cout << fmt::format("{} matmul n={} {:<5} ({}): not run: {}\n", device.str(), n, result.precision,
                               result.dtype, result.error);
    }
  }
  return 0;
}

cxxopts::Options sweep_options() {
  cxxopts::Options options = command_options(
      "ltrain sweep",
      "Run a config sweep: a base config and keys with lists of values (a grid, a zip), timed steps "
      "(mode bench) or full runs (mode train) per point, or a batch-size search up to a "
      "fraction of GPU memory. Writes results.csv, results.md and results.json; "
      "scripts/report/plot_sweep.py draws results.png.");
  options.add_options()("config", "sweep description (JSON; the format is in configs/sweeps/README.md)",
                        cxxopts::value<std::string>(), "FILE")(
      "out", "results folder (default: sweeps/NAME, NAME the sweep file's name)", cxxopts::value<std::string>(), "DIR")(
      "dry-run", "list the points the sweep would run and check that each is a valid config; runs nothing");
  add_set_option(options);
  return options;
}

int run_sweep(int argc, char** argv) {
  cxxopts::Options options = sweep_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::filesystem::path file = required(*args, "config", "ltrain sweep");
  if (args->count("dry-run")) {
    const std::vector<std::string> every_point = overrides(*args, options.program());
    const ltrain::bench::SweepPlan plan = ltrain::bench::plan_sweep(file, every_point);
    std::cout << fmt::format("{}: mode {}, base {}, {} point(s)", file.string(), plan.mode, plan.base.string(),
                             plan.points.size());
    if (plan.batch_search)
      std::cout << fmt::format(", each a search of data.batch_size from {} up to {}", plan.batch_search->start,
                               plan.batch_search->max);
    std::cout << "\n";
    std::vector<std::string> common = plan.set;
    common.insert(common.end(), every_point.begin(), every_point.end());
    if (!common.empty()) std::cout << fmt::format("  every point: {}\n", fmt::join(common, " "));
    for (size_t i = 0; i < plan.points.size(); ++i) {
      const std::string settings = fmt::format("{}", fmt::join(plan.points[i], " "));
      std::cout << fmt::format("  point {}: {}\n", i, settings.empty() ? "the base config" : settings);
    }
    std::cout << "every point is a valid config; nothing was run\n";
    return 0;
  }
  const std::filesystem::path out =
      args->count("out") ? std::filesystem::path((*args)["out"].as<std::string>()) : "sweeps" / file.stem();
  const ltrain::bench::SweepResult result = ltrain::bench::run_sweep(file, out, overrides(*args, options.program()));
  std::cout << ltrain::bench::write_sweep_results(result, out);
  std::cout << fmt::format("{} point(s), {} failed; results in {} (plot: python3 scripts/report/plot_sweep.py {})\n",
                           result.points.size(),
                           std::count_if(result.points.begin(), result.points.end(),
                                         [](const auto& point) { return !point.error.empty(); }),
                           out.string(), out.string());
  return 0;
}

/// "32,224" -> {32, 224}: image sides, each between 8 and the config's largest.
std::vector<int64_t> image_sizes(const std::string& list) {
  std::vector<int64_t> sizes;
  std::string::size_type start = 0;
  while (start <= list.size()) {
    const std::string::size_type comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    int64_t size = 0;
    try {
      size_t used = 0;
      size = std::stoll(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      size = 0;
    }
    if (size < 8 || size > ltrain::config::kMaxImageSize)
      throw ltrain::ConfigError(fmt::format("ltrain reproduce: --image-sizes \"{}\": expected sides from 8 to {} "
                                            "separated by commas, e.g. 32,224",
                                            ltrain::config::shown(list), ltrain::config::kMaxImageSize));
    sizes.push_back(size);
    start = comma + 1;
  }
  return sizes;
}

cxxopts::Options reproduce_options() {
  cxxopts::Options options = command_options(
      "ltrain reproduce",
      "The GPU guides' claims (AMP speed and memory, TF32, cudnn.benchmark, CUDA graphs, gradient "
      "accumulation, activation checkpointing, the matmul test, the batch-size search, the "
      "hardware), each with its guide and line, as A/B measurements on this machine; writes "
      "REPORT.md and results.json.");
  options.add_options()("config", "the run config every measurement starts from", cxxopts::value<std::string>(), "FILE")(
      "out", "report folder", cxxopts::value<std::string>()->default_value("reports/reproduce"), "DIR")(
      "warmup", "untimed steps per measurement", cxxopts::value<int64_t>()->default_value("10"), "N")(
      "steps", "timed steps per measurement", cxxopts::value<int64_t>()->default_value("30"), "N")(
      "rounds", "A/B rounds per claim, alternating", cxxopts::value<int64_t>()->default_value("3"), "N")(
      "image-sizes", "image sides to measure the step claims at, e.g. 32,224 (a side other than 32: random images); "
      "default: the config's data.image_size", cxxopts::value<std::string>(), "LIST")(
      "matmul-size", "matmul test's n", cxxopts::value<int64_t>()->default_value("8192"), "N")(
      "matmul-iters", "matmul test's timed products", cxxopts::value<int64_t>()->default_value("100"), "N")(
      "no-batch-search", "skip the batch-size search (the longest part on a GPU)");
  add_set_option(options);
  return options;
}

int run_reproduce(int argc, char** argv) {
  cxxopts::Options options = reproduce_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  ltrain::bench::ReproduceOptions settings;
  settings.base_config = required(*args, "config", "ltrain reproduce");
  settings.overrides = overrides(*args, options.program());
  settings.warmup = (*args)["warmup"].as<int64_t>();
  settings.steps = (*args)["steps"].as<int64_t>();
  settings.rounds = (*args)["rounds"].as<int64_t>();
  if (args->count("image-sizes")) settings.image_sizes = image_sizes((*args)["image-sizes"].as<std::string>());
  settings.matmul_size = (*args)["matmul-size"].as<int64_t>();
  settings.matmul_products = (*args)["matmul-iters"].as<int64_t>();
  settings.batch_search = !args->count("no-batch-search");
  if (settings.warmup < 0 || settings.steps < 1 || settings.rounds < 1 || settings.rounds > 100 ||
      settings.matmul_size < 1 || settings.matmul_products < 1)
    throw ltrain::ConfigError("ltrain reproduce: --steps, --matmul-size and --matmul-iters must be >= 1, --rounds "
                              "1-100, --warmup >= 0");
  const std::filesystem::path out = (*args)["out"].as<std::string>();
  std::cout << ltrain::bench::write_report(ltrain::bench::reproduce(settings, out), out);
  std::cout << fmt::format("report in {}\n", (out / "REPORT.md").string());
  return 0;
}

cxxopts::Options doctor_options() {
  cxxopts::Options options = command_options(
      "ltrain doctor",
      "What this machine and build offer: LibTorch, CUDA runtime and driver, cuDNN, NCCL, how "
      "ltrain was built, and for each GPU the code its kernels load and which fast paths run "
      "there (and why not); warns about mismatches. LTRAIN_GPU_PROFILE="
      + ltrain::kernels::gpu_profile_names() + " plans the kernels for that card's limits.");
  options.add_options()("device", "also check that this device can be used (cpu, cuda, cuda:N)",
                        cxxopts::value<std::string>(), "D")("json", "print the report as JSON");
  return options;
}

int run_doctor(int argc, char** argv) {
  cxxopts::Options options = doctor_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const ltrain::engine::DoctorReport report = ltrain::engine::doctor_report();
  if (args->count("json")) std::cout << ltrain::engine::to_json(report).dump(2) << "\n";
  else std::cout << ltrain::engine::to_text(report);
  if (args->count("device")) {
    const torch::Device device = device_option((*args)["device"].as<std::string>());
    if (!args->count("json")) std::cout << fmt::format("device {}: usable\n", device.str());
  }
  return 0;
}

/// launch's options, for its --help and completion; run_launch parses them itself, since
/// everything after "--" is the command it starts.
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
  options.add_options()("n,nproc-per-node", "processes on this machine (one per GPU on a GPU host)",
                        cxxopts::value<int64_t>(), "N")("nnodes", "machines, one launcher on each (default 1)",
                                                        cxxopts::value<int64_t>(), "M")(
      "node-rank", "this machine's number, 0 .. M-1; node 0 serves the rendezvous (default 0)",
      cxxopts::value<int64_t>(), "R")("master-addr", "address of node 0's machine (default 127.0.0.1)",
                                      cxxopts::value<std::string>(), "A")(
      "master-port", "rendezvous port on node 0's machine (default: a free one; needed with --nnodes)",
      cxxopts::value<int64_t>(), "P")("help", "show this help");
  return options;
}

int run_launch(int argc, char** argv) {
  constexpr int64_t kMaxPort = 65535;
  constexpr int64_t kMaxProcesses = 256;
  constexpr int64_t kMaxNodes = 4096;
  ltrain::dist::LaunchOptions options;
  bool have_processes = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string argument = argv[i];
    if (argument == "--") break;
    if (argument == "--help" || argument == "-h") {
      std::cout << launch_options().help({""});
      return 0;
    }
    if (argument == "--master-addr" && i + 1 < argc) {
      options.master_addr = argv[++i];
      if (options.master_addr.empty())
        throw ltrain::ConfigError("ltrain launch: --master-addr needs the address of node 0's machine");
      continue;
    }
    const bool numeric = argument == "-n" || argument == "--nproc-per-node" || argument == "--master-port" ||
                         argument == "--nnodes" || argument == "--node-rank";
    if (numeric && i + 1 < argc) {
      const std::string value = argv[++i];
      int64_t number = 0;
      try {
        size_t used = 0;
        number = std::stoll(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        throw ltrain::ConfigError(fmt::format("ltrain launch: {} expects a number, got \"{}\"", argument, value));
      }
      if (argument == "--master-port") {
        if (number < 1 || number > kMaxPort)
          throw ltrain::ConfigError(fmt::format("ltrain launch: --master-port {}: a TCP port is between 1 and {}; "
                                                "leave the option out for a free one",
                                                number, kMaxPort));
        options.master_port = number;
      } else if (argument == "--nnodes") {
        if (number < 1 || number > kMaxNodes)
          throw ltrain::ConfigError(
              fmt::format("ltrain launch: --nnodes {}: expected 1 to {} machines", number, kMaxNodes));
        options.nodes = number;
      } else if (argument == "--node-rank") {
        options.node_rank = number;  // checked against --nnodes by launch()
      } else {
        if (number < 1 || number > kMaxProcesses)
          throw ltrain::ConfigError(fmt::format("ltrain launch: {} {}: expected 1 to {} processes (one per GPU on a GPU "
                                                "host)",
                                                argument, number, kMaxProcesses));
        options.processes = number;
        have_processes = true;
      }
      continue;
    }
    throw ltrain::ConfigError(fmt::format("ltrain launch: unknown option \"{}\"; see ltrain launch --help", argument));
  }
  if (!have_processes) throw ltrain::ConfigError("ltrain launch: -n N (the number of processes) is required");
  for (++i; i < argc; ++i) options.command.emplace_back(argv[i]);
  return ltrain::dist::launch(options);
}

cxxopts::Options completion_options() {
  cxxopts::Options options = command_options(
      "ltrain completion",
      "Print a shell completion script for ltrain's commands, options and config keys (bash or zsh). bash: source "
      "<(ltrain completion bash), or save it as ~/.local/share/bash-completion/completions/ltrain; zsh: save it as "
      "_ltrain in a folder of $fpath, or source <(ltrain completion zsh).");
  options.add_options(kHiddenGroup)("shell", "", cxxopts::value<std::string>());
  options.parse_positional({"shell"});
  options.positional_help("bash|zsh");
  return options;
}

int run_completion(int argc, char** argv);

/// One command as ltrain --help lists it, dispatch runs it and shell completion offers it.
struct Command {
  const char* name;     ///< "train", or "bench step" for a command of two words
  const char* summary;  ///< what it does, for ltrain --help
  const char* example;
  cxxopts::Options (*options)();
  int (*run)(int argc, char** argv);
  std::vector<std::string> arguments;  ///< the fixed words it takes as arguments, for completion
};

const std::vector<Command>& commands() {
  static const std::vector<Command> list{
      {"train", "train a model", "ltrain train --config configs/quickstart.json optim.lr=0.1", train_options,
       run_train, {}},
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
      {"completion", "shell completion (bash, zsh)", "source <(ltrain completion bash)", completion_options,
       run_completion, {"bash", "zsh"}},
  };
  return list;
}

/// ltrain --help: the commands, each with what it does and an example, from commands().
std::string usage() {
  std::string out = "usage: ltrain COMMAND [OPTIONS]\n\nTrains torchvision-style ResNets on CIFAR-10 and CIFAR-100 from "
                    "JSON run configs.\n\ncommands:\n";
  for (const Command& command : commands())
    out += fmt::format("  {:<13} {:<44} {}\n", command.name, std::string(command.summary) + ":", command.example);
  return out + kUsageFooter;
}

/// The commands with their options as shell completion sees them.
std::vector<ltrain::cli::CommandSpec> completion_specs() {
  std::vector<ltrain::cli::CommandSpec> specs;
  for (const Command& command : commands()) {
    ltrain::cli::CommandSpec spec{command.name, command.summary, {}, false, command.arguments};
    const cxxopts::Options options = command.options();
    for (const std::string& group : options.groups()) {
      for (const cxxopts::HelpOptionDetails& option : options.group_help(group).options) {
        if (group == kHiddenGroup) {
          spec.overrides = spec.overrides || option.l.front() == kBareOverrides;
          continue;
        }
        ltrain::cli::Flag flag{{}, option.desc, option.is_boolean ? "" : option.arg_help};
        if (!option.s.empty()) flag.names.push_back("-" + option.s);
        for (const std::string& name : option.l) flag.names.push_back("--" + name);
        spec.flags.push_back(flag);
      }
    }
    specs.push_back(spec);
  }
  return specs;
}

int run_completion(int argc, char** argv) {
  cxxopts::Options options = completion_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string shell = args->count("shell") ? (*args)["shell"].as<std::string>() : "";
  if (shell == "bash") std::cout << ltrain::cli::bash_completion(completion_specs(), LTRAIN_VERSION);
  else if (shell == "zsh") std::cout << ltrain::cli::zsh_completion(completion_specs(), LTRAIN_VERSION);
  else if (shell.empty())
    throw ltrain::ConfigError("ltrain completion needs the shell: ltrain completion bash, or ltrain completion zsh");
  else
    throw ltrain::ConfigError(fmt::format("ltrain completion {}: no script for this shell; use bash or zsh",
                                          ltrain::config::shown(shell)));
  return 0;
}

int dispatch(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << usage();
    return static_cast<int>(ExitCode::usage);
  }
  const std::string command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::cout << usage();
    return 0;
  }
  if (command == "--version") {
    std::cout << "ltrain " << LTRAIN_VERSION << " (commit " << ltrain::source_commit() << ", LibTorch "
              << ltrain::compat::torch_version()
              << (ltrain::compat::built_with_cuda() ? ", CUDA" : ", CPU only") << ")\n";
    return 0;
  }
  // The doctor reports a bad LTRAIN_GPU_PROFILE among its warnings; the launcher's children check it;
  // completion scripts are text.
  if (command != "doctor" && command != "launch" && command != "completion")
    ltrain::engine::check_gpu_profile_setting();
  // A command of two words ("bench step") takes argv[2] as its second.
  const std::string second = argc >= 3 ? argv[2] : "";
  for (const Command& entry : commands()) {
    if (entry.name == command) return entry.run(argc - 1, argv + 1);
    if (entry.name == command + " " + second) return entry.run(argc - 2, argv + 2);
  }
  // The first word of commands of two words alone ("ltrain bench"): its commands, or which they are.
  std::string group_usage;
  std::vector<std::string> second_words;
  for (const Command& entry : commands())
    if (std::string(entry.name).rfind(command + " ", 0) == 0) {
      second_words.push_back(std::string(entry.name).substr(command.size() + 1));
      group_usage += fmt::format("  {:<13} {:<44} {}\n", entry.name, std::string(entry.summary) + ":", entry.example);
    }
  if (!second_words.empty() && (second == "--help" || second == "-h")) {
    std::cout << group_usage;
    return 0;
  }
  if (!second_words.empty() && second.empty())
    throw ltrain::ConfigError(fmt::format("ltrain {} needs one of: {}; see ltrain {} --help", command,
                                          fmt::join(second_words, ", "), command));
  if (!second_words.empty())
    throw ltrain::ConfigError(fmt::format("unknown command \"ltrain {} {}\"; use one of: {} (see ltrain {} --help)",
                                          command, ltrain::config::shown(second), fmt::join(second_words, ", "),
                                          command));
  throw ltrain::ConfigError(fmt::format("unknown command \"{}\"; run ltrain --help for the list", command));
}

}  // namespace

int main(int argc, char** argv) {
  // First: from here on SIGINT/SIGTERM end ltrain with one line and exit code 130 (a training run
  // checkpoints first), never with the default action's silent 143.
  ltrain::interrupt::install_stop_handlers();
  ltrain::interrupt::unblock_stop_signals();
  ltrain::log::init_console(false);
  try {
    return dispatch(argc, argv);
  } catch (const ltrain::UserError& error) {
    spdlog::error("{}", error.what());
    return static_cast<int>(error.code());
  } catch (const cxxopts::exceptions::exception& error) {
    spdlog::error("{}; see ltrain --help", error.what());
    return static_cast<int>(ExitCode::usage);
  } catch (const c10::Error& error) {
    if (ltrain::compat::is_out_of_memory(error)) {
      spdlog::error("out of memory ({}): lower data.batch_size or use a smaller model.arch",
                    ltrain::compat::first_line(error.what_without_backtrace()));
      return static_cast<int>(ExitCode::runtime);
    }
    spdlog::error("internal error in LibTorch: {}", error.what_without_backtrace());
    return static_cast<int>(ExitCode::internal);
  } catch (const std::exception& error) {
    spdlog::error("internal error: {}", error.what());
    return static_cast<int>(ExitCode::internal);
  }
}
