#pragma once
// Helpers shared by the test suites.
#include <sys/types.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/config/load.h"
#include "ltrain/data/loader.h"
#include "ltrain/device/limits.h"
#include "ltrain/kernels/device_fit.h"

namespace ltrain::testing {

/// The real CIFAR-10 subset (cifar10-mini) if present: $LTRAIN_CIFAR_MINI, else data/cifar10-mini
/// in the source tree, else ../shared/data/cifar10-mini beside it.
std::optional<std::filesystem::path> cifar_mini_root();

/// A fresh empty directory under the system temp folder, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Sets cuDNN's deterministic flag (what precision.deterministic sets, and what turns ltrain's
/// BatchNorm kernels off) and its benchmark flag for a scope, and restores both after: the tests of
/// one process share LibTorch's global context.
class CudnnFlags {
 public:
  CudnnFlags(bool deterministic, bool benchmark)
      : saved_deterministic_(at::globalContext().deterministicCuDNN()),
        saved_benchmark_(at::globalContext().benchmarkCuDNN()) {
    at::globalContext().setDeterministicCuDNN(deterministic);
    at::globalContext().setBenchmarkCuDNN(benchmark);
  }
  ~CudnnFlags() {
    at::globalContext().setDeterministicCuDNN(saved_deterministic_);
    at::globalContext().setBenchmarkCuDNN(saved_benchmark_);
  }
  CudnnFlags(const CudnnFlags&) = delete;
  CudnnFlags& operator=(const CudnnFlags&) = delete;

 private:
  bool saved_deterministic_;
  bool saved_benchmark_;
};

/// Removes `root` and everything below it, as std::filesystem::remove_all would. POSIX nftw: the
/// pip torch (2.5+) exports its own statically linked libstdc++ filesystem symbols, and remove_all
/// crashes in test processes linked against it.
void remove_tree(const std::filesystem::path& root);

/// Files with `extension` (".json") anywhere below `root`, sorted. (POSIX nftw: see remove_tree.)
std::vector<std::filesystem::path> files_below(const std::filesystem::path& root, const std::string& extension);

/// A config made of the defaults, then `overrides`, then `extra` (each "key=value", as --set).
config::LoadedConfig config_from(std::vector<std::string> overrides, const std::vector<std::string>& extra = {});

/// Writes `text` to `path` (creating parent folders).
void write_file(const std::filesystem::path& path, const std::string& text);

/// A record of CIFAR-100's binary release: the coarse and the fine label byte, then the R, G, B
/// planes (row-major 32x32), pixel (c, y, x) = (record * 31 + c * 101 + y * 7 + x * 3) % 256.
std::string cifar100_record(int record, int coarse, int fine);
/// Record `record`'s fine label in the files write_cifar100_files writes: record % 100 (its coarse
/// label: fine / 5).
int cifar100_fine_label(int record);
/// ROOT/train.bin with `train` records (numbered 0 to train - 1) and ROOT/test.bin with `test`
/// (numbered on from train), labelled as cifar100_fine_label says.
void write_cifar100_files(const std::filesystem::path& root, int train, int test);

/// Runs the ltrain executable with `args` (shell words), returns its exit code; output goes to `log`.
int run_ltrain(const std::string& args, const std::filesystem::path& log);

/// run_ltrain under `timeout SECONDS`: the exit code, 124 when it had to be stopped, -1 when it
/// died of a signal.
int run_ltrain_within(int seconds, const std::string& args, const std::filesystem::path& log);

/// A Python that imports every one of `modules` (comma-separated, as `import` takes them): the first
/// of $LTRAIN_PYTHON, the project's environment's ($LTRAIN_VENV, default .venv/, made by
/// scripts/python-env.sh), Debian's /usr/bin/python3 and the python3 on the PATH that does; nullopt if
/// none does.
std::optional<std::string> python_with_modules(const std::string& modules);

/// True when a missing Python package fails the PyTorch-side checks instead of skipping them
/// (LTRAIN_REQUIRE_PYTHON_CHECKS=1, as CI sets it).
bool python_checks_required();

/// Runs scripts/report/NAME with `args` (shell words) under `python`; exit code, output to `log`.
int run_plot_script(const std::string& python, const std::string& name, const std::string& args,
                    const std::filesystem::path& log);

/// Reads a whole file.
std::string read_file(const std::filesystem::path& path);

/// The ltrain executable running as a child process, its stdout and stderr collected through a
/// pipe or through a pseudo-terminal that is its controlling terminal (as in an interactive shell:
/// Ctrl-C typed there goes to the terminal's foreground process group). Killed (SIGKILL, its
/// process group too) and reaped when the object dies.
class LtrainProcess {
 public:
  enum class Output { pipe, terminal };
  /// Starts `ltrain ARGS...`; `before_exec`, if given, runs in the child before exec (it may only
  /// make async-signal-safe calls).
  explicit LtrainProcess(const std::vector<std::string>& args, Output output = Output::pipe,
                         void (*before_exec)() = nullptr);
  ~LtrainProcess();
  LtrainProcess(const LtrainProcess&) = delete;
  LtrainProcess& operator=(const LtrainProcess&) = delete;

  pid_t pid() const { return pid_; }
  /// Everything it wrote so far.
  std::string output() const;
  /// Writes `text` to the terminal, as typed (Output::terminal only): "\x03" is Ctrl-C.
  void type(const std::string& text);
  /// True once it runs ltrain (exec done): the launcher, or the ltrain-core it runs (whose dynamic
  /// loader may still be at work).
  bool runs_ltrain() const;
  /// True once its SIGTERM handler is installed (from /proc/PID/status): before the shared
  /// libraries' initializers, long before main().
  bool catches_sigterm() const;
  /// True while SIGTERM is blocked in it (from /proc/PID/status): the ltrain launcher blocks it
  /// from its first instruction until ltrain-core's handler is installed.
  bool blocks_sigterm() const;
  /// Waits up to `seconds` for it to end: its exit code, 128 + N after signal N, -1 on a timeout.
  int wait(double seconds);

 private:
  void collect();
  pid_t pid_ = -1;
  int reader_ = -1;  // the pipe's read end or the terminal's master side
  std::optional<int> status_;  // waitpid's status once it ended
  std::atomic<bool> exited_{false};
  mutable std::mutex mutex_;
  std::string output_;
  std::atomic<bool> stop_reading_{false};
  std::atomic<bool> drained_{false};  // the collector has read everything and stopped
  std::thread collector_;
};

/// The GPU tests' small model: ResNet-18 of width 16 with the cifar stem on cuda, batch 32, lr 0.05,
/// then `extra` overrides.
config::LoadedConfig gpu_config(const std::vector<std::string>& extra);

/// A seeded batch of `size` images [size,3,32,32] float32 and labels [size] int64 on the GPU.
data::Batch gpu_batch(int64_t size, uint64_t seed);

/// Trains `loaded`'s model `steps` steps on one fixed GPU batch; returns each step's mean loss.
std::vector<double> train_fixed_batch(const config::LoadedConfig& loaded, int steps);

/// The largest of ||a_i - b_i|| / ||b_i|| over the pairs.
double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b);

/// Waits up to `seconds` for `condition()` to hold, checking every 20 ms; its last value.
bool wait_until(const std::function<bool()>& condition, double seconds);

/// An H200 as the driver describes it, for the tests of plans made from a device's limits.
device::DeviceLimits h200_limits();

}  // namespace ltrain::testing

/// Skips a *_CUDA test on machines without a usable GPU.
#define LTRAIN_REQUIRE_CUDA()                                                          \
  do {                                                                                 \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

/// Skips a test of ltrain's own kernels where they do not run (no GPU, or a build without an image
/// for this one), saying why: the model and the optimizer then take LibTorch's paths, which other
/// tests cover. `fit_expression`: a device::KernelFit.
#define LTRAIN_REQUIRE_KERNELS(fit_expression)                                              \
  do {                                                                                      \
    LTRAIN_REQUIRE_CUDA();                                                                  \
    const ::ltrain::device::KernelFit fit_here = (fit_expression);                         \
    if (!fit_here.runs) GTEST_SKIP() << "the kernels do not run here: " << fit_here.reason; \
  } while (false)

/// Declares `python_var`, a Python that imports `modules` (python_with_modules), or skips the test
/// saying what to install; under python_checks_required() a missing package fails the test instead.
#define LTRAIN_REQUIRE_PYTHON(python_var, modules)                                                      \
  const std::optional<std::string> python_var##_optional = ::ltrain::testing::python_with_modules(modules); \
  if (!python_var##_optional) {                                                                      \
    const std::string python_var##_missing = std::string("no Python here imports ") + (modules) +          \
                                             " (bash scripts/python-env.sh makes .venv/ with them)";     \
    if (::ltrain::testing::python_checks_required()) FAIL() << python_var##_missing;                   \
    GTEST_SKIP() << python_var##_missing;                                                            \
  }                                                                                                  \
  const std::string python_var = *python_var##_optional

/// Skips a test that needs cifar10-mini when it is absent, saying so.
#define LTRAIN_REQUIRE_CIFAR_MINI(root_var)                                                       \
  auto root_var##_optional = ::ltrain::testing::cifar_mini_root();                                \
  if (!root_var##_optional) GTEST_SKIP() << "cifar10-mini not found (set LTRAIN_CIFAR_MINI): skipped"; \
  const std::filesystem::path root_var = *root_var##_optional
