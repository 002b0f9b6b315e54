// Where a result came from: the provenance record of summary.json and metrics.jsonl's "run" row
// (versions, the source commit, the config files and the hash of the resolved config, host, start
// time), its pieces, and the NVIDIA driver's version as the kernel module reports it.
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/core/build_info.h"
#include "ltrain/core/environment.h"
#include "ltrain/core/sha256.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/io/provenance.h"
#include "support.h"

namespace ltrain::io {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

std::string sha256_of(const std::string& text) { return sha256_hex(text.data(), text.size()); }

/// The first line `command` prints ("" when it fails).
std::string first_line_of(const std::string& command) {
  std::string line;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[256];
    if (std::fgets(buffer, sizeof buffer, pipe)) line = buffer;
    if (::pclose(pipe) != 0) line.clear();
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

TEST(Provenance, AShortRunSaysWhereItsResultsComeFrom) {
  TempDir dir;
  // A config file that extends another, as the record lists them.
  write_file(dir.path() / "configs" / "base.json",
             R"({"model": {"arch": "resnet18", "stem": "cifar", "width": 4},
                 "data": {"source": "synthetic", "synthetic_train_size": 64, "synthetic_test_size": 32,
                          "batch_size": 16}})");
  write_file(dir.path() / "configs" / "run.json",
             R"({"extends": "base.json", "run": {"device": "cpu", "epochs": 1, "log_every_steps": 2,
                 "out_dir": ")" + (dir.path() / "runs").string() + R"("}})");
  const config::LoadedConfig loaded = config::load_file(dir.path() / "configs" / "run.json");
  const std::string before = utc_iso8601(std::chrono::system_clock::now());
  const engine::TrainResult result = engine::train(loaded);
  const std::string after = utc_iso8601(std::chrono::system_clock::now());

  const nlohmann::json summary = nlohmann::json::parse(read_file(result.run_dir / "summary.json"));
  ASSERT_TRUE(summary.contains("provenance")) << summary.dump(2);
  const nlohmann::json& p = summary["provenance"];
  std::set<std::string> keys;
  for (const auto& [key, value] : p.items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"ltrain_version", "source_commit", "libtorch", "cuda", "cudnn", "nccl",
                                         "nvidia_driver", "gpus", "config_files", "config_sha256", "host",
                                         "started_at"}));
  EXPECT_EQ(p["ltrain_version"], LTRAIN_VERSION);
  EXPECT_EQ(p["source_commit"], source_commit());
  EXPECT_EQ(p["libtorch"], compat::torch_version());
  const env::Environment environment = env::probe();
  EXPECT_EQ(p["cuda"], env::cuda_version_text(environment.cuda_runtime));
  EXPECT_EQ(p["cudnn"], env::cudnn_version_text(environment.cudnn));
  EXPECT_EQ(p["nccl"], env::nccl_version_text(environment.nccl));
  EXPECT_EQ(p["nvidia_driver"], environment.nvidia_driver.empty() ? "none" : environment.nvidia_driver);
  ASSERT_EQ(p["gpus"].size(), environment.gpus.size());
  for (size_t i = 0; i < environment.gpus.size(); ++i) EXPECT_EQ(p["gpus"][i], environment.gpus[i].name);
  if (!compat::built_with_cuda()) {
    EXPECT_EQ(p["cuda"], "none");
    EXPECT_TRUE(p["gpus"].empty());
  }
  // The file and the one it extends, as the reader opened them.
  EXPECT_EQ(p["config_files"], (nlohmann::json{(dir.path() / "configs" / "run.json").string(),
                                               (dir.path() / "configs" / "base.json").string()}));
  // The hash of config.json's canonical text (compact, keys sorted).
  const std::string canonical = nlohmann::json::parse(read_file(result.run_dir / "config.json")).dump();
  EXPECT_EQ(p["config_sha256"], sha256_of(canonical));
  char host[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(p["host"], std::string(host));
  const std::string started = p["started_at"];
  EXPECT_TRUE(std::regex_match(started, std::regex(R"([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)")))
      << started;
  EXPECT_LE(before, started);  // ISO 8601 in UTC sorts as time does
  EXPECT_LE(started, after);

  // metrics.jsonl: the same record in a "run" row before the first step row.
  std::ifstream metrics(result.run_dir / "metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line));
  const nlohmann::json run_row = nlohmann::json::parse(line);
  EXPECT_EQ(run_row["kind"], "run");
  EXPECT_EQ(run_row["step"], 0);
  EXPECT_EQ(run_row["epoch"], 1);
  EXPECT_EQ(run_row["provenance"], p);
  ASSERT_TRUE(std::getline(metrics, line));
  EXPECT_EQ(nlohmann::json::parse(line)["kind"], "step");
}

TEST(Provenance, SourceCommitIsTheCheckoutsHead) {
  const std::string commit = source_commit();
  if (!fs::exists(fs::path(LTRAIN_SOURCE_DIR) / ".git")) {
    EXPECT_EQ(commit, "unknown");
    return;
  }
  const std::string head = first_line_of("git -C '" LTRAIN_SOURCE_DIR "' rev-parse HEAD 2>/dev/null");
  if (head.empty()) GTEST_SKIP() << "git cannot read the checkout here";
  // git describe --always --dirty: "<hash>", "<tag>-<n>-g<hash>", each maybe with "-dirty".
  std::smatch match;
  ASSERT_TRUE(std::regex_match(commit, match, std::regex(R"((?:.*-g)?([0-9a-f]{4,40})(?:-dirty)?)"))) << commit;
  EXPECT_EQ(head.rfind(match[1].str(), 0), 0u) << "built from " << commit << ", the checkout is at " << head
                                               << ": build again";
}

TEST(Provenance, UtcTimeAndTheConfigHash) {
  EXPECT_EQ(utc_iso8601(std::chrono::system_clock::from_time_t(0)), "1970-01-01T00:00:00Z");
  EXPECT_EQ(utc_iso8601(std::chrono::system_clock::from_time_t(1700000000)), "2023-11-14T22:13:20Z");
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(provenance({}, nullptr, now)["config_sha256"].is_null());
  const nlohmann::json config{{"run", {{"name", "x"}, {"epochs", 2}}}};
  const nlohmann::json record = provenance({"a.json"}, config, now);
  EXPECT_EQ(record["config_sha256"], sha256_of(R"({"run":{"epochs":2,"name":"x"}})"));
  EXPECT_EQ(record["config_files"], nlohmann::json{"a.json"});
  EXPECT_EQ(record["started_at"], utc_iso8601(now));
}

TEST(Environment, NvidiaDriverVersionFromTheKernelModulesText) {
  EXPECT_EQ(env::nvidia_driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 "
                                       "09:08:15 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"),
            "580.95.05");
  // The open kernel module, as an H200 host reports it.
  EXPECT_EQ(env::nvidia_driver_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
                                       "Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n"),
            "580.159.04");
  EXPECT_EQ(env::nvidia_driver_version(""), "");
  EXPECT_EQ(env::nvidia_driver_version("no driver here"), "");
}

}  // namespace
}  // namespace ltrain::io
