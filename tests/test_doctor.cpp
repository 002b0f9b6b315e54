// ltrain doctor and ltrain bench matmul: what they report and how they fail.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <sstream>

#include "ltrain/bench/matmul_bench.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/torch_compat.h"
#include "support.h"

namespace ltrain {
namespace {

using testing::read_file;
using testing::run_ltrain;
using testing::TempDir;

TEST(Doctor, VersionCodesReadAsTheirLibrariesWriteThem) {
  EXPECT_EQ(env::cuda_version_text(13000), "13.0");
  EXPECT_EQ(env::cuda_version_text(12040), "12.4");
  EXPECT_EQ(env::cudnn_version_text(91900), "9.19.0");
  EXPECT_EQ(env::cudnn_version_text(8906), "8.9.6");
  EXPECT_EQ(env::nccl_version_text(22703), "2.27.3");
  EXPECT_EQ(env::nccl_version_text(2708), "2.7.8");
  EXPECT_EQ(env::cudnn_version_text(0), "none");
}

TEST(Doctor, WarnsAboutMismatchesAndMissingPieces) {
  env::Environment cpu_build;
  EXPECT_TRUE(env::warnings(cpu_build).empty());
  cpu_build.nvidia_device_node = true;
  ASSERT_EQ(env::warnings(cpu_build).size(), 1u);
  EXPECT_NE(env::warnings(cpu_build)[0].find("bash scripts/setup.sh"), std::string::npos);

  env::Environment gpu_build;
  gpu_build.cuda_build = true;
  gpu_build.cuda_runtime = 13000;
  gpu_build.cuda_driver = 13000;
  gpu_build.cudnn = 91900;
  gpu_build.nccl = 22703;
  gpu_build.c10d_backends = {"nccl"};
  gpu_build.gpus = {{0, "NVIDIA H200", 9, 0, 132, int64_t{150} << 30}, {1, "Tesla T4", 7, 5, 40, int64_t{16} << 30}};
  const std::vector<std::string> old_gpu = env::warnings(gpu_build);
  ASSERT_EQ(old_gpu.size(), 1u);
  EXPECT_NE(old_gpu[0].find("GPU 1 (Tesla T4) has compute capability 7.5: no TF32 or bf16"), std::string::npos);

  gpu_build.gpus.pop_back();
  gpu_build.cuda_driver = 12080;
  const std::vector<std::string> old_driver = env::warnings(gpu_build);
  ASSERT_EQ(old_driver.size(), 1u);
  EXPECT_EQ(old_driver[0], "the driver supports CUDA 12.8 but LibTorch's runtime is CUDA 13.0: update the driver");

  gpu_build.gpus.clear();
  gpu_build.cuda_driver = 13000;
  gpu_build.cudnn = 0;
  const std::vector<std::string> nothing = env::warnings(gpu_build);
  ASSERT_EQ(nothing.size(), 2u);
  EXPECT_NE(nothing[0].find("no usable CUDA device"), std::string::npos);
  EXPECT_NE(nothing[1].find("cuDNN is not available"), std::string::npos);

  // A CUDA build without NCCL cannot run data-parallel on GPUs: said, with what to do.
  gpu_build.cudnn = 91900;
  gpu_build.gpus = {{0, "NVIDIA H200", 9, 0, 132, int64_t{150} << 30}};
  gpu_build.c10d_backends = {"gloo"};
  const std::vector<std::string> no_nccl = env::warnings(gpu_build);
  ASSERT_EQ(no_nccl.size(), 1u);
  EXPECT_NE(no_nccl[0].find("this CUDA build has no NCCL"), std::string::npos);
  // ... independently of the driver's warnings: an old driver is still named,
  gpu_build.cuda_driver = 12080;
  const std::vector<std::string> no_nccl_old_driver = env::warnings(gpu_build);
  ASSERT_EQ(no_nccl_old_driver.size(), 2u);
  EXPECT_NE(no_nccl_old_driver[0].find("the driver supports CUDA 12.8"), std::string::npos);
  // and a missing driver is one warning, not also an "older" one.
  gpu_build.cuda_driver = 0;
  gpu_build.c10d_backends = {"nccl"};
  const std::vector<std::string> no_driver = env::warnings(gpu_build);
  ASSERT_EQ(no_driver.size(), 1u);
  EXPECT_NE(no_driver[0].find("no NVIDIA driver answers"), std::string::npos);
}

TEST(Doctor, CommandReportsThisBuild) {
  TempDir dir;
  ASSERT_EQ(run_ltrain("doctor --json", dir.path() / "out"), 0) << read_file(dir.path() / "out");
  const nlohmann::json report = nlohmann::json::parse(read_file(dir.path() / "out"));
  EXPECT_EQ(report["libtorch"], compat::torch_version());
  EXPECT_EQ(report["build"]["cuda"], compat::built_with_cuda());
  // The data-parallel backends compiled in: Gloo wherever gloo's headers were found (CI installs them).
  const nlohmann::json backends = report["build"]["c10d_backends"];
  EXPECT_EQ(std::find(backends.begin(), backends.end(), "gloo") != backends.end(), bool(LTRAIN_WITH_GLOO));
  EXPECT_EQ(std::find(backends.begin(), backends.end(), "nccl") != backends.end(), bool(LTRAIN_WITH_NCCL));
  EXPECT_EQ(report["gpus"].size(), static_cast<size_t>(compat::cuda_device_count()));
  EXPECT_TRUE(report["warnings"].is_array());

  ASSERT_EQ(run_ltrain("doctor --device cpu", dir.path() / "out"), 0);
  EXPECT_NE(read_file(dir.path() / "out").find("LibTorch " + compat::torch_version()), std::string::npos);
  if (LTRAIN_WITH_GLOO) {
    EXPECT_NE(read_file(dir.path() / "out").find("data-parallel backends: gloo"), std::string::npos)
        << read_file(dir.path() / "out");
  }
  EXPECT_NE(read_file(dir.path() / "out").find("device cpu: usable"), std::string::npos);
  // A device this machine does not have: one line, exit code 2.
  EXPECT_EQ(run_ltrain("doctor --device cuda:7", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("--device: run.device = \"cuda:7\""), std::string::npos)
      << read_file(dir.path() / "out");
}

TEST(MatmulBench, TimesEachPrecisionOrSaysWhyNot) {
  const auto results = bench::bench_matmul(torch::kCPU, {config::PrecisionMode::fp32, config::PrecisionMode::tf32}, 96,
                                           1, 3);
  ASSERT_EQ(results.size(), 2u);
  const bench::MatmulResult& fp32 = results[0];
  EXPECT_EQ(fp32.precision, "fp32");
  EXPECT_EQ(fp32.dtype, "Float");
  EXPECT_TRUE(fp32.error.empty()) << fp32.error;
  EXPECT_GT(fp32.ms_per_product, 0.0);
  EXPECT_NEAR(fp32.tflops, 2.0 * 96 * 96 * 96 / (fp32.ms_per_product * 1e-3) / 1e12, 1e-9 * fp32.tflops);
  EXPECT_EQ(results[1].error, "TF32 is a feature of NVIDIA GPUs");

  TempDir dir;
  const auto started = std::chrono::steady_clock::now();
  ASSERT_EQ(run_ltrain("bench matmul --device cpu --size 64 --warmup 1 --iters 2 --precision fp32,tf32 --json",
                       dir.path() / "out"),
            0)
      << read_file(dir.path() / "out");
  const double process_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  std::stringstream lines(read_file(dir.path() / "out"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  // The size and count asked for; the timed products within the process's lifetime as this test saw
  // it; the rate the 4090 guide's formula gives for them (2 n^3 per product).
  EXPECT_EQ(rows[0]["n"], 64);
  EXPECT_EQ(rows[0]["products"], 2);
  const double ms = rows[0]["ms_per_product"].get<double>();
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(2 * ms, process_ms);
  const double tflops = 2.0 * 64 * 64 * 64 / (ms * 1e-3) / 1e12;
  EXPECT_NEAR(rows[0]["tflops"].get<double>(), tflops, 1e-9 * tflops);
  EXPECT_EQ(rows[1]["error"], "TF32 is a feature of NVIDIA GPUs");
  // Nothing measured is a failed run: the rows, then one line, exit code 4.
  EXPECT_EQ(run_ltrain("bench matmul --device cpu --size 64 --precision tf32", dir.path() / "out"), 4);
  const std::string none_ran = read_file(dir.path() / "out");
  EXPECT_NE(none_ran.find("not run: TF32 is a feature of NVIDIA GPUs"), std::string::npos) << none_ran;
  EXPECT_NE(none_ran.find("ltrain bench matmul: no precision could run on cpu (each row says why)"),
            std::string::npos)
      << none_ran;
  EXPECT_EQ(run_ltrain("bench matmul --device cpu --precision fp8", dir.path() / "out"), 2);
  EXPECT_NE(read_file(dir.path() / "out").find("unknown precision \"fp8\""), std::string::npos);
}

}  // namespace
}  // namespace ltrain
