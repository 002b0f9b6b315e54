#include "support.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "ltrain/amp/grad_scaler.h"
#include "ltrain/amp/precision.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/models/resnet.h"
#include "ltrain/optim/optimizer.h"

namespace ltrain::testing {

std::optional<std::filesystem::path> cifar_mini_root() {
  if (const char* env = std::getenv("LTRAIN_CIFAR_MINI"); env && *env) {
    if (std::filesystem::exists(std::filesystem::path(env) / "test_batch.bin")) return std::filesystem::path(env);
    return std::nullopt;
  }
  const std::filesystem::path source(LTRAIN_SOURCE_DIR);
  for (const auto& candidate : {source / "data" / "cifar10-mini", source / ".." / "shared" / "data" / "cifar10-mini"})
    if (std::filesystem::exists(candidate / "test_batch.bin")) return candidate.lexically_normal();
  return std::nullopt;
}

TempDir::TempDir() {
  // mkdtemp creates a unique folder atomically. (std::random_device crashed in test processes
  // linked against the pip torch wheel on the GPU host, so it is not used here.)
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/ltrain-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("TempDir: mkdtemp failed for " + pattern);
  path_ = pattern;
}

namespace {
// nftw's callbacks cannot capture: the listing in progress (the tests run on one thread).
std::vector<std::filesystem::path>* listing = nullptr;
const std::string* listing_extension = nullptr;

int add_if_wanted(const char* file, const struct stat*, int type, struct FTW*) {
  const std::filesystem::path path(file);
  if (type == FTW_F && path.extension() == *listing_extension) listing->push_back(path);
  return 0;
}

int remove_entry(const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }
}  // namespace

TempDir::~TempDir() { remove_tree(path_); }

void remove_tree(const std::filesystem::path& root) { ::nftw(root.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

std::vector<std::filesystem::path> files_below(const std::filesystem::path& root, const std::string& extension) {
  std::vector<std::filesystem::path> files;
  listing = &files;
  listing_extension = &extension;
  ::nftw(root.c_str(), add_if_wanted, 16, FTW_PHYS);
  listing = nullptr;
  std::sort(files.begin(), files.end());
  return files;
}

config::LoadedConfig config_from(std::vector<std::string> overrides, const std::vector<std::string>& extra) {
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return config::load_json(nlohmann::json::object(), "test", overrides);
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string cifar100_record(int record, int coarse, int fine) {
  std::string bytes{static_cast<char>(coarse), static_cast<char>(fine)};
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) bytes.push_back(static_cast<char>((record * 31 + c * 101 + y * 7 + x * 3) % 256));
  return bytes;
}

int cifar100_fine_label(int record) { return record % 100; }

void write_cifar100_files(const std::filesystem::path& root, int train, int test) {
  const auto records = [](int first, int count) {
    std::string bytes;
    for (int record = first; record < first + count; ++record)
      bytes += cifar100_record(record, cifar100_fine_label(record) / 5, cifar100_fine_label(record));
    return bytes;
  };
  write_file(root / "train.bin", records(0, train));
  write_file(root / "test.bin", records(train, test));
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::string> python_with_modules(const std::string& modules) {
  std::vector<std::string> candidates;
  if (const char* chosen = std::getenv("LTRAIN_PYTHON"); chosen != nullptr && *chosen != '\0') candidates.push_back(chosen);
  const char* venv = std::getenv("LTRAIN_VENV");
  candidates.push_back((venv != nullptr && *venv != '\0' ? std::string(venv) : std::string(LTRAIN_SOURCE_DIR "/.venv")) +
                       "/bin/python3");
  candidates.push_back("/usr/bin/python3");
  candidates.push_back("python3");
  for (const std::string& python : candidates) {
    const std::string probe = "'" + python + "' -c 'import " + modules + "' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return std::nullopt;
}

bool python_checks_required() {
  const char* required = std::getenv("LTRAIN_REQUIRE_PYTHON_CHECKS");
  return required != nullptr && std::string(required) == "1";
}

int run_plot_script(const std::string& python, const std::string& name, const std::string& args,
                    const std::filesystem::path& log) {
  const std::string command =
      python + " " LTRAIN_SOURCE_DIR "/scripts/report/" + name + " " + args + " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int run_ltrain(const std::string& args, const std::filesystem::path& log) { return run_ltrain_within(0, args, log); }

int run_ltrain_within(int seconds, const std::string& args, const std::filesystem::path& log) {
  const std::string limit = seconds > 0 ? "timeout " + std::to_string(seconds) + " " : "";
  const std::string command = limit + LTRAIN_EXECUTABLE + " " + args + " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

LtrainProcess::LtrainProcess(const std::vector<std::string>& args, Output output, void (*before_exec)()) {
  std::vector<std::string> words{"ltrain"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);

  int child_side = -1;
  std::string terminal_name;
  if (output == Output::terminal) {
    reader_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (reader_ < 0 || ::grantpt(reader_) != 0 || ::unlockpt(reader_) != 0)
      throw std::runtime_error("LtrainProcess: no pseudo-terminal");
    terminal_name = ::ptsname(reader_);
  } else {
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC) != 0) throw std::runtime_error("LtrainProcess: pipe failed");
    reader_ = ends[0];
    child_side = ends[1];
  }
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("LtrainProcess: fork failed");
  if (pid_ == 0) {
    // Async-signal-safe calls only: the test process has threads.
    if (output == Output::terminal) {
      ::setsid();  // a new session whose controlling terminal is the one opened next
      child_side = ::open(terminal_name.c_str(), O_RDWR);
      if (child_side < 0) ::_exit(126);
      ::dup2(child_side, STDIN_FILENO);
    } else {
      const int nothing = ::open("/dev/null", O_RDONLY);
      ::dup2(nothing, STDIN_FILENO);
    }
    ::dup2(child_side, STDOUT_FILENO);
    ::dup2(child_side, STDERR_FILENO);
    // The test process may have blocked or ignored these; a shell would not have.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    if (before_exec) before_exec();
    ::execv(LTRAIN_EXECUTABLE, argv.data());
    ::_exit(127);
  }
  if (child_side >= 0) ::close(child_side);
  collector_ = std::thread([this] { collect(); });
}

LtrainProcess::~LtrainProcess() {
  if (!status_ && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::kill(-pid_, SIGKILL);  // its own process group, if it made one (a terminal session)
    wait(30);
  }
  stop_reading_ = true;
  if (collector_.joinable()) collector_.join();
  if (reader_ >= 0) ::close(reader_);
}

void LtrainProcess::collect() {
  char buffer[4096];
  while (!stop_reading_) {
    pollfd ready{reader_, POLLIN, 0};
    if (::poll(&ready, 1, 50) <= 0) continue;
    const ssize_t count = ::read(reader_, buffer, sizeof buffer);
    if (count > 0) {
      const std::lock_guard<std::mutex> lock(mutex_);
      output_.append(buffer, static_cast<size_t>(count));
    } else if (count == 0 || errno != EINTR) {
      // The end of the pipe, or a terminal that nobody holds (EIO): all read once the child is gone.
      if (exited_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  drained_ = true;
}

std::string LtrainProcess::output() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return output_;
}

void LtrainProcess::type(const std::string& text) {
  if (::write(reader_, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("LtrainProcess: cannot write to the terminal");
}

bool LtrainProcess::runs_ltrain() const {
  std::error_code error;
  const std::filesystem::path image = std::filesystem::read_symlink("/proc/" + std::to_string(pid_) + "/exe", error);
  return !error && (image == std::filesystem::canonical(LTRAIN_EXECUTABLE) ||
                    image == std::filesystem::canonical(LTRAIN_PROGRAM));
}

namespace {
/// Whether SIGTERM is in the signal set on the line of /proc/PID/status that starts with `field`.
bool sigterm_in_status(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field, 0) == 0) return (std::stoull(line.substr(field.size()), nullptr, 16) >> (SIGTERM - 1)) & 1;
  return false;
}
}  // namespace

bool LtrainProcess::catches_sigterm() const {
  // Before exec the child is a copy of this process, whose handlers say nothing about ltrain's.
  return runs_ltrain() && sigterm_in_status(pid_, "SigCgt:");
}

bool LtrainProcess::blocks_sigterm() const { return runs_ltrain() && sigterm_in_status(pid_, "SigBlk:"); }

int LtrainProcess::wait(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!status_) {
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      status_ = status;
      exited_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  wait_until([this] { return drained_.load(); }, 5);  // what is still in the pipe or terminal
  return WIFEXITED(*status_) ? WEXITSTATUS(*status_) : 128 + WTERMSIG(*status_);
}

bool wait_until(const std::function<bool()>& condition, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

config::LoadedConfig gpu_config(const std::vector<std::string>& extra) {
  return config_from({"run.device=cuda", "model.arch=resnet18", "model.stem=cifar", "model.width=16",
                               "data.batch_size=32", "optim.lr=0.05"},
                              extra);
}

data::Batch gpu_batch(int64_t size, uint64_t seed) {
  torch::manual_seed(seed);
  return {torch::randn({size, 3, 32, 32}).cuda(), torch::randint(0, 10, {size}, torch::kInt64).cuda()};
}

/// Trains `steps` steps on one fixed batch; returns each step's loss.
std::vector<double> train_fixed_batch(const config::LoadedConfig& loaded, int steps) {
  engine::apply_runtime_settings(loaded.config);
  const torch::Device device = engine::resolve_device(loaded);
  models::ResNet model = engine::build_model(loaded, device);
  auto optimizer =
      optim::make_optimizer(engine::optimizer_options(loaded.config.optim), engine::named_parameters(*model));
  optimizer->set_lr(loaded.config.optim.lr);
  amp::GradScaler scaler(engine::grad_scaler_options(loaded.config.precision), device);
  engine::TrainStep step(model, *optimizer, scaler, loaded.config);
  data::Batch batch = gpu_batch(loaded.config.data.batch_size, 1);
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    step.run(batch);
    losses.push_back(step.take_totals().mean_loss());
  }
  return losses;
}

double max_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, ((a[i] - b[i]).norm() / (b[i].norm() + 1e-12)).item<double>());
  return worst;
}

device::DeviceLimits h200_limits() {
  device::DeviceLimits limits;
  limits.capability = {9, 0};
  limits.multiprocessors = 132;
  limits.shared_memory_per_multiprocessor = 228 * 1024;
  limits.registers_per_multiprocessor = 65536;
  limits.threads_per_multiprocessor = 2048;
  limits.blocks_per_multiprocessor = 32;
  limits.cooperative_launch = true;
  limits.cluster_launch = true;
  limits.memory_bytes = 150'000'000'000;
  return limits;
}

}  // namespace ltrain::testing
