// ltrain bench step, bench matmul, sweep and reproduce: measurements.
#include "commands.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/bench/reproduce.h"
#include "ltrain/bench/step_bench.h"
#include "ltrain/bench/sweep.h"
#include "ltrain/config/load.h"
#include "ltrain/config/sweep_spec.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"

namespace ltrain::cli {

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
      config::load_file(required(*args, "config", "ltrain bench step"), overrides(*args, options.program()));
  const std::string profile_trace = args->count("profile") ? (*args)["profile"].as<std::string>() : "";
  const int64_t warmup = (*args)["warmup"].as<int64_t>();
  const int64_t steps = (*args)["steps"].as<int64_t>();
  if (warmup < 0 || steps < 1) throw ConfigError("ltrain bench step: --warmup must be >= 0 and --steps >= 1");
  const bench::StepBenchResult result = bench::bench_steps(loaded, warmup, steps, profile_trace);
  if (flag(*args, "json")) {
    std::cout << bench::to_json(result).dump() << "\n";
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

namespace {

/// "fp32,bf16" -> the precisions it names.
std::vector<config::PrecisionMode> precision_list(const std::string& list) {
  std::vector<config::PrecisionMode> precisions;
  std::stringstream items(list);
  for (std::string name; std::getline(items, name, ',');) {
    bool known = false;
    for (const auto& [mode, spelled] : config::EnumNames<config::PrecisionMode>::names)
      if (name == spelled) precisions.push_back(mode), known = true;
    if (!known)
      throw ConfigError(fmt::format("ltrain bench matmul: --precision {}: unknown precision \"{}\"; use fp32, "
                                    "tf32, fp16 or bf16",
                                    list, name));
  }
  return precisions;
}

}  // namespace

int run_bench_matmul(int argc, char** argv) {
  cxxopts::Options options = bench_matmul_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const int64_t n = (*args)["size"].as<int64_t>(), warmup = (*args)["warmup"].as<int64_t>();
  const int64_t iters = (*args)["iters"].as<int64_t>();
  if (n < 1 || warmup < 0 || iters < 1)
    throw ConfigError("ltrain bench matmul: --size and --iters must be >= 1 and --warmup >= 0");
  const std::vector<config::PrecisionMode> precisions = precision_list((*args)["precision"].as<std::string>());
  const torch::Device device = device_option((*args)["device"].as<std::string>());
  const std::vector<bench::MatmulResult> results = bench::bench_matmul(device, precisions, n, warmup, iters);
  for (const auto& result : results) {
    if (flag(*args, "json")) {
      std::cout << bench::to_json(result).dump() << "\n";
    } else if (result.error.empty()) {
      std::cout << fmt::format("{} matmul n={} {:<5} ({}): {:.4g} TFLOP/s ({:.3f} ms per product)\n", device.str(), n,
                               result.precision, result.dtype, result.tflops, result.ms_per_product);
    } else {
      std::cout << fmt::format("{} matmul n={} {:<5} ({}): not run: {}\n", device.str(), n, result.precision,
                               result.dtype, result.error);
    }
  }
  // Rows that all say "not run" measured nothing: a failed run, not a result.
  if (std::none_of(results.begin(), results.end(), [](const bench::MatmulResult& r) { return r.error.empty(); }))
    throw RunError(fmt::format("ltrain bench matmul: no precision could run on {} (each row says why); use a "
                               "precision this device runs, or a smaller --size",
                               device.str()));
  return 0;
}

cxxopts::Options sweep_options() {
  cxxopts::Options options = command_options(
      "ltrain sweep",
      "Run a config sweep: a base config and keys with lists of values (a grid, a zip), timed steps "
      "(mode bench) or full runs (mode train) per point, or a batch-size search up to a "
      "fraction of GPU memory; from a sweep file (--config) or from a run config and --grid. Writes "
      "results.csv, results.md and results.json; a rerun into the same folder reuses the points "
      "measured alike. scripts/report/plot_sweep.py draws results.png. Exit code 7 when a point failed.");
  options.add_options()("config", "sweep description (JSON; the format is in configs/sweeps/README.md)",
                        cxxopts::value<std::string>(), "FILE")(
      "base", "a run config to sweep without a sweep file, with --grid", cxxopts::value<std::string>(), "FILE")(
      "grid", "with --base: a key and its values, every combination of the --grid options runs (repeatable; a value "
      "that is no JSON is a string)", cxxopts::value<std::string>(), "KEY=V1,V2,...")(
      "out", "results folder (default: sweeps/NAME, NAME the sweep file's or the base config's name)",
      cxxopts::value<std::string>(), "DIR")(
      "fresh", "measure every point again, instead of reusing the points of an earlier run in the results folder")(
      "dry-run", "list the points the sweep would run and check that each is a valid config on this machine; runs "
      "nothing")(
      "schema", "print a JSON Schema (draft 2020-12) of sweep files, for editors and checkers");
  add_set_option(options, kBareSweepOverrides);
  return options;
}

namespace {

/// sweep --dry-run: the points of `file`, each checked as a config, printed; runs nothing.
void print_sweep_plan(const std::filesystem::path& file, const std::vector<std::string>& every_point) {
  const bench::SweepPlan plan = bench::plan_sweep(file, every_point, /*on_this_machine=*/true);
  std::cout << fmt::format("{}: mode {}, base {}, {} point(s)", file.string(), plan.mode, plan.base.string(),
                           plan.points.size());
  if (plan.batch_search)
    std::cout << fmt::format(", each a search of data.batch_size from {} up to {}", plan.batch_search->start,
                             plan.batch_search->max);
  std::cout << "\n";
  std::vector<std::string> common = plan.set;
  common.insert(common.end(), plan.overrides.begin(), plan.overrides.end());
  if (!common.empty()) std::cout << fmt::format("  every point: {}\n", fmt::join(common, " "));
  for (size_t i = 0; i < plan.points.size(); ++i) {
    const std::string settings = fmt::format("{}", fmt::join(plan.points[i], " "));
    std::cout << fmt::format("  point {}: {}\n", i, settings.empty() ? "the base config" : settings);
  }
  std::cout << "every point is a valid config on this machine; nothing was run\n";
}

void write_sweep_file(const std::filesystem::path& file, const nlohmann::ordered_json& sweep) {
  const std::string text = sweep.dump(2) + "\n";
  files::write_atomically(file, {{text.data(), text.size()}});
}

/// "data.batch_size=256,512" -> the grid's key and its values (each as JSON where it reads as
/// JSON, else a string: fp16, bf16).
std::pair<std::string, nlohmann::ordered_json> grid_option(const std::string& text) {
  const auto equals = text.find('=');
  const std::string key = text.substr(0, equals);
  const auto fail = [&](const std::string& what) {
    return ConfigError(fmt::format("ltrain sweep: --grid \"{}\": {}", config::shown(text), what));
  };
  if (equals == std::string::npos || equals == 0 || equals + 1 == text.size())
    throw fail("expected KEY=V1,V2,..., e.g. --grid data.batch_size=256,512");
  if (!config::is_key_or_section(key))
    throw fail(fmt::format("\"{}\" is not a config key; ltrain train --help lists them", config::shown(key)));
  nlohmann::ordered_json values = nlohmann::ordered_json::array();
  std::stringstream items(text.substr(equals + 1));
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) throw fail("an empty value; separate the values by single commas");
    values.push_back(nlohmann::ordered_json::accept(item) ? nlohmann::ordered_json::parse(item)
                                                          : nlohmann::ordered_json(item));
  }
  return {key, values};
}

/// The sweep file of --base and --grid: the base config's absolute path and a grid of every --grid,
/// in the order given (the first varying slowest).
nlohmann::ordered_json grid_sweep(const cxxopts::ParseResult& args) {
  nlohmann::ordered_json sweep{{"base", std::filesystem::absolute(args["base"].as<std::string>()).string()},
                               {"grid", nlohmann::ordered_json::object()}};
  for (const cxxopts::KeyValue& argument : args.arguments()) {
    if (argument.key() != "grid") continue;  // arguments(): a value as typed, not split at its commas
    auto [key, values] = grid_option(argument.value());
    if (sweep["grid"].contains(key))
      throw ConfigError(fmt::format("ltrain sweep: --grid {} is given twice; give each key once with all its values",
                                    config::shown(key)));
    sweep["grid"][key] = std::move(values);
  }
  return sweep;
}

/// The sweep of --base and --grid checked as a sweep file (plan_sweep) from a temporary file, its
/// errors naming --grid instead.
bench::SweepPlan plan_grid_sweep(const nlohmann::ordered_json& sweep, const std::vector<std::string>& every_point) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("ltrain-grid-{}.json", ::getpid());
  write_sweep_file(file, sweep);
  struct Remove {
    std::filesystem::path file;
    ~Remove() {
      std::error_code ignored;
      std::filesystem::remove(file, ignored);
    }
  } remove{file};
  try {
    return bench::plan_sweep(file, every_point, /*on_this_machine=*/true);
  } catch (const ConfigError& error) {
    std::string text = error.what();
    for (auto at = text.find(file.string()); at != std::string::npos; at = text.find(file.string()))
      text.replace(at, file.string().size(), "ltrain sweep --grid");
    throw ConfigError(text);
  }
}

}  // namespace

int run_sweep(int argc, char** argv) {
  cxxopts::Options options = sweep_options();
  const auto args = parse(options, argc, argv,
                          "\nSweep keys (JSON key == --set key == bare KEY=VALUE; other keys are run config keys, of "
                          "every point):\n" +
                              config::describe_keys(config::sweep_keys()));
  if (!args) return 0;
  if (flag(*args, "schema")) {
    std::cout << config::sweep_schema().dump(2) << "\n";
    return 0;
  }
  const std::vector<std::string> every_point = overrides(*args, options.program());
  const bool from_grid = args->count("base") || args->count("grid");
  if (from_grid && (args->count("config") || !args->count("base") || !args->count("grid")))
    throw ConfigError("ltrain sweep: --base and --grid go together and replace --config: give a sweep file with "
                      "--config, or a run config with --base and at least one --grid KEY=V1,V2,...");
  std::filesystem::path file;
  std::optional<nlohmann::ordered_json> generated;
  if (from_grid) {
    generated = grid_sweep(*args);
    file = (*args)["base"].as<std::string>();
  } else {
    file = required(*args, "config", "ltrain sweep");
  }
  if (flag(*args, "dry-run")) {
    if (generated) {
      const bench::SweepPlan plan = plan_grid_sweep(*generated, every_point);
      std::cout << fmt::format("--base {} --grid: mode {}, {} point(s)\n", file.string(), plan.mode, plan.points.size());
      for (size_t i = 0; i < plan.points.size(); ++i)
        std::cout << fmt::format("  point {}: {}\n", i, fmt::join(plan.points[i], " "));
      std::cout << "every point is a valid config on this machine; nothing was run\n";
    } else {
      print_sweep_plan(file, every_point);
    }
    return 0;
  }
  const std::filesystem::path out =
      args->count("out") ? std::filesystem::path((*args)["out"].as<std::string>()) : "sweeps" / file.stem();
  if (generated) {
    plan_grid_sweep(*generated, every_point);  // its errors before the results folder exists
    std::filesystem::create_directories(out);
    file = out / "sweep.json";  // the sweep, rerun as a file: ltrain sweep --config OUT/sweep.json
    write_sweep_file(file, *generated);
  }
  const bench::SweepResult result = bench::run_sweep(file, out, every_point, flag(*args, "fresh"));
  std::cout << bench::write_sweep_results(result, out);
  const auto failed = std::count_if(result.points.begin(), result.points.end(),
                                    [](const auto& point) { return !point.error.empty(); });
  const auto reused = std::count_if(result.points.begin(), result.points.end(),
                                    [](const auto& point) { return point.reused; });
  std::cout << fmt::format("{} point(s), {} failed{}; results in {} (plot: python3 scripts/report/plot_sweep.py {})\n",
                           result.points.size(), failed,
                           reused ? fmt::format(", {} reused from the earlier run (--fresh measures them again)", reused)
                                  : "",
                           out.string(), out.string());
  return failed ? static_cast<int>(ExitCode::points_failed) : 0;
}

namespace {

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
    if (size < 8 || size > config::kMaxImageSize)
      throw ConfigError(fmt::format("ltrain reproduce: --image-sizes \"{}\": expected sides from 8 to {} "
                                    "separated by commas, e.g. 32,224",
                                    config::shown(list), config::kMaxImageSize));
    sizes.push_back(size);
    start = comma + 1;
  }
  return sizes;
}

}  // namespace

cxxopts::Options reproduce_options() {
  cxxopts::Options options = command_options(
      "ltrain reproduce",
      "The GPU guides' claims (AMP speed and memory, TF32, cudnn.benchmark, CUDA graphs, gradient "
      "accumulation, activation checkpointing, the matmul test, the batch-size search, the "
      "hardware), each with its guide and line, as A/B measurements on this machine; writes "
      "REPORT.md and results.json after every measurement, and continues an unfinished report of the "
      "same settings (one cut short by Ctrl-C or a time limit).");
  options.add_options()("config", "the run config every measurement starts from", cxxopts::value<std::string>(), "FILE")(
      "out", "report folder", cxxopts::value<std::string>()->default_value("reports/reproduce"), "DIR")(
      "claims", "the claims to measure, a JSON file of the form of configs/claims/guides.json (default: that file, "
      "built into ltrain)", cxxopts::value<std::string>(), "FILE")(
      "warmup", "untimed steps per measurement", cxxopts::value<int64_t>()->default_value("10"), "N")(
      "steps", "timed steps per measurement", cxxopts::value<int64_t>()->default_value("30"), "N")(
      "rounds", "A/B rounds per claim, alternating", cxxopts::value<int64_t>()->default_value("3"), "N")(
      "image-sizes", "image sides to measure the step claims at, e.g. 32,224 (a side other than 32: random images); "
      "default: the config's data.image_size", cxxopts::value<std::string>(), "LIST")(
      "matmul-size", "matmul test's n", cxxopts::value<int64_t>()->default_value("8192"), "N")(
      "matmul-iters", "matmul test's timed products", cxxopts::value<int64_t>()->default_value("100"), "N")(
      "no-batch-search", "skip the batch-size search (the longest part on a GPU)")(
      "fresh", "measure everything again, instead of continuing an unfinished report of the same settings in --out");
  add_set_option(options);
  return options;
}

int run_reproduce(int argc, char** argv) {
  cxxopts::Options options = reproduce_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  bench::ReproduceOptions settings;
  settings.base_config = required(*args, "config", "ltrain reproduce");
  settings.overrides = overrides(*args, options.program());
  if (args->count("claims")) settings.claims_file = (*args)["claims"].as<std::string>();
  settings.warmup = (*args)["warmup"].as<int64_t>();
  settings.steps = (*args)["steps"].as<int64_t>();
  settings.rounds = (*args)["rounds"].as<int64_t>();
  if (args->count("image-sizes")) settings.image_sizes = image_sizes((*args)["image-sizes"].as<std::string>());
  settings.matmul_size = (*args)["matmul-size"].as<int64_t>();
  settings.matmul_products = (*args)["matmul-iters"].as<int64_t>();
  settings.batch_search = !flag(*args, "no-batch-search");
  settings.fresh = flag(*args, "fresh");
  if (settings.warmup < 0 || settings.steps < 1 || settings.rounds < 1 || settings.rounds > 100 ||
      settings.matmul_size < 1 || settings.matmul_products < 1)
    throw ConfigError("ltrain reproduce: --steps, --matmul-size and --matmul-iters must be >= 1, --rounds "
                      "1-100, --warmup >= 0");
  const std::filesystem::path out = (*args)["out"].as<std::string>();
  std::cout << bench::write_report(bench::reproduce(settings, out), out);
  std::cout << fmt::format("report in {}\n", (out / "REPORT.md").string());
  return 0;
}

}  // namespace ltrain::cli
