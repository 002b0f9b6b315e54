// scripts/setup.sh: which LibTorch it builds against, and the prerequisites it refuses with what to
// do (--check stops before installing or building anything). python3 and nvcc are stand-ins that
// answer as a real torch and toolkit would. scripts/get-cifar100.sh: what it refuses (the download
// itself needs the network and is not run here).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

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
  /// The project's environment (scripts/python-env.sh) in venv/, not activated: its python3 answers
  /// as python_torch's does. check() names it in LTRAIN_VENV.
  void venv_torch(const std::string& version, const std::string& cuda, int abi) {
    program("../venv/bin/python3", "echo '" + version + " " + cuda + " " + std::to_string(abi) + " " +
                                       (dir_.path() / "torch-prefix").string() + "'");
  }
  fs::path venv_python() const { return dir_.path() / "venv" / "bin" / "python3"; }
  /// nvidia-smi -L as a machine with `gpus` lists them; none: it fails, as it does without a driver.
  void nvidia_smi(int gpus) {
    std::string body =
        gpus == 0 ? "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9" : "";
    for (int gpu = 0; gpu < gpus; ++gpu)
      body += "echo 'GPU " + std::to_string(gpu) + ": NVIDIA H200 (UUID: GPU-0000000" + std::to_string(gpu) + ")'\n";
    program("nvidia-smi", body);
  }
  /// nvcc --version's last lines for release `release` (e.g. "12.4").
  void nvcc(const std::string& release) {
    program("nvcc", "echo 'Cuda compilation tools, release " + release + ", V" + release + ".0'");
  }
  const fs::path& root() const { return dir_.path(); }

  /// Runs `bash scripts/setup.sh --check` with these tools first on the PATH and `environment`
  /// ("NAME=value ..."); returns the exit code, output in `log`.
  int check(const fs::path& log, const std::string& environment = "") const {
    const std::string command = "cd " LTRAIN_SOURCE_DIR " && env -u LIBTORCH -u CMAKE_PREFIX_PATH LTRAIN_VENV=" +
                                (dir_.path() / "venv").string() + " PATH=" + (dir_.path() / "bin").string() +
                                ":/usr/bin:/bin " + environment +
                                " bash scripts/setup.sh --check > '" + log.string() + "' 2>&1";
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  void program(const std::string& name, const std::string& body) {
    const fs::path file = (dir_.path() / "bin" / name).lexically_normal();
    fs::create_directories(file.parent_path());
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

TEST(Setup, TheProjectsEnvironmentServesTheCudaBuildUnactivatedWhereAGpuIs) {
  FakeTools tools;
  tools.no_python_torch();
  tools.nvcc("13.0");
  tools.venv_torch("2.11.0", "13.0", 1);
  const fs::path log = tools.root() / "log";
  // No GPU: the environment serves the Python-side tests; the CPU build, as README's first command makes it.
  tools.nvidia_smi(0);
  EXPECT_EQ(tools.check(log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("would make the CPU build against Debian's libtorch-dev"), std::string::npos)
      << read_file(log);
  // A GPU: the same command builds for CUDA against the environment's torch.
  tools.nvidia_smi(1);
  EXPECT_EQ(tools.check(log), 0) << read_file(log);
  EXPECT_NE(read_file(log).find("would make the CUDA build against " + tools.venv_python().string() + "'s torch"),
            std::string::npos)
      << read_file(log);
  // Activated (its python3 first on the PATH), it serves the CUDA build without a GPU as well.
  tools.nvidia_smi(0);
  tools.python_torch("2.11.0", "13.0", 1);
  EXPECT_EQ(tools.check(log), 0) << read_file(log);
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

/// Runs `bash scripts/get-cifar100.sh ARGS` without a shared copy to take; its exit code, output in `log`.
int get_cifar100(const std::string& args, const fs::path& log) {
  const std::string command = "cd " LTRAIN_SOURCE_DIR
                              " && LTRAIN_SHARED_DATA=/nonexistent bash scripts/get-cifar100.sh " +
                              args + " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The names in `folder` (hidden ones too), sorted.
std::vector<std::string> entries_of(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// Runs `bash scripts/gpu/make-bundle.sh --wheels-only --dest DEST ARGS` with pip kept to `index`, a
/// folder of wheels (no network); its exit code, output in `log`.
int make_bundle_wheels(const fs::path& dest, const fs::path& index, const std::string& args, const fs::path& log) {
  const std::string command = "cd " LTRAIN_SOURCE_DIR " && PIP_NO_INDEX=1 PIP_FIND_LINKS='" + index.string() +
                              "' bash scripts/gpu/make-bundle.sh --wheels-only --dest '" + dest.string() + "' " + args +
                              " > '" + log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// A minimal wheel of `name` `version` for `tag` (python-abi-platform) in `folder`.
void write_wheel(const fs::path& folder, const std::string& name, const std::string& version, const std::string& tag) {
  const std::string info = name + "-" + version + ".dist-info";
  const fs::path wheel = folder / (name + "-" + version + "-" + tag + ".whl");
  fs::create_directories(folder);
  const std::string script = "import zipfile; z = zipfile.ZipFile('" + wheel.string() + "', 'w'); "
                             "z.writestr('" + name + "/__init__.py', ''); "
                             "z.writestr('" + info + "/METADATA', 'Metadata-Version: 2.1\\nName: " + name +
                             "\\nVersion: " + version + "\\n'); "
                             "z.writestr('" + info + "/WHEEL', 'Wheel-Version: 1.0\\nRoot-Is-Purelib: false\\nTag: " +
                             tag + "\\n'); "
                             "z.writestr('" + info + "/RECORD', ''); z.close()";
  ASSERT_EQ(std::system(("python3 -c \"" + script + "\"").c_str()), 0);
}

// The wheels an offline GPU host lacks travel in the bundle at the versions scripts/requirements.txt
// pins, for the host's Python: a name it does not pin is refused before anything is downloaded.
TEST(Setup, MakeBundleCarriesPinnedWheelsForTheHostsPython) {
  TempDir dir;
  const fs::path index = dir.path() / "index";
  // safetensors as requirements.txt pins it, for CPython 3.12, and a version it does not pin.
  write_wheel(index, "safetensors", "0.8.0", "cp312-cp312-manylinux_2_17_x86_64");
  write_wheel(index, "safetensors", "0.7.0", "cp312-cp312-manylinux_2_17_x86_64");
  const fs::path log = dir.path() / "log";
  ASSERT_EQ(make_bundle_wheels(dir.path() / "carry", index, "--wheel safetensors", log), 0) << read_file(log);
  EXPECT_EQ(entries_of(dir.path() / "carry" / "wheels"),
            std::vector<std::string>{"safetensors-0.8.0-cp312-cp312-manylinux_2_17_x86_64.whl"});
  EXPECT_FALSE(fs::exists(dir.path() / "carry" / "debs"));
  // Another host Python: no wheel of it in the index, so pip finds none and the script says so.
  EXPECT_EQ(make_bundle_wheels(dir.path() / "other", index, "--wheel safetensors --python-version 3.13", log), 1)
      << read_file(log);
  EXPECT_NE(read_file(log).find("pip download of safetensors==0.8.0 failed"), std::string::npos) << read_file(log);
  EXPECT_EQ(make_bundle_wheels(dir.path() / "unpinned", index, "--wheel safetensors --wheel left-pad", log), 2)
      << read_file(log);
  EXPECT_NE(read_file(log).find("left-pad is not pinned in scripts/requirements.txt: pin it there first"),
            std::string::npos)
      << read_file(log);
  EXPECT_FALSE(fs::exists(dir.path() / "unpinned"));
}

/// A cifar-100-binary/ folder as the archive holds it, with made-up content.
void write_cifar100_layout(const fs::path& folder) {
  testing::write_cifar100_files(folder, 200, 100);
  write_file(folder / "coarse_label_names.txt", "aquatic_mammals\nfish\n");
  write_file(folder / "fine_label_names.txt", "apple\naquarium_fish\n");
}

TEST(GetCifar100, UsageErrorsExitTwoAndAMissingSourceThree) {
  TempDir dir;
  const fs::path log = dir.path() / "log";
  EXPECT_EQ(get_cifar100("--help", log), 0);
  EXPECT_NE(read_file(log).find("Usage: scripts/get-cifar100.sh [--dest DIR] [--from PATH] [--help]"),
            std::string::npos)
      << read_file(log);
  EXPECT_EQ(get_cifar100("--bogus", log), 2);
  EXPECT_EQ(read_file(log), "get-cifar100: unknown argument '--bogus' (see --help)\n");
  EXPECT_EQ(get_cifar100("--dest " + dir.path().string() + " --from", log), 2);
  EXPECT_EQ(read_file(log), "get-cifar100: --from needs a path\n");
  const fs::path nowhere = dir.path() / "nowhere";
  EXPECT_EQ(get_cifar100("--dest " + dir.path().string() + " --from " + nowhere.string(), log), 3);
  EXPECT_EQ(read_file(log), "get-cifar100: --from: no such file or directory: " + nowhere.string() + "\n");
  fs::create_directories(dir.path() / "empty");
  const fs::path data = dir.path() / "data";
  EXPECT_EQ(get_cifar100("--dest " + data.string() + " --from " + (dir.path() / "empty").string(), log), 3);
  EXPECT_NE(read_file(log).find("no CIFAR-100 files in " + (dir.path() / "empty").string()), std::string::npos)
      << read_file(log);
  EXPECT_EQ(entries_of(data), std::vector<std::string>{});
}

TEST(GetCifar100, AnArchiveOfTheRightLayoutButOtherContentFailsItsChecksumAndInstallsNothing) {
  TempDir dir;
  write_cifar100_layout(dir.path() / "layout" / "cifar-100-binary");
  const fs::path archive = dir.path() / "cifar-100-binary.tar.gz";
  ASSERT_EQ(std::system(("tar -czf '" + archive.string() + "' -C '" + (dir.path() / "layout").string() +
                         "' cifar-100-binary")
                            .c_str()),
            0);
  const fs::path log = dir.path() / "log";
  const fs::path data = dir.path() / "data";
  EXPECT_EQ(get_cifar100("--dest " + data.string() + " --from " + archive.string(), log), 3);
  EXPECT_EQ(read_file(log), "get-cifar100: " + archive.string() + " is not the published cifar-100-binary.tar.gz (" +
                                std::to_string(fs::file_size(archive)) +
                                " bytes, the published archive has 168513733); fetch it again\n");
  // The published size, other bytes: its SHA-256 tells. A folder holding the archive is taken as it.
  fs::resize_file(archive, 168513733);
  EXPECT_EQ(get_cifar100("--dest " + data.string() + " --from " + dir.path().string(), log), 3);
  const std::string out = read_file(log);
  EXPECT_EQ(out.rfind("get-cifar100: " + archive.string() + " is not the published cifar-100-binary.tar.gz (SHA-256 ",
                      0),
            0u)
      << out;
  EXPECT_NE(out.find(", published 58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec); fetch it "
                     "again\n"),
            std::string::npos)
      << out;
  // Nothing under the final name, no staging folder left behind.
  EXPECT_EQ(entries_of(data), std::vector<std::string>{});
}

TEST(GetCifar100, ExtractedFilesAreHeldToTheirSizesAndChecksums) {
  TempDir dir;
  const fs::path files = dir.path() / "files";
  write_cifar100_layout(files);
  const fs::path log = dir.path() / "log";
  const fs::path data = dir.path() / "data";
  const std::string get = "--dest " + data.string() + " --from " + files.string();
  EXPECT_EQ(get_cifar100(get, log), 3);
  EXPECT_NE(read_file(log).find("get-cifar100: train.bin has 614800 bytes, not 153700000 in " + files.string()),
            std::string::npos)
      << read_file(log);
  // The published sizes, other bytes: the MD5s tell; a label-name file that is missing is named too.
  fs::resize_file(files / "train.bin", 153700000);
  fs::resize_file(files / "test.bin", 30740000);
  fs::remove(files / "fine_label_names.txt");
  // A damaged folder under the final name stays as it is until a good copy replaces it.
  write_file(data / "cifar-100-binary" / "train.bin", "old");
  EXPECT_EQ(get_cifar100(get, log), 3);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("is incomplete or damaged (train.bin has 3 bytes, not 153700000,test.bin is missing or empty"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("get-cifar100: train.bin is damaged (MD5 mismatch) in " + files.string() +
                     " (all problems: train.bin is damaged (MD5 mismatch),test.bin is damaged (MD5 mismatch),"
                     "fine_label_names.txt is missing or empty); fetch a good copy\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(entries_of(data), std::vector<std::string>{"cifar-100-binary"});
  EXPECT_EQ(read_file(data / "cifar-100-binary" / "train.bin"), "old");
}

}  // namespace
}  // namespace ltrain
