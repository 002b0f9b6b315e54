#include "ltrain/bench/step_bench.h"

#include <chrono>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/train_step.h"

namespace ltrain::bench {

StepBenchResult bench_steps(const config::LoadedConfig& loaded, int64_t warmup, int64_t steps,
                            const std::string& profile_trace) {
  const config::RunConfig& config = loaded.config;
  const torch::Device device = engine::resolve_device(loaded);
  if (config.cuda_graph.train && warmup <= config.cuda_graph.warmup_steps)
    throw ConfigError(fmt::format("ltrain bench step: --warmup {} must exceed cuda_graph.warmup_steps ({}), so that "
                                  "the capture is not timed",
                                  warmup, config.cuda_graph.warmup_steps));
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
    }
  };
  run_steps(warmup);
  train_step.take_totals();  // syncs: warm-up work is done before the clock starts
  compat::reset_peak_memory(device);
  const auto start = std::chrono::steady_clock::now();
  run_steps(steps);
  const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const engine::StepTotals totals = train_step.take_totals();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
  result.batch_size = loader.batch_size();
  result.steps = steps;
  result.seconds = seconds;
  result.ms_per_step = 1e3 * seconds / static_cast<double>(steps);
  result.host_ms_per_step = 1e3 * host_seconds / static_cast<double>(steps);
  result.images_per_second = static_cast<double>(steps * loader.batch_size()) / seconds;
  result.peak_memory_bytes = peak_memory;
  result.peak_reserved_bytes = peak_reserved;
  result.final_loss = totals.mean_loss();
  return result;
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
          {"seconds", r.seconds},
          {"ms_per_step", r.ms_per_step},
          {"host_ms_per_step", r.host_ms_per_step},
          {"images_per_second", r.images_per_second},
          {"peak_memory_bytes", r.peak_memory_bytes},
          {"peak_reserved_bytes", r.peak_reserved_bytes},
          {"final_loss", r.final_loss}};
}

}  // namespace ltrain::bench
