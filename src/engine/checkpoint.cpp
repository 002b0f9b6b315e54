#include "ltrain/engine/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/setup.h"
#include "ltrain/io/tensor_file.h"

namespace ltrain::engine {
namespace fs = std::filesystem;

namespace {
constexpr const char* kKind = "ltrain-checkpoint";
constexpr const char* kModelPrefix = "model/";
constexpr const char* kOptimizerPrefix = "optim/";
constexpr const char* kExtension = ".ltc";

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }
}  // namespace

void save_checkpoint(const fs::path& file, const torch::nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointMeta& meta) {
  io::TensorArchive archive;
  archive.info = {{"kind", kKind},
                  {"ltrain_version", LTRAIN_VERSION},
                  {"torch_version", compat::torch_version()},
                  {"created_utc", utc_now()},
                  {"epoch", meta.epoch},
                  {"step", meta.step},
                  {"config", meta.config},
                  {"metrics", meta.metrics}};
  for (const auto& [name, tensor] : state_dict(model)) archive.tensors.emplace_back(kModelPrefix + name, tensor);
  if (optimizer)
    for (const auto& [name, tensor] : optimizer->state()) archive.tensors.emplace_back(kOptimizerPrefix + name, tensor);
  io::write_archive(file, archive);
}

Checkpoint read_checkpoint(const fs::path& file) {
  io::TensorArchive archive = io::read_archive(file);
  if (archive.info.value("kind", "") != kKind || !archive.info.contains("config"))
    throw DataError(fmt::format("{}: an ltrain archive, but not a training checkpoint", file.string()));
  Checkpoint checkpoint;
  checkpoint.meta.epoch = archive.info.value("epoch", int64_t{0});
  checkpoint.meta.step = archive.info.value("step", int64_t{0});
  checkpoint.meta.config = archive.info["config"];
  checkpoint.meta.metrics = archive.info.value("metrics", nlohmann::json::object());
  for (auto& [name, tensor] : archive.tensors) {
    if (starts_with(name, kModelPrefix))
      checkpoint.model.emplace_back(name.substr(std::strlen(kModelPrefix)), std::move(tensor));
    else if (starts_with(name, kOptimizerPrefix))
      checkpoint.optimizer.emplace_back(name.substr(std::strlen(kOptimizerPrefix)), std::move(tensor));
  }
  return checkpoint;
}

std::string checkpoint_file_name(int64_t step) { return fmt::format("step-{:08d}{}", step, kExtension); }

void prune_checkpoints(const fs::path& folder, int64_t keep_last) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.is_regular_file() && entry.path().extension() == kExtension && starts_with(entry.path().filename().string(), "step-"))
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  const auto excess = static_cast<int64_t>(files.size()) - keep_last;
  for (int64_t i = 0; i < excess; ++i) fs::remove(files[static_cast<size_t>(i)]);
}

}  // namespace ltrain::engine
