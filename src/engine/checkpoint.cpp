#include "ltrain/engine/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/io/tensor_file.h"

namespace ltrain::engine {
namespace fs = std::filesystem;

namespace {
constexpr const char* kKind = "ltrain-checkpoint";
constexpr const char* kModelPrefix = "model/";
constexpr const char* kOptimizerPrefix = "optim/";
constexpr const char* kScalerPrefix = "scaler/";
constexpr const char* kEmaPrefix = "ema/";
constexpr const char* kRngPrefix = "rng/";
constexpr const char* kExtension = ".ltc";
constexpr const char* kCpuRng = "cpu";

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

/// A saved random generator state must have the live one's form (bytes, as many): LibTorch's
/// set_state would refuse anything else with an error of its own.
void check_rng_state(const torch::Tensor& saved, const torch::Tensor& live, const std::string& generator,
                     const fs::path& file) {
  if (saved.scalar_type() == live.scalar_type() && saved.dim() == 1 && saved.numel() == live.numel()) return;
  throw DataError(fmt::format("{}: its {} random generator state is malformed ({} {} values, where this build keeps "
                              "{}); use an earlier checkpoint",
                              file.string(), generator, saved.numel(), c10::toString(saved.scalar_type()),
                              live.numel()));
}

/// A checkpoint's header (its "info" object) as ltrain writes it: counters are integers of 0 or
/// more, the config an object of sections, metrics and progress objects of plain values. The
/// checksum only proves that the bytes are as written; this proves they are what ltrain wrote.
void check_header_types(const nlohmann::json& info, const fs::path& file) {
  auto malformed = [&](const std::string& what) {
    return DataError(
        fmt::format("{}: checkpoint header is malformed ({}); use an earlier checkpoint", file.string(), what));
  };
  for (const char* key : {"checkpoint_version", "epoch", "step", "epoch_steps_done"})
    if (info.contains(key) && !info[key].is_number_unsigned()) throw malformed(fmt::format("\"{}\" is no count", key));
  const nlohmann::json& config = info["config"];
  if (!config.is_object()) throw malformed("\"config\" is no object");
  for (const auto& [section, keys] : config.items())
    if (!keys.is_object()) throw malformed(fmt::format("config section \"{}\" is no object", section));
  for (const char* key : {"metrics", "progress"}) {
    if (!info.contains(key)) continue;
    if (!info[key].is_object()) throw malformed(fmt::format("\"{}\" is no object", key));
    for (const auto& [name, value] : info[key].items())
      if (value.is_structured()) throw malformed(fmt::format("{}.{} is no plain value", key, name));
  }
}

std::vector<fs::path> step_checkpoints(const fs::path& folder) {
  std::vector<fs::path> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(folder, error))
    if (entry.is_regular_file() && entry.path().extension() == kExtension && starts_with(entry.path().filename().string(), "step-"))
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());  // zero-padded step numbers: oldest first
  return files;
}
}  // namespace

void save_checkpoint(const fs::path& file, const torch::nn::Module& model, const optim::Optimizer* optimizer,
                     const amp::GradScaler* scaler, const CheckpointMeta& meta,
                     const NamedTensors& ema_weights) {
  io::TensorArchive archive;
  archive.info = {{"kind", kKind},
                  {"checkpoint_version", kCheckpointVersion},
                  {"ltrain_version", LTRAIN_VERSION},
                  {"torch_version", compat::torch_version()},
                  {"created_utc", utc_now()},
                  {"epoch", meta.epoch},
                  {"step", meta.step},
                  {"epoch_steps_done", meta.epoch_steps_done},
                  {"config", meta.config},
                  {"metrics", meta.metrics},
                  {"progress", meta.progress}};
  const NamedTensors weights = state_dict(model);
  for (const auto& [name, tensor] : weights) archive.tensors.emplace_back(kModelPrefix + name, tensor);
  if (optimizer)
    for (const auto& [name, tensor] : optimizer->state()) archive.tensors.emplace_back(kOptimizerPrefix + name, tensor);
  if (scaler && scaler->enabled())
    for (const auto& [name, tensor] : scaler->state()) archive.tensors.emplace_back(kScalerPrefix + name, tensor);
  for (const auto& [name, tensor] : ema_weights) archive.tensors.emplace_back(kEmaPrefix + name, tensor);
  archive.tensors.emplace_back(std::string(kRngPrefix) + kCpuRng, compat::cpu_rng_state());
  if (!weights.empty() && weights.front().second.is_cuda()) {
    const torch::Device device = weights.front().second.device();
    archive.tensors.emplace_back(kRngPrefix + device.str(), compat::cuda_rng_state(device.index()));
  }
  io::write_archive(file, archive);
}

Checkpoint read_checkpoint(const fs::path& file) {
  if (const std::string problem = files::not_a_regular_file(file); !problem.empty())
    throw DataError(fmt::format("{}: {}; give the path of a checkpoint file (RUN/checkpoints/step-N.ltc)", file.string(),
                                problem));
  io::TensorArchive archive = io::read_archive(file);
  const nlohmann::json& info = archive.info;
  if (!info.is_object() || info.value("kind", nlohmann::json()) != kKind || !info.contains("config"))
    throw DataError(fmt::format("{}: an ltrain archive, but not a training checkpoint", file.string()));
  check_header_types(info, file);
  Checkpoint checkpoint;
  CheckpointMeta& meta = checkpoint.meta;
  meta.version = info.value("checkpoint_version", int64_t{1});
  meta.epoch = info.value("epoch", int64_t{0});
  meta.step = info.value("step", int64_t{0});
  meta.epoch_steps_done = info.value("epoch_steps_done", int64_t{0});
  meta.config = info["config"];
  meta.metrics = info.value("metrics", nlohmann::json::object());
  meta.progress = info.value("progress", nlohmann::json::object());
  const std::vector<std::pair<const char*, NamedTensors*>> sections{{kModelPrefix, &checkpoint.model},
                                                                           {kOptimizerPrefix, &checkpoint.optimizer},
                                                                           {kScalerPrefix, &checkpoint.scaler},
                                                                           {kRngPrefix, &checkpoint.rng},
                                                                           {kEmaPrefix, &checkpoint.ema_weights}};
  for (auto& [name, tensor] : archive.tensors)
    for (const auto& [prefix, target] : sections)
      if (starts_with(name, prefix)) target->emplace_back(name.substr(std::strlen(prefix)), std::move(tensor));
  return checkpoint;
}

const NamedTensors& evaluation_weights(const Checkpoint& checkpoint) {
  return checkpoint.ema_weights.empty() ? checkpoint.model : checkpoint.ema_weights;
}

void check_resumable(const Checkpoint& checkpoint, const config::RunConfig& config, const fs::path& file) {
  if (checkpoint.meta.version < 2)
    throw DataError(fmt::format("{}: written by an earlier ltrain without the training state a resume needs; "
                                "evaluate or export it, or start a new run (checkpoint.resume \"none\")",
                                file.string()));
  const nlohmann::json saved = checkpoint.meta.config.value("model", nlohmann::json::object());
  const nlohmann::json wanted = config::to_json(config)["model"];
  for (const char* key : {"arch", "stem", "width", "num_classes"}) {
    if (saved.value(key, nlohmann::json()) == wanted[key]) continue;
    throw DataError(fmt::format("{}: its model has model.{} = {} but this config says {}: resume with the same model "
                                "settings, or start a new run (checkpoint.resume \"none\")",
                                file.string(), key, saved.value(key, nlohmann::json()).dump(), wanted[key].dump()));
  }
}

void restore_training_state(const Checkpoint& checkpoint, const fs::path& file, torch::nn::Module& model,
                            optim::Optimizer& optimizer, amp::GradScaler& scaler) {
  load_state_dict(model, checkpoint.model, file.string());
  try {
    optimizer.load_state(checkpoint.optimizer);
    if (scaler.enabled()) scaler.load_state(checkpoint.scaler);
  } catch (const DataError& error) {
    throw DataError(fmt::format("{}: {}", file.string(), error.what()));
  }
  const torch::Tensor* cpu = find_tensor(checkpoint.rng, kCpuRng);
  if (!cpu) throw DataError(fmt::format("{}: has no CPU random generator state", file.string()));
  check_rng_state(*cpu, compat::cpu_rng_state(), kCpuRng, file);
  compat::set_cpu_rng_state(*cpu);
  const NamedTensors weights = state_dict(model);
  if (!weights.empty() && weights.front().second.is_cuda()) {
    const torch::Device device = weights.front().second.device();
    // A checkpoint from the CPU or another GPU index leaves this GPU's generator as seeded.
    if (const torch::Tensor* cuda = find_tensor(checkpoint.rng, device.str())) {
      check_rng_state(*cuda, compat::cuda_rng_state(device.index()), device.str(), file);
      compat::set_cuda_rng_state(device.index(), *cuda);
    }
  }
}

std::optional<FoundCheckpoint> newest_valid_checkpoint(const fs::path& folder) {
  std::vector<fs::path> files = step_checkpoints(folder);
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    try {
      Checkpoint checkpoint = read_checkpoint(*it);
      if (checkpoint.meta.version < 2) {
        spdlog::warn("{}: written by an earlier ltrain without the training state; trying the one before", it->string());
        continue;
      }
      return FoundCheckpoint{*it, std::move(checkpoint)};
    } catch (const DataError& error) {
      spdlog::warn("{}; trying the one before", error.what());
    }
  }
  return std::nullopt;
}

std::string checkpoint_file_name(int64_t step) { return fmt::format("step-{:08d}{}", step, kExtension); }

void prune_checkpoints(const fs::path& folder, int64_t keep_last) {
  const std::vector<fs::path> files = step_checkpoints(folder);
  const auto excess = static_cast<int64_t>(files.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) fs::remove(files[static_cast<size_t>(i)]);
}

}  // namespace ltrain::engine
