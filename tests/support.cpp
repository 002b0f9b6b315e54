#include "support.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

TempDir::~TempDir() {
  // POSIX, not std::filesystem::remove_all: the pip torch (2.5+) exports its own statically linked
  // libstdc++ filesystem symbols, and remove_all crashed in test processes linked against it.
  ::nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

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

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::string> python_with_matplotlib() {
  for (const char* python : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(python) + " -c 'import matplotlib' > /dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return std::string(python);
  }
  return std::nullopt;
}

int run_plot_script(const std::string& python, const std::string& name, const std::string& args,
                    const std::filesystem::path& log) {
  const std::string command =
      python + " " LTRAIN_SOURCE_DIR "/scripts/" + name + " " + args + " > '" + log.string() + "' 2>&1";
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

}  // namespace ltrain::testing
