#include "ltrain/bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/interrupt.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"

namespace ltrain::bench {
namespace {

/// The median of `values` (not empty); of an even count, the mean of the middle two.
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

}  // namespace

void check_bench_warmup(const config::RunConfig& config, int64_t warmup, const std::string& command) {
  if (config.cuda_graph.train && warmup <= config.cuda_graph.warmup_steps)
    throw ConfigError(fmt::format("{} {} must exceed cuda_graph.warmup_steps ({}), so that the capture is not timed",
                                  command, warmup, config.cuda_graph.warmup_steps));
}

StepBenchResult bench_steps(const config::LoadedConfig& loaded, int64_t warmup, int64_t steps,
                            const std::string& profile_trace, int64_t rounds) {
  if (steps < 1 || rounds < 1 || warmup < 0)
    throw ConfigError(fmt::format("step benchmark: {} warm-up steps, {} timed steps, {} rounds: expected warm-up >= 0, "
                                  "steps and rounds >= 1",
                                  warmup, steps, rounds));
  const config::RunConfig& config = loaded.config;
  const torch::Device device = engine::resolve_device(loaded);
  check_bench_warmup(config, warmup, "ltrain bench step: --warmup");
  if (!profile_trace.empty()) {
    // An empty profile first: a LibTorch that cannot write traces fails now, not after the timing.
    compat::start_profiler(device.is_cuda());
    compat::stop_profiler(profile_trace);
  }
  engine::Run run(loaded, engine::RunParts{});
  data::TrainLoader& loader = run.train_loader();
  run.optimizer().set_lr(config.optim.lr);
  engine::TrainStep train_step(run.model(), run.optimizer(), run.scaler(), config);

  int64_t epoch = 0;
  int64_t index = 0;
  auto run_steps = [&](int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      if (index == 0) loader.set_epoch(epoch);
      train_step.run(loader.batch(index));
      if (++index == loader.batches_per_epoch()) index = 0, ++epoch;
      // Inside a sweep (which polls SIGINT and SIGTERM), a signal stops the measurement here.
      if (interrupt::stop_requested())
        throw Interrupted(fmt::format("stopped by signal {} during a step benchmark", interrupt::stop_signal()));
    }
  };
  run_steps(warmup);
  train_step.take_totals();  // syncs: warm-up work is done before the clock starts
  compat::reset_peak_memory(device);
  std::vector<double> round_seconds, round_host_seconds;
  engine::StepTotals totals;
  double mean_loss_sum = 0.0;
  for (int64_t round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    run_steps(steps);
    round_host_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    totals = train_step.take_totals();
    round_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    mean_loss_sum += totals.mean_loss();
  }
  const int64_t peak_memory = compat::peak_memory_bytes(device);
  const int64_t peak_reserved = compat::peak_reserved_bytes(device);
  if (!profile_trace.empty()) {
    compat::start_profiler(device.is_cuda());
    run_steps(kProfiledSteps);
    train_step.take_totals();  // syncs: the profiled kernels are done
    compat::stop_profiler(profile_trace);
  }

  StepBenchResult result;
  result.device = device.str();
  result.arch = config::to_string(config.model.arch);
  result.stem = config::to_string(config.model.stem);
  result.precision = config::to_string(config.precision.mode);
  result.channels_last = config.model.channels_last;
  result.checkpoint_segments = config.model.checkpoint_segments;
  result.cuda_graph = train_step.graphed();
  result.batch_size = loader.images_per_step();
  result.steps = steps;
  result.rounds = rounds;
  const auto images = static_cast<double>(steps * loader.images_per_step());
  for (const double seconds : round_seconds) {
    result.seconds += seconds;
    result.round_images_per_second.push_back(images / seconds);
  }
  // The median round's time (of an even count, the mean of the middle two): one slow round does
  // not move it, and two rounds give their mean, not the slower one.
  const double median_seconds = median(round_seconds);
  result.ms_per_step = 1e3 * median_seconds / static_cast<double>(steps);
  result.host_ms_per_step = 1e3 * median(round_host_seconds) / static_cast<double>(steps);
  result.images_per_second = images / median_seconds;
  result.peak_memory_bytes = peak_memory;
  result.peak_reserved_bytes = peak_reserved;
  result.final_loss = mean_loss_sum / static_cast<double>(rounds);
  return result;
}

std::string failure_text(const c10::Error& error, const c10::Device& device) {
  const std::string text = error.what();
  static const std::vector<std::pair<std::string, std::string>> types{{"'Half'", "fp16"}, {"'BFloat16'", "bf16"}};
  if (text.find("not implemented for") != std::string::npos)
    for (const auto& [spelled, name] : types)
      if (text.find(spelled) != std::string::npos)
        return fmt::format("LibTorch {} has no {} kernel for this operation on {}{}", compat::torch_version(), name,
                           device.is_cuda() ? device.str() : "the CPU",
                           device.is_cuda() ? "" : fmt::format("; {} is measured on a CUDA device", name));
  return compat::failure_summary(error);
}

nlohmann::json to_json(const StepBenchResult& r) {
  return {{"device", r.device},
          {"arch", r.arch},
          {"stem", r.stem},
          {"precision", r.precision},
          {"channels_last", r.channels_last},
          {"checkpoint_segments", r.checkpoint_segments},
          {"cuda_graph", r.cuda_graph},
          {"mode", r.cuda_graph ? "graph" : "eager"},
          {"batch_size", r.batch_size},
          {"steps", r.steps},
          {"rounds", r.rounds},
          {"round_images_per_second", r.round_images_per_second},
          {"seconds", r.seconds},
          {"ms_per_step", r.ms_per_step},
          {"host_ms_per_step", r.host_ms_per_step},
          {"images_per_second", r.images_per_second},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"final_loss", r.final_loss}};
}

StepBenchResult step_result_from_json(const nlohmann::json& saved) {
  StepBenchResult r;
  r.device = saved.at("device").get<std::string>();
  r.arch = saved.at("arch").get<std::string>();
  r.stem = saved.at("stem").get<std::string>();
  r.precision = saved.at("precision").get<std::string>();
  r.channels_last = saved.at("channels_last").get<bool>();
  r.checkpoint_segments = saved.at("checkpoint_segments").get<int64_t>();
  r.cuda_graph = saved.at("cuda_graph").get<bool>();
  r.batch_size = saved.at("batch_size").get<int64_t>();
  r.steps = saved.at("steps").get<int64_t>();
  r.rounds = saved.value("rounds", int64_t{1});
  r.round_images_per_second = saved.value("round_images_per_second", std::vector<double>{});
  r.seconds = saved.at("seconds").get<double>();
  r.ms_per_step = saved.at("ms_per_step").get<double>();
  r.host_ms_per_step = saved.at("host_ms_per_step").get<double>();
  r.images_per_second = saved.at("images_per_second").get<double>();
  r.peak_memory_bytes = saved.at("peak_memory_bytes").get<int64_t>();
  r.peak_reserved_bytes = saved.at("peak_reserved_bytes").get<int64_t>();
  r.final_loss = saved.at("final_loss").get<double>();
  return r;
}

}  // namespace ltrain::bench
