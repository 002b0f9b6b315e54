// ltrain train, eval, export and config: a run, its checkpoints and its config format.
#include "commands.h"

#include <filesystem>
#include <iostream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/log.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/lr_finder.h"
#include "ltrain/engine/saved_model.h"
#include "ltrain/engine/trainer.h"

namespace ltrain::cli {
namespace {

/// Refuses --out before any work is done: a path that is no regular file (a device, a FIFO, a
/// folder), since writing replaces it with a new file, or a file that exists, without --force.
void check_output_file(const cxxopts::ParseResult& args, const std::string& program, const std::string& kind) {
  const std::string out = args["out"].as<std::string>();
  if (const std::string problem = files::not_writable_as_regular_file(out); !problem.empty())
    throw ConfigError(fmt::format("{} --out {}: {}; give the path of a new or regular file ({})", program, out,
                                  problem, kind));
  if (std::filesystem::exists(out) && !flag(args, "force"))
    throw OutputExists(
        fmt::format("{} --out {}: the file exists; add --force to replace it, or give another --out", program, out));
}

/// --checkpoint as given, or for a run folder (RUN_DIR, or its checkpoints/ folder) the checkpoint
/// it stands for, as Lightning's ckpt_path "best" and "last" do: best.ltc where the run keeps one
/// (checkpoint.best_metric), else its newest valid step-*.ltc (as checkpoint.resume=auto finds
/// it), named in a line. DataError for a folder without either.
std::string checkpoint_argument(const std::string& given) {
  namespace fs = std::filesystem;
  std::error_code not_a_folder;
  if (!fs::is_directory(given, not_a_folder)) return given;
  fs::path folder = given;
  if (fs::is_directory(folder / "checkpoints", not_a_folder)) folder /= "checkpoints";
  const fs::path best = folder / engine::kBestCheckpointName;
  if (fs::is_regular_file(best, not_a_folder)) {
    spdlog::info("{}: its best checkpoint, {} (--checkpoint FILE takes another)", given, best.string());
    return best.string();
  }
  if (const std::optional<engine::FoundCheckpoint> found = engine::newest_valid_checkpoint(folder)) {
    spdlog::info("{}: its newest checkpoint, {} (--checkpoint FILE takes another)", given, found->file.string());
    return found->file.string();
  }
  throw DataError(fmt::format("{}: a folder without a checkpoint ({} holds no {} and no valid step-*.ltc): give a "
                              "run folder with checkpoints, or a checkpoint file",
                              given, folder.string(), engine::kBestCheckpointName));
}

}  // namespace

cxxopts::Options train_options() {
  cxxopts::Options options = command_options("ltrain train", "Train a model from a JSON run config.");
  options.add_options()("config",
                        "run config (JSON); repeatable: the files merge in order, a later one's keys over an "
                        "earlier one's",
                        cxxopts::value<std::string>(), "FILE")(
      "print-config", "print the resolved config (every key, JSON) and exit")(
      "dry-run", "check the config, the data, the model and the device as a run would, print one summary line and "
                 "exit; writes nothing")(
      "json", "log as JSON objects on stdout, one a line, in place of text on stderr (progress lines with step, "
              "loss, lr; README: JSON log)");
  add_set_option(options);
  return options;
}

int run_train(int argc, char** argv) {
  cxxopts::Options options = train_options();
  const auto args = parse(options, argc, argv,
                          "\nConfig keys (JSON key == --set key == bare KEY=VALUE):\n" + config::describe_keys());
  if (!args) return 0;
  if (flag(*args, "json")) log::use_json_console();
  // What this machine cannot run is named with the config's own problems, all in one run (the
  // printed config is the config, wherever it would run).
  const bool print_config = flag(*args, "print-config");
  const auto loaded =
      config::load_files(config_files(*args, options.program()), overrides(*args, options.program()),
                         print_config ? config::MoreChecks{} : config::MoreChecks(engine::check_device_support));
  if (print_config) {
    std::cout << config::to_json(loaded.config).dump(2) << "\n";
    return 0;
  }
  if (flag(*args, "dry-run")) {
    const engine::RunPlan plan = engine::plan_run(loaded);
    std::cout << "dry run: " << engine::to_text(loaded.config, plan) << "; nothing was written\n";
    return 0;
  }
  engine::train(loaded);
  return 0;
}

cxxopts::Options lr_find_options() {
  const engine::LrFindOptions defaults;
  cxxopts::Options options = command_options(
      "ltrain lr-find",
      "Learning-rate range test (Leslie Smith's): train from the config's start for --steps steps, the learning "
      "rate rising exponentially from --start-lr to --end-lr, and print the loss at each rate and the suggested "
      "rate (where the smoothed loss falls fastest). Ends early once the loss diverges; the trained weights are "
      "thrown away.");
  options.add_options()("config", "run config (JSON); repeatable, as for ltrain train", cxxopts::value<std::string>(),
                        "FILE")("steps", "steps of the ramp",
                                cxxopts::value<int64_t>()->default_value(std::to_string(defaults.steps)), "N")(
      "start-lr", "learning rate of the first step", cxxopts::value<double>()->default_value("1e-7"), "LR")(
      "end-lr", "learning rate of the last step", cxxopts::value<double>()->default_value("10"), "LR")(
      "out", "also write step,lr,loss,smoothed_loss as CSV to this file", cxxopts::value<std::string>(), "FILE")(
      "force", "replace --out when it exists (otherwise exit code 6 and nothing run)");
  add_set_option(options);
  return options;
}

int run_lr_find(int argc, char** argv) {
  cxxopts::Options options = lr_find_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  if (args->count("out")) check_output_file(*args, options.program(), ".csv");
  engine::LrFindOptions find;
  find.steps = (*args)["steps"].as<int64_t>();
  find.start_lr = (*args)["start-lr"].as<double>();
  find.end_lr = (*args)["end-lr"].as<double>();
  const auto loaded =
      config::load_files(config_files(*args, options.program()), overrides(*args, options.program()));
  const engine::LrFindResult result = engine::find_lr(loaded, find);
  std::string table = fmt::format("{:>5}  {:>10}  {:>10}  {:>10}\n", "step", "lr", "loss", "smoothed");
  std::string csv = "step,lr,loss,smoothed_loss\n";
  for (const engine::LrFindPoint& point : result.points) {
    table += fmt::format("{:>5}  {:>10.4g}  {:>10.4f}  {:>10.4f}\n", point.step, point.lr, point.loss,
                         point.smoothed_loss);
    csv += fmt::format("{},{:.17g},{:.17g},{:.17g}\n", point.step, point.lr, point.loss, point.smoothed_loss);
  }
  std::cout << table;
  if (result.diverged)
    std::cout << fmt::format("the loss diverged at step {}: the test ended there\n", result.points.size() + 1);
  std::cout << fmt::format("suggested lr: {:.3g} (steepest fall of the smoothed loss; lowest at lr {:.3g}): "
                           "--set optim.lr={:.3g}\n",
                           result.suggested_lr, result.lowest_loss_lr, result.suggested_lr);
  if (args->count("out")) {
    const std::string out = (*args)["out"].as<std::string>();
    files::write_atomically(out, {{csv.data(), csv.size()}});
    std::cout << fmt::format("wrote {}\n", out);
  }
  return 0;
}

cxxopts::Options eval_options() {
  cxxopts::Options options =
      command_options("ltrain eval", "Evaluate a checkpoint on the test set (its saved config, with overrides).");
  options.add_options()("checkpoint",
                        "checkpoint file (.ltc), or a run folder: its best.ltc, else its newest checkpoint",
                        cxxopts::value<std::string>(), "FILE|RUN_DIR")(
      "json", "print the result as JSON on stdout");
  add_set_option(options);
  return options;
}

int run_eval(int argc, char** argv) {
  cxxopts::Options options = eval_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string path = checkpoint_argument(required(*args, "checkpoint", "ltrain eval"));
  const engine::CheckpointEvaluation evaluation =
      engine::evaluate_checkpoint(path, overrides(*args, options.program()));
  const engine::EvalResult& result = evaluation.result;
  if (flag(*args, "json")) {
    std::cout << nlohmann::json{{"checkpoint", path},
                                {"step", evaluation.step},
                                {"data", config::data_summary(evaluation.data)},
                                {"accuracy", result.accuracy},
                                {"loss", result.loss},
                                {"correct", result.correct},
                                {"images", result.images}}
                     .dump()
              << "\n";
  } else {
    std::cout << fmt::format("{} (step {}): test accuracy {:.2f}% ({}/{}) on {} ({} classes), loss {:.4f}\n", path,
                             evaluation.step, 100.0 * result.accuracy, result.correct, result.images,
                             config::to_string(evaluation.data.source), evaluation.data.classes(), result.loss);
  }
  return 0;
}

cxxopts::Options export_options() {
  cxxopts::Options options = command_options("ltrain export",
                                             "Write a checkpoint's model weights (the averaged ones with "
                                             "optim.ema_decay) as safetensors with torchvision's names.");
  options.add_options()("checkpoint",
                        "checkpoint file (.ltc), or a run folder: its best.ltc, else its newest checkpoint",
                        cxxopts::value<std::string>(), "FILE|RUN_DIR")(
      "out", "output file (.safetensors)", cxxopts::value<std::string>(), "FILE")(
      "force", "replace --out when it exists (otherwise exit code 6 and nothing written)");
  return options;
}

int run_export(int argc, char** argv) {
  cxxopts::Options options = export_options();
  const auto args = parse(options, argc, argv);
  if (!args) return 0;
  const std::string given = required(*args, "checkpoint", "ltrain export");
  const std::string out = required(*args, "out", "ltrain export");
  check_output_file(*args, options.program(), ".safetensors");
  const std::string path = checkpoint_argument(given);
  std::error_code error;
  if (std::filesystem::equivalent(path, out, error))
    throw ConfigError(fmt::format("ltrain export --out {}: that is the checkpoint it reads; give another --out", out));
  const size_t tensors = engine::export_weights(path, out);
  std::cout << fmt::format("wrote {} ({} tensors)\n", out, tensors);
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
  if (!flag(*args, "schema")) throw ConfigError("ltrain config needs --schema; see ltrain config --help");
  std::cout << config::json_schema().dump(2) << "\n";
  return 0;
}

}  // namespace ltrain::cli
