#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/log.h"
#include "ltrain/core/progress.h"
#include "ltrain/io/run_files.h"
#include "ltrain/io/tensor_file.h"
#include "support.h"

namespace ltrain::io {
namespace {

namespace fs = std::filesystem;
using ltrain::testing::read_file;
using ltrain::testing::TempDir;
using ltrain::testing::write_file;

NamedTensors sample_tensors() {
  torch::manual_seed(0);
  return {{"conv.weight", torch::randn({8, 3, 3, 3})},
          {"bn.num_batches_tracked", torch::tensor(17, torch::kInt64)},
          {"half", torch::randn({5}).to(torch::kFloat16)},
          {"bytes", torch::randint(0, 255, {7}, torch::kUInt8)},
          {"empty", torch::zeros({0, 4})}};
}

void expect_equal(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.scalar_type(), b[i].second.scalar_type()) << a[i].first;
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(TensorFile, Crc32KnownValue) {
  const std::string text = "123456789";  // the standard check value of CRC-32
  EXPECT_EQ(crc32(text.data(), text.size()), 0xCBF43926u);
  EXPECT_EQ(crc32(text.data() + 4, 5, crc32(text.data(), 4)), 0xCBF43926u);  // incremental
}

TEST(TensorFile, SafetensorsRoundTripWithMetadata) {
  TempDir dir;
  const auto file = dir.path() / "w.safetensors";
  write_safetensors(file, sample_tensors(), {{"format", "pt"}});
  std::map<std::string, std::string> metadata;
  expect_equal(read_safetensors(file, &metadata), sample_tensors());
  EXPECT_EQ(metadata.at("format"), "pt");
  // Layout: 8-byte little-endian header length, then a JSON header padded to 8 bytes.
  const std::string bytes = read_file(file);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  EXPECT_EQ(header % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_NE(bytes.find("\"dtype\":\"F32\""), std::string::npos);
  EXPECT_NE(bytes.find("\"data_offsets\""), std::string::npos);
}

TEST(TensorFile, SafetensorsRejectsGarbage) {
  TempDir dir;
  write_file(dir.path() / "bad.safetensors", "not a tensor file at all");
  try {
    read_safetensors(dir.path() / "bad.safetensors");
    FAIL();
  } catch (const DataError& e) {
    EXPECT_EQ(std::string(e.what()), (dir.path() / "bad.safetensors").string() +
                                         ": not a valid safetensors file (header length beyond the end of the file)");
  }
}

/// A safetensors file of one float32 entry with `shape` (JSON text) over 4 bytes of data.
std::string safetensors_claiming(const std::string& shape) {
  std::string header = R"({"w": {"dtype": "F32", "shape": )" + shape + R"(, "data_offsets": [0, 4]}})";
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  return bytes + header + std::string(4, '\0');
}

TEST(TensorFile, AShapeTheDataCannotHoldIsRefusedBeforeAnythingIsAllocated) {
  TempDir dir;
  const auto file = dir.path() / "w.safetensors";
  const std::string refused = file.string() + ": not a valid safetensors file (entry \"w\" is malformed or points "
                                              "outside the file)";
  // 2^64 - 1 (-1 as a signed size), a product past 2^64, 8 GiB and 2^62 elements: each over 4 bytes.
  for (const char* shape : {"[18446744073709551615]", "[4611686018427387904, 4611686018427387904]",
                            "[2147483648, 1]", "[4611686018427387904]", "[2, 1]", "[-1]"}) {
    write_file(file, safetensors_claiming(shape));
    try {
      read_safetensors(file);
      ADD_FAILURE() << shape << ": no error";
    } catch (const DataError& e) {
      EXPECT_EQ(std::string(e.what()), refused) << shape;
    }
  }
  // The shapes that fit: one float32, as a scalar, as [1] and as [1, 1, 1].
  for (const char* shape : {"[]", "[1]", "[1, 1, 1]"}) {
    write_file(file, safetensors_claiming(shape));
    EXPECT_EQ(read_safetensors(file).at(0).second.numel(), 1) << shape;
  }
}

TEST(TensorFile, ArchiveRoundTrip) {
  TempDir dir;
  TensorArchive archive{{{"kind", "test"}, {"step", 12}}, sample_tensors()};
  write_archive(dir.path() / "a.ltc", archive);
  const TensorArchive back = read_archive(dir.path() / "a.ltc");
  EXPECT_EQ(back.info, archive.info);
  expect_equal(back.tensors, archive.tensors);
  // No temporary file is left beside it.
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1);
}

std::string read_error(const std::filesystem::path& file) {
  try {
    read_archive(file);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TensorFile, ArchiveDetectsTruncationBitFlipsAndForeignFiles) {
  TempDir dir;
  const auto good = dir.path() / "good.ltc";
  write_archive(good, {{{"kind", "test"}}, sample_tensors()});
  const std::string bytes = read_file(good);

  write_file(dir.path() / "cut.ltc", bytes.substr(0, bytes.size() - 100));
  EXPECT_EQ(read_error(dir.path() / "cut.ltc"),
            (dir.path() / "cut.ltc").string() +
                ": checkpoint is truncated (its end marker is missing): it was not completely written; use an earlier "
                "checkpoint");

  std::string flipped = bytes;
  flipped[bytes.size() / 2] = static_cast<char>(flipped[bytes.size() / 2] ^ 0x10);
  write_file(dir.path() / "flip.ltc", flipped);
  EXPECT_EQ(read_error(dir.path() / "flip.ltc"),
            (dir.path() / "flip.ltc").string() + ": checkpoint is damaged (checksum mismatch); use an earlier checkpoint");

  write_file(dir.path() / "foreign.ltc", "PK\x03\x04 a zip file, say");
  EXPECT_EQ(read_error(dir.path() / "foreign.ltc"),
            (dir.path() / "foreign.ltc").string() + ": not an ltrain checkpoint (wrong magic number)");

  std::string newer = bytes;
  newer[8] = 99;  // format version
  write_file(dir.path() / "newer.ltc", newer);
  EXPECT_NE(read_error(dir.path() / "newer.ltc").find("format version 99 is not supported"), std::string::npos);

  EXPECT_EQ(read_error(dir.path() / "missing.ltc"),
            (dir.path() / "missing.ltc").string() + ": no such file (expected a checkpoint file)");
  // A system file that says it is a regular file but has nothing to read.
  EXPECT_EQ(read_error("/proc/self/mem"),
            "/proc/self/mem: cannot be read (Input/output error): not a file with contents of its own (expected a "
            "checkpoint file)");
}

TEST(TensorFile, FailedWriteKeepsThePreviousFile) {
  TempDir dir;
  const auto file = dir.path() / "ckpt.ltc";
  write_archive(file, {{{"kind", "first"}}, sample_tensors()});
  // A folder that cannot hold the temporary file: the write fails, the old file stays intact.
  EXPECT_THROW(write_archive(dir.path() / "no-such-folder" / "ckpt.ltc", {{{"kind", "x"}}, {}}), RunError);
  EXPECT_EQ(read_archive(file).info["kind"], "first");
}

TEST(RunFiles, RunDirectoryNeverReused) {
  TempDir dir;
  EXPECT_EQ(create_run_dir(dir.path(), "exp").filename(), "exp");
  EXPECT_EQ(create_run_dir(dir.path(), "exp").filename(), "exp-2");
  EXPECT_EQ(create_run_dir(dir.path(), "exp").filename(), "exp-3");
}

TEST(RunFiles, MetricsCsvAndJsonLines) {
  TempDir dir;
  {
    MetricsLog log(dir.path());
    log.write({"step", 1, 50, {{"lr", 0.1}, {"train_loss", 2.5}}});
    log.write({"epoch", 1, 97, {{"test_acc", 0.25}}});
    EXPECT_THROW(log.write({"step", 1, 1, {{"no_such_column", 1.0}}}), std::logic_error);
  }
  EXPECT_EQ(read_file(dir.path() / "metrics.csv"),
            "kind,epoch,step,lr,train_loss,train_acc,test_loss,test_acc,img_per_s,elapsed_s,loss_scale,skipped_steps,"
            "gpu_memory_gib,gpu_peak_memory_gib\n"
            "step,1,50,0.1,2.5,,,,,,,,,\n"
            "epoch,1,97,,,,,0.25,,,,,,\n");
  EXPECT_EQ(read_file(dir.path() / "metrics.jsonl"),
            "{\"epoch\":1,\"kind\":\"step\",\"lr\":0.1,\"step\":50,\"train_loss\":2.5}\n"
            "{\"epoch\":1,\"kind\":\"epoch\",\"step\":97,\"test_acc\":0.25}\n");
}

TEST(RunFiles, AResumedRunOfAnotherVersionKeepsItsCsvRowsUnderTodaysColumns) {
  TempDir dir;
  // A CSV as an older ltrain wrote it: fewer columns, in another order, one that is gone today.
  write_file(dir.path() / "metrics.csv",
             "kind,epoch,step,train_loss,lr,old_metric\n"
             "step,1,50,2.5,0.1,7\n"
             "epoch,1,97,2.25,,\n");
  {
    MetricsLog log(dir.path());
    log.write({"step", 2, 150, {{"lr", 0.05}, {"gpu_memory_gib", 1.5}}});
  }
  EXPECT_EQ(read_file(dir.path() / "metrics.csv"),
            "kind,epoch,step,lr,train_loss,train_acc,test_loss,test_acc,img_per_s,elapsed_s,loss_scale,skipped_steps,"
            "gpu_memory_gib,gpu_peak_memory_gib,old_metric\n"
            "step,1,50,0.1,2.5,,,,,,,,,,7\n"
            "epoch,1,97,,2.25,,,,,,,,,,\n"
            "step,2,150,0.05,,,,,,,,,1.5,,\n");
  {  // A second start finds today's header (and the kept column) and appends only.
    MetricsLog log(dir.path());
    log.write({"epoch", 2, 194, {{"test_acc", 0.5}}});
  }
  EXPECT_NE(read_file(dir.path() / "metrics.csv").find("step,2,150,0.05,,,,,,,,,1.5,,\nepoch,2,194,,,,,0.5,,,,,,,\n"),
            std::string::npos);
}

/// The message of the files::WriteError that `action` throws ("" and a test failure if none).
template <class Action>
std::string write_error_of(Action action) {
  try {
    action();
  } catch (const files::WriteError& error) {
    EXPECT_EQ(error.code(), ExitCode::runtime);
    return error.what();
  }
  ADD_FAILURE() << "no WriteError";
  return "";
}

// /dev/full refuses every write with ENOSPC, as a full disk does.
constexpr const char* kFullDisk = "/dev/full";

TEST(Files, AWriteToAFullDiskNamesTheFileAndWhatToDo) {
  files::AppendFile full(kFullDisk);
  EXPECT_EQ(write_error_of([&] { full.append("one line\n"); }),
            "/dev/full: cannot write (No space left on device): free some disk space or write to another disk");
  TempDir dir;
  EXPECT_EQ(write_error_of([&] { files::AppendFile(dir.path() / "no-such-folder" / "x.csv"); }),
            (dir.path() / "no-such-folder" / "x.csv").string() +
                ": cannot open it for writing (No such file or directory): check the disk, or write to another folder");
}

TEST(Files, AFileSizeLimitStopsAnAtomicWriteAndKeepsThePreviousFile) {
  TempDir dir;
  const auto file = dir.path() / "summary.json";
  write_text_file(file, "first\n");
  // The soft limit can go down and back up to the hard one without privileges; SIGXFSZ ignored,
  // a write past it fails with EFBIG.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string big(10000, 'x');
  const std::string message = write_error_of([&] { write_text_file(file, big); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_EQ(message, file.string() + ": cannot write (File too large): raise the file-size limit (ulimit -f) or write "
                                     "elsewhere");
  EXPECT_EQ(read_file(file), "first\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1)
      << "the temporary file was left behind";
}

TEST(Files, StaleTemporariesOfGoneProcessesAreRemovedAndThoseOfLivingOnesKept) {
  TempDir dir;
  // A process that has ended: its PID is free.
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string dead = std::to_string(gone), alive = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{"step-00000007.ltc.tmp-" + dead, "config.json.tmp-" + dead,
                                                          "step-00000008.ltc.tmp-" + alive, "step-00000006.ltc",
                                                          "notes.tmp-x", "notes.tmp-"})
    write_file(dir.path() / name, "x");
  const std::vector<fs::path> removed = files::remove_stale_temporaries(dir.path());
  EXPECT_EQ(std::set<fs::path>(removed.begin(), removed.end()),
            (std::set<fs::path>{dir.path() / ("step-00000007.ltc.tmp-" + dead), dir.path() / ("config.json.tmp-" + dead)}));
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path())) left.insert(entry.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"step-00000008.ltc.tmp-" + alive, "step-00000006.ltc", "notes.tmp-x",
                                         "notes.tmp-"}));
}

TEST(RunFiles, AMetricsRowThatCannotBeWrittenNamesItsFile) {
  TempDir dir;
  for (const char* name : {"metrics.csv", "metrics.jsonl"}) {
    const fs::path run_dir = dir.path() / name;
    fs::create_directory(run_dir);
    fs::create_symlink(kFullDisk, run_dir / name);
    MetricsLog metrics(run_dir);
    EXPECT_EQ(write_error_of([&] { metrics.write({"step", 1, 50, {{"lr", 0.1}}}); }),
              (run_dir / name).string() +
                  ": cannot write (No space left on device): free some disk space or write to another disk");
  }
}

TEST(LogFile, AMessageThatCannotBeWrittenIsReportedNamingTheFile) {
  log::add_file(kFullDisk);
  spdlog::info("a message for a full disk");
  EXPECT_EQ(write_error_of([] { log::throw_if_file_failed(); }),
            "/dev/full: cannot write (No space left on device): free some disk space or write to another disk");
  log::remove_file();
  EXPECT_NO_THROW(log::throw_if_file_failed());  // no log file, nothing to report

  TempDir dir;
  log::add_file(dir.path() / "train.log");
  spdlog::info("written at once");
  EXPECT_NE(read_file(dir.path() / "train.log").find("written at once"), std::string::npos);  // no buffer
  EXPECT_NO_THROW(log::throw_if_file_failed());
  log::remove_file();
}

TEST(Progress, TheLineFitsTheTerminalDroppingFieldsFromTheRight) {
  ProgressState state;
  state.epoch = 3, state.epochs = 10, state.step = 404, state.total_steps = 1960;
  state.epoch_step = 12, state.epoch_steps = 196;
  state.loss = 1.23451, state.accuracy = 0.567, state.lr = 0.1;
  state.images_per_second = 1234.4, state.eta_seconds = 185;
  const std::string bar = "epoch 3/10 [#.......................] 12/196";
  const std::string full = bar + " | loss 1.2345 acc  56.7% | lr 0.1 | 1234 img/s | eta 3m05s";
  EXPECT_EQ(progress_line(state, 200), full);
  EXPECT_EQ(progress_line(state, full.size() + 1), full);
  // One column short: the eta goes, then the next field from the right, never a wrapped line.
  EXPECT_EQ(progress_line(state, full.size()), bar + " | loss 1.2345 acc  56.7% | lr 0.1 | 1234 img/s");
  EXPECT_EQ(progress_line(state, 80), bar + " | loss 1.2345 acc  56.7% | lr 0.1");
  EXPECT_EQ(progress_line(state, bar.size() + 1), bar);
  EXPECT_EQ(progress_line(state, 20), bar.substr(0, 19));
  for (size_t columns = 0; columns <= 200; ++columns)
    EXPECT_LE(progress_line(state, columns).size(), std::max<size_t>(columns, 1) - 1) << columns;
}

TEST(Progress, TerminalWidthFallsBackToColumnsThenEighty) {
  if (::isatty(STDERR_FILENO) == 1) GTEST_SKIP() << "stderr is a terminal: its own width wins";
  const char* saved = std::getenv("COLUMNS");
  const std::string saved_value = saved ? saved : "";
  ::setenv("COLUMNS", "57", 1);
  EXPECT_EQ(terminal_columns(), 57u);
  ::setenv("COLUMNS", "wide", 1);
  EXPECT_EQ(terminal_columns(), 80u);
  ::unsetenv("COLUMNS");
  EXPECT_EQ(terminal_columns(), 80u);
  if (saved) ::setenv("COLUMNS", saved_value.c_str(), 1);
}

}  // namespace
}  // namespace ltrain::io
