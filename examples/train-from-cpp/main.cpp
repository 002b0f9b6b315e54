// Trains a ResNet through ltrain's library, as `ltrain train` does: a run config built in code (or
// read from a file), then KEY=VALUE overrides, then engine::train, which writes the run directory
// (config.json, train.log, metrics, checkpoints, summary.json) and returns the result.
//
//   train_from_cpp [CONFIG.json] [KEY=VALUE ...]     e.g. train_from_cpp run.out_dir=/tmp/runs
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/log.h"
#include "ltrain/engine/trainer.h"

int main(int argc, char** argv) {
  // A run small enough for seconds on a CPU: a narrow ResNet-18 for one epoch on random images of
  // CIFAR-10's shapes. Every key is one of `ltrain train --help`'s.
  const nlohmann::json tiny_run = {
      {"run", {{"name", "train-from-cpp"}, {"epochs", 1}}},
      {"model", {{"arch", "resnet18"}, {"stem", "cifar"}, {"width", 8}}},
      {"data",
       {{"source", "synthetic"}, {"synthetic_train_size", 256}, {"synthetic_test_size", 128}, {"batch_size", 64}}},
  };
  std::vector<std::string> overrides(argv + 1, argv + argc);
  std::string config_file;  // a first argument without '=' names a config file to train instead
  if (!overrides.empty() && overrides.front().find('=') == std::string::npos) {
    config_file = overrides.front();
    overrides.erase(overrides.begin());
  }

  ltrain::log::init_console(false);  // ltrain's log lines on stderr, as the ltrain command prints them
  try {
    const ltrain::config::LoadedConfig loaded = config_file.empty()
                                                    ? ltrain::config::load_json(tiny_run, "train_from_cpp", overrides)
                                                    : ltrain::config::load_file(config_file, overrides);
    const ltrain::engine::TrainResult result = ltrain::engine::train(loaded);
    std::cout << "run " << result.run_dir.string() << ": " << result.epochs << " epoch(s), " << result.steps
              << " steps, test accuracy " << result.final_test_accuracy << "\n";
    return 0;
  } catch (const ltrain::UserError& error) {  // a bad config or data file, a failed run: one line
    std::cerr << "train_from_cpp: " << error.what() << "\n";
    return static_cast<int>(error.code());
  }
}
