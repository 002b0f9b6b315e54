// The checks across keys of a RunConfig (validate.h), in the order a message is most useful: the
// run's names and paths first, then list lengths, the optimizer, the schedule, precision, data.
#include "validate.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ltrain::config {
namespace {

/// The longest file or folder name in a path (Linux's NAME_MAX), in bytes.
constexpr size_t kMaxNameBytes = 255;

/// Every check's failures, so that one run reports them all.
using Problems = std::vector<std::string>;

/// Adds config_error(loaded, key, message)'s line to `problems` unless `ok`.
void require(const LoadedConfig& loaded, Problems& problems, bool ok, const std::string& key,
             const std::string& message) {
  if (!ok) problems.push_back(config_error(loaded, key, message).what());
}

/// Whether `name` is usable as one folder name: not empty, not "." or "..", no '/' or '\\', no
/// control character, no space at either end (which a shell hides).
bool valid_folder_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  if (std::isspace(static_cast<unsigned char>(name.front())) || std::isspace(static_cast<unsigned char>(name.back())))
    return false;
  return std::none_of(name.begin(), name.end(), [](char c) {
    const auto byte = static_cast<unsigned char>(c);
    return c == '/' || c == '\\' || byte < 0x20 || byte == 0x7f;
  });
}

/// Whether every file or folder name in `path` is at most kMaxNameBytes long (the system refuses
/// longer ones with "File name too long").
bool names_fit(const std::string& path) {
  size_t name_start = 0;
  for (size_t at = 0; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    if (at - name_start > kMaxNameBytes) return false;
    name_start = at + 1;
  }
  return true;
}

bool valid_device(const std::string& device) {
  if (device == "auto" || device == "cpu" || device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void check_names_and_paths(const LoadedConfig& loaded, Problems& problems) {
  const RunConfig& c = loaded.config;
  require(loaded, problems, valid_folder_name(c.run.name), "run.name",
          "expected a folder name: letters, digits, spaces and punctuation, without '/' or '\\', control characters "
          "or spaces at either end, not \".\" or \"..\"");
  require(loaded, problems, c.run.name.size() <= kMaxNameBytes, "run.name",
          fmt::format("expected a folder name of at most {} bytes", kMaxNameBytes));
  require(loaded, problems, !c.run.out_dir.empty(), "run.out_dir",
          "expected the folder that holds the run folders (\".\" for the working directory)");
  require(loaded, problems, !c.data.root.empty(), "data.root",
          "expected the folder with the data set's files (\".\" for the working directory)");
  for (const auto& [key, path] : {std::pair{"run.out_dir", &c.run.out_dir}, std::pair{"data.root", &c.data.root},
                                  std::pair{"model.init_from", &c.model.init_from},
                                  std::pair{"checkpoint.resume", &c.checkpoint.resume}})
    require(loaded, problems, names_fit(*path), key,
            fmt::format("a file or folder name in this path is longer than {} bytes; use a shorter path", kMaxNameBytes));
  require(loaded, problems, valid_device(c.run.device), "run.device", "expected auto, cpu, cuda or cuda:N");
}

void check_list_lengths(const LoadedConfig& loaded, Problems& problems) {
  const RunConfig& c = loaded.config;
  require(loaded, problems, c.data.mean.size() == 3, "data.mean", "expected a list of 3 numbers (R, G, B)");
  require(loaded, problems, c.data.std.size() == 3, "data.std", "expected a list of 3 numbers (R, G, B)");
  require(loaded, problems, c.optim.betas.size() == 2, "optim.betas", "expected a list of 2 numbers (beta1, beta2)");
}

void check_optimizer_and_schedule(const LoadedConfig& loaded, Problems& problems) {
  const RunConfig& c = loaded.config;
  require(loaded, problems, !c.optim.nesterov || (c.optim.name == OptimizerKind::sgd && c.optim.momentum > 0), "optim.nesterov",
          "Nesterov momentum needs optim.name \"sgd\" and optim.momentum > 0");
  require(loaded, problems, c.schedule.name != ScheduleKind::onecycle || c.schedule.warmup_epochs == 0, "schedule.warmup_epochs",
          "the onecycle schedule has its own warm-up (schedule.pct_start); set schedule.warmup_epochs to 0");
  require(loaded, problems, c.schedule.warmup_epochs < static_cast<double>(c.run.epochs), "schedule.warmup_epochs",
          fmt::format("expected fewer epochs than run.epochs ({}); lower it, or 0 for no warm-up", c.run.epochs));
  require(loaded, problems, c.schedule.min_lr <= c.optim.lr, "schedule.min_lr",
          c.schedule.name == ScheduleKind::cosine
              ? fmt::format("expected at most optim.lr ({}): the cosine schedule falls from optim.lr to it; lower "
                            "it, or raise optim.lr",
                            c.optim.lr)
              : fmt::format("above optim.lr ({}) and without effect: only the cosine schedule ends at it, and "
                            "schedule.name is {}; remove it, or set it at most optim.lr",
                            c.optim.lr, to_string(c.schedule.name)));
  const std::vector<double>& milestones = c.schedule.milestones;
  require(loaded, problems, std::is_sorted(milestones.begin(), milestones.end()) &&
                    std::adjacent_find(milestones.begin(), milestones.end()) == milestones.end(),
          "schedule.milestones", "expected epochs in increasing order");
  require(loaded, problems, c.schedule.name != ScheduleKind::multistep || !milestones.empty(), "schedule.milestones",
          "the multistep schedule needs at least one milestone epoch");
}

void check_precision(const LoadedConfig& loaded, Problems& problems) {
  const RunConfig& c = loaded.config;
  require(loaded, problems, !(c.precision.mode == PrecisionMode::tf32 && loaded.origin.count("precision.tf32") && !c.precision.tf32),
          "precision.tf32", "precision.mode \"tf32\" means TF32 on; use precision.mode \"fp32\" for IEEE float32");
  require(loaded, problems, !(c.precision.deterministic && c.precision.cudnn_benchmark), "precision.cudnn_benchmark",
          "cuDNN autotuning picks algorithms by timing, which is not deterministic; turn off one of "
          "precision.cudnn_benchmark and precision.deterministic");
}

void check_data(const LoadedConfig& loaded, Problems& problems) {
  const RunConfig& c = loaded.config;
  // Either key at 0 turns progressive resizing off; a start size alone still needs its epochs.
  const bool progressive = c.data.progressive_start_size != 0 && c.data.progressive_epochs != 0;
  require(loaded, problems, !progressive || c.data.progressive_start_size >= kMinProgressiveSize,
          "data.progressive_start_size",
          fmt::format("expected 0 (off) or a side of at least {} pixels", kMinProgressiveSize));
  require(loaded, problems,
          c.data.progressive_start_size == 0 || c.data.progressive_epochs != 0 ||
              loaded.origin.count("data.progressive_epochs"),
          "data.progressive_epochs",
          "progressive resizing needs its number of epochs: 1 or more (0: off, as data.progressive_start_size 0)");
  require(loaded, problems, !progressive || c.data.progressive_epochs < c.run.epochs, "data.progressive_epochs",
          fmt::format("expected fewer than run.epochs ({}): at least the last epoch trains at the full side; lower "
                      "it, or set it to 0 to turn progressive resizing off",
                      c.run.epochs));
  require(loaded, problems, c.data.cifar100_labels == Cifar100Labels::fine || c.data.source == DataSource::cifar100,
          "data.cifar100_labels",
          fmt::format("coarse labels are CIFAR-100's and data.source is {}; set data.source to cifar100 or remove "
                      "data.cifar100_labels",
                      to_string(c.data.source)));
}

}  // namespace

void validate(const LoadedConfig& loaded, Problems& problems) {
  check_names_and_paths(loaded, problems);
  check_list_lengths(loaded, problems);
  check_optimizer_and_schedule(loaded, problems);
  check_precision(loaded, problems);
  check_data(loaded, problems);
}

}  // namespace ltrain::config
