#pragma once
// Training-step throughput of a config: warm-up steps, then timed steps between two device syncs.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"

namespace ltrain::bench {

struct StepBenchResult {
  std::string device;
  std::string arch;       ///< model.arch
  std::string stem;       ///< model.stem
  std::string precision;  ///< precision.mode
  bool channels_last = false;  ///< model.channels_last
  int64_t checkpoint_segments = 0;  ///< model.checkpoint_segments (0: activation checkpointing off)
  bool cuda_graph = false;          ///< cuda_graph.train: the timed steps were graph replays
  int64_t batch_size = 0;  ///< images a step: data.batch_size x optim.accumulation_steps
  int64_t steps = 0;   ///< timed steps per round
  int64_t rounds = 1;  ///< timed rounds of `steps` steps, one after another in the same run
  double seconds = 0.0;  ///< all rounds
  /// Images per second of each round, in order; images_per_second and ms_per_step are those of the
  /// rounds' median time (of an even count of rounds, the mean of the middle two).
  std::vector<double> round_images_per_second;
  double ms_per_step = 0.0;
  /// Host time to issue the timed steps, before the final sync, per step. Close to ms_per_step
  /// when the step is bound by the host (kernel launches), well below it when the GPU is the limit.
  double host_ms_per_step = 0.0;
  double images_per_second = 0.0;
  int64_t peak_memory_bytes = -1;  ///< peak allocated over the timed steps; -1 where unknown (the CPU)
  /// Peak the allocator held over the timed steps, a CUDA graph's pool included; -1 where unknown.
  int64_t peak_reserved_bytes = -1;
  double final_loss = 0.0;         ///< mean training loss over the timed steps (finite if all went well)
};

/// Steps run under the profiler when bench_steps is given a trace path (after the timed steps).
inline constexpr int64_t kProfiledSteps = 5;

/// ConfigError where `warmup` warm-up steps would time the capture of a graphed step: they must
/// exceed cuda_graph.warmup_steps, the eager steps before it. `command` names the option's owner
/// in the message ("ltrain bench step: --warmup", a sweep file's "bench.warmup").
void check_bench_warmup(const config::RunConfig& config, int64_t warmup, const std::string& command);

/// Times `steps` training steps of the config's model, data and optimizer after `warmup` steps,
/// `rounds` times over (each round between two device syncs, so that their spread shows the noise).
/// With a `profile_trace` path, kProfiledSteps more steps then run under LibTorch's profiler and
/// its Chrome trace is written there (scripts/report/trace_summary.py reads it); timing is unaffected.
StepBenchResult bench_steps(const config::LoadedConfig& loaded, int64_t warmup, int64_t steps,
                            const std::string& profile_trace = "", int64_t rounds = 1);

/// Why a step or a product failed, in ltrain's words where LibTorch's say only that an operator has
/// no kernel for a type on this device (fp16 on the CPU); LibTorch's first line otherwise.
std::string failure_text(const c10::Error& error, const c10::Device& device);

nlohmann::json to_json(const StepBenchResult& result);

/// A result as to_json wrote it (nlohmann::json's exceptions for one it did not write).
StepBenchResult step_result_from_json(const nlohmann::json& saved);

}  // namespace ltrain::bench
