// scripts/setup.sh: which LibTorch it builds against, and the prerequisites it refuses with what to
// do (--check stops before installing or building anything). python3 and nvcc are stand-ins that
// answer as a real torch and toolkit would.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support.h"

namespace ltrain {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

/// A folder of stand-in programs put first on the PATH.
class FakeTools {
 public:
  /// python3 prints what setup.sh asks torch for: version, CUDA ("-" for none), C++11 ABI, CMake prefix.
  void python_torch(const std::string& version, const std::string& cuda, int abi) {
    program("python3", "echo '" + version + " " + cuda + " " + std::to_string(abi) + " " +
                           (dir_.path() / "torch-prefix").string() + "'");
  }
  void no_python_torch() { program("python3", "exit 1"); }
  /// nvcc --version's last lines for release `release` (e.g. "12.4").
  void nvcc(const std::string& release) {
    program("nvcc", "echo 'Cuda compilation tools, release " + release + ", V" + release + ".0'");
  }
  const fs::path& root() const { return dir_.path(); }

  /// Runs `bash scripts/setup.sh --check` with these tools first on the PATH and `environment`
  /// ("NAME=value ..."); returns the exit code, output in `log`.
  int check(const fs::path& log, const std::string& environment = "") const {
    const std::string command = "cd " LTRAIN_SOURCE_DIR " && env -u LIBTORCH -u CMAKE_PREFIX_PATH PATH=" +
                                (dir_.path() / "bin").string() + ":/usr/bin:/bin " + environment +
                                " bash scripts/setup.sh --check > '" + log.string() + "' 2>&1";
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  void program(const std::string& name, const std::string& body) {
    const fs::path file = dir_.path() / "bin" / name;
    write_file(file, "#!/bin/sh\n" + body + "\n");
    fs::permissions(file, fs::perms::owner_all);
  }
  TempDir dir_;
};

TEST(Setup, BuildsForTheCpuWithoutACudaTorch) {
  FakeTools tools;
  tools.no_python_torch();
  const fs::path log = tools.root() / "log";
  EXPECT_EQ(tools.check(log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("would make the CPU build against Debian's libtorch-dev"), std::string::npos)
      << read_file(log);
  tools.python_torch("2.11.0", "-", 1);  // a CPU-only torch: Debian's LibTorch serves as well
  EXPECT_EQ(tools.check(log), 0);
  EXPECT_NE(read_file(log).find("would make the CPU build"), std::string::npos) << read_file(log);
}

TEST(Setup, BuildsForCudaAgainstAPythonTorchWithAMatchingNvcc) {
  FakeTools tools;
  tools.python_torch("2.11.0", "13.0", 1);
  tools.nvcc("13.0");
  const fs::path log = tools.root() / "log";
  EXPECT_EQ(tools.check(log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("CUDA LibTorch 2.11.0 (CUDA 13.0) from"), std::string::npos) << read_file(log);
  EXPECT_NE(read_file(log).find("would make the CUDA build"), std::string::npos) << read_file(log);
}

TEST(Setup, RefusesWhatCannotBuildWithWhatToDo) {
  FakeTools tools;
  tools.nvcc("13.0");
  const fs::path log = tools.root() / "log";
  // A wheel of the old C++ ABI (torch before 2.7) cannot link with the system's libraries.
  tools.python_torch("2.6.0", "12.4", 0);
  EXPECT_EQ(tools.check(log), 3);
  EXPECT_NE(read_file(log).find("was built with the pre-C++11 ABI, which cannot link with the system's C++ "
                                "libraries: install torch 2.7 or later"),
            std::string::npos)
      << read_file(log);
  tools.python_torch("1.13.1", "11.7", 1);
  EXPECT_EQ(tools.check(log), 3);
  EXPECT_NE(read_file(log).find("ltrain's CUDA build needs torch 2.0 or later"), std::string::npos) << read_file(log);
  // The toolkit must match torch's CUDA major version.
  tools.python_torch("2.11.0", "13.0", 1);
  tools.nvcc("12.4");
  EXPECT_EQ(tools.check(log), 3);
  EXPECT_NE(read_file(log).find("nvcc 12.4"), std::string::npos) << read_file(log);
  EXPECT_NE(read_file(log).find("differ in CUDA's major version: install the CUDA toolkit 13.x or the torch built "
                                "for CUDA 12 (pip install torch --index-url https://download.pytorch.org/whl/cu124)"),
            std::string::npos)
      << read_file(log);
}

TEST(Setup, TakesTheLibTorchArchiveLibtorchNames) {
  FakeTools tools;
  tools.no_python_torch();
  tools.nvcc("12.8");
  const fs::path archive = tools.root() / "libtorch";
  const fs::path log = tools.root() / "log";
  EXPECT_EQ(tools.check(log, "LIBTORCH=" + archive.string()), 3);
  EXPECT_NE(read_file(log).find("holds no LibTorch (share/cmake/Torch/TorchConfig.cmake is missing)"),
            std::string::npos)
      << read_file(log);
  write_file(archive / "share/cmake/Torch/TorchConfig.cmake", "set(TORCH_CXX_FLAGS \"-D_GLIBCXX_USE_CXX11_ABI=1\")\n");
  write_file(archive / "lib/libtorch_cuda.so", "");
  write_file(archive / "build-version", "2.9.1+cu128\n");
  EXPECT_EQ(tools.check(log, "LIBTORCH=" + archive.string()), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("CUDA LibTorch 2.9.1 (CUDA 12.8) from LIBTORCH=" + archive.string()),
            std::string::npos)
      << read_file(log);
  write_file(archive / "share/cmake/Torch/TorchConfig.cmake", "set(TORCH_CXX_FLAGS \"-D_GLIBCXX_USE_CXX11_ABI=0\")\n");
  EXPECT_EQ(tools.check(log, "LIBTORCH=" + archive.string()), 3);
}

}  // namespace
}  // namespace ltrain
