// The data module: CIFAR-10 and CIFAR-100 reader, synthetic source, normalization, train/eval loaders and
// their augmentation, checked against straightforward per-sample references.
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#if LTRAIN_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "ltrain/core/errors.h"
#include "ltrain/core/gpu.h"
#include "ltrain/core/sha256.h"
#include "ltrain/data/cifar.h"
#include "ltrain/data/loader.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "support.h"

namespace {

namespace fs = std::filesystem;
namespace gpu = ltrain::gpu;
using ltrain::DataError;
using ltrain::config::DataSection;
using ltrain::data::Batch;
using ltrain::data::EvalLoader;
using ltrain::data::EvalLoaderOptions;
using ltrain::data::ImageSet;
using ltrain::data::NormalizeOptions;
using ltrain::data::Normalizer;
using ltrain::data::ProgressiveResize;
using ltrain::data::SourceOptions;
using ltrain::data::TrainLoader;
using ltrain::data::TrainLoaderOptions;
using ltrain::testing::TempDir;
using ltrain::testing::write_file;

// ---- helpers ------------------------------------------------------------------------------------

/// The pixel byte a test file holds for record `record`, channel `c`, row `y`, column `x`.
uint8_t pattern_pixel(int record, int c, int y, int x) {
  return static_cast<uint8_t>((record * 31 + c * 101 + y * 7 + x * 3) % 256);
}

/// One 3073-byte record: the label, then the R, G, B planes, each row-major 32x32.
std::string make_record(int record, int label) {
  std::string bytes(1, static_cast<char>(label));
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x) bytes.push_back(static_cast<char>(pattern_pixel(record, c, y, x)));
  return bytes;
}

std::string make_records(const std::vector<int>& labels, int first_record = 0) {
  std::string bytes;
  for (size_t i = 0; i < labels.size(); ++i) bytes += make_record(first_record + static_cast<int>(i), labels[i]);
  return bytes;
}

/// The message of the DataError that `action` throws ("" and a test failure if none).
template <class Action>
std::string data_error_of(Action action) {
  try {
    action();
  } catch (const DataError& error) {
    EXPECT_EQ(error.code(), ltrain::ExitCode::data);
    return error.what();
  }
  ADD_FAILURE() << "no DataError thrown";
  return "";
}

/// Random images with pixels in 1-255 (0 is left to the padding) and labels 0..N-1, so a
/// batch's labels say which images it holds.
ImageSet indexed_images(int64_t count, uint64_t seed, int64_t side = 32) {
  auto generator = at::detail::createCPUGenerator(seed);
  ImageSet set;
  set.images = torch::randint(1, 256, {count, 3, side, side}, generator, torch::TensorOptions().dtype(torch::kUInt8));
  set.labels = torch::arange(count, torch::TensorOptions().dtype(torch::kInt64));
  return set;
}

/// The normalization a run config asks for unless it says otherwise: CIFAR-10's mean and std.
NormalizeOptions default_normalize() { return ltrain::engine::eval_loader_options(DataSection{}).normalize; }

/// The data section's defaults but for the source's folder, `root`.
SourceOptions source_at(const fs::path& root) {
  SourceOptions options = ltrain::engine::source_options(DataSection{});
  options.root = root;
  return options;
}

/// The data section's defaults but for these.
TrainLoaderOptions loader_config(int64_t images_per_step, bool random_crop, int64_t padding, bool flip) {
  TrainLoaderOptions options = ltrain::engine::train_loader_options(ltrain::config::RunConfig{});
  options.images_per_step = images_per_step;
  options.random_crop = random_crop;
  options.crop_padding = padding;
  options.horizontal_flip = flip;
  return options;
}

/// torchvision's ToTensor() + Normalize(mean, std), written out: (x/255 - mean) / std.
torch::Tensor reference_normalize(const torch::Tensor& images_uint8, const NormalizeOptions& options) {
  const auto mean = torch::tensor(options.mean).to(torch::kFloat32).view({1, 3, 1, 1});
  const auto std = torch::tensor(options.std).to(torch::kFloat32).view({1, 3, 1, 1});
  return (images_uint8.to(torch::kFloat32) / 255.0 - mean) / std;
}

/// torchvision's RandomCrop(S, padding) with top = padding + dy, left = padding + dx, then
/// RandomHorizontalFlip: [3,S,S] uint8 -> [3,S,S] uint8.
torch::Tensor reference_crop_flip(const torch::Tensor& image, int64_t padding, int64_t dy, int64_t dx, bool flip) {
  const int64_t side = image.size(2);
  const auto padded = torch::constant_pad_nd(image, {padding, padding, padding, padding}, 0);
  auto crop = padded.slice(1, padding + dy, padding + dy + side).slice(2, padding + dx, padding + dx + side);
  return flip ? crop.flip({2}) : crop;
}

bool close(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, /*rtol=*/0.0, /*atol=*/1e-5);
}

struct Augmentation {
  int64_t dy;
  int64_t dx;
  bool flip;
};

/// For each image of `batch`, the one (dy, dx, flip) whose torchvision reference it equals;
/// fails the test where none or several match.
std::vector<Augmentation> identify_augmentations(const Batch& batch, const ImageSet& set,
                                                 const TrainLoaderOptions& data, int64_t padding, bool flips) {
  std::vector<Augmentation> candidates;
  for (int64_t dy = -padding; dy <= padding; ++dy)
    for (int64_t dx = -padding; dx <= padding; ++dx)
      for (bool flip : {false, true})
        if (flip == false || flips) candidates.push_back({dy, dx, flip});

  std::vector<Augmentation> found;
  for (int64_t b = 0; b < batch.labels.size(0); ++b) {
    const auto image = set.images[batch.labels[b].item<int64_t>()];
    std::vector<torch::Tensor> references;
    for (const auto& candidate : candidates)
      references.push_back(reference_crop_flip(image, padding, candidate.dy, candidate.dx, candidate.flip));
    const auto normalized = reference_normalize(torch::stack(references), data.normalize);  // [K,3,S,S]
    const auto matches = (normalized - batch.images[b].unsqueeze(0)).abs().amax({1, 2, 3}).lt(1e-5);
    const auto matching = torch::nonzero(matches);
    EXPECT_EQ(matching.size(0), 1) << "image " << b << " matches " << matching.size(0) << " references";
    found.push_back(matching.size(0) > 0 ? candidates[static_cast<size_t>(matching[0][0].item<int64_t>())]
                                         : Augmentation{99, 99, false});
  }
  return found;
}

std::vector<Batch> epoch_batches(TrainLoader& loader, int64_t epoch) {
  loader.set_epoch(epoch);
  std::vector<Batch> batches;
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) batches.push_back(loader.batch(i));
  return batches;
}

std::string read_bytes(const fs::path& file, int64_t offset, int64_t count) {
  std::ifstream in(file, std::ios::binary);
  in.seekg(offset);
  std::string bytes(static_cast<size_t>(count), '\0');
  in.read(bytes.data(), count);
  EXPECT_TRUE(in) << "cannot read " << count << " bytes at " << offset << " of " << file;
  return bytes;
}

int byte_at(const std::string& bytes, int64_t offset) { return static_cast<uint8_t>(bytes[static_cast<size_t>(offset)]); }

// ---- reader ---------------------------------------------------------------------------------------

TEST(CifarReader, ReadsLabelsAndRedGreenBluePlanes) {
  TempDir dir;
  const auto file = dir.path() / "data_batch_1.bin";
  write_file(file, make_records({3, 0, 9}));
  const auto set = ltrain::data::read_cifar10_file(file);

  ASSERT_EQ(set.images.sizes(), torch::IntArrayRef({3, 3, 32, 32}));
  EXPECT_EQ(set.images.scalar_type(), torch::kUInt8);
  ASSERT_EQ(set.labels.sizes(), torch::IntArrayRef({3}));
  EXPECT_EQ(set.labels.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(set.labels, torch::tensor({3, 0, 9}, torch::kInt64)));
  // The first 1024 pixel bytes are red, then green, then blue, each row-major.
  for (int record : {0, 2})
    for (int c : {0, 1, 2})
      for (auto [y, x] : {std::pair{0, 0}, std::pair{0, 31}, std::pair{1, 0}, std::pair{17, 5}, std::pair{31, 31}})
        EXPECT_EQ(set.images[record][c][y][x].item<int>(), pattern_pixel(record, c, y, x))
            << "record " << record << " channel " << c << " y " << y << " x " << x;
}

TEST(CifarReader, TruncatedFileNamesTheFileAndTheRecordSize) {
  TempDir dir;
  const auto file = dir.path() / "data_batch_2.bin";
  write_file(file, make_records({1, 2}) + "12345");
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
            file.string() +
                ": 6151 bytes is not a whole number of 3073-byte CIFAR-10 records: the file is truncated or not "
                "CIFAR-10 binary; fetch it again with scripts/get-cifar10.sh");
}

// A file larger than the release's is refused from its size, before it is read into memory (a
// sparse 30 GB file takes no disk and would take 30 GB of memory).
TEST(CifarReader, AFileLargerThanTheReleasesIsRefusedBeforeReading) {
  TempDir dir;
  const auto file = dir.path() / "data_batch_1.bin";
  write_file(file, make_records({1}));
  for (const std::uintmax_t bytes : {std::uintmax_t{10001} * 3073, std::uintmax_t{30} << 30}) {
    fs::resize_file(file, bytes);
    EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
              file.string() + ": " + std::to_string(bytes) +
                  " bytes, more than CIFAR-10's data_batch_1.bin (30730000 bytes, 10000 records of 3073 bytes): not a "
                  "CIFAR-10 binary file of the expected size; fetch it again with scripts/get-cifar10.sh");
  }
}

// A relative data.root that the working directory lacks is looked for in the other places given
// (ltrain's own folder, for the default); where none has it, the error names each place.
TEST(CifarReader, ARelativeRootIsLookedForInTheOtherPlacesGiven) {
  LTRAIN_REQUIRE_CIFAR_MINI(mini);
  TempDir dir;
  // Not in the working directory.
  const std::string root = "data-" + dir.path().filename().string() + "/cifar-10-batches-bin";
  const SourceOptions source = source_at(root);
  fs::create_directories((dir.path() / "with" / root).parent_path());
  fs::create_directory_symlink(mini, dir.path() / "with" / root);
  EXPECT_EQ(ltrain::data::load_sets(source, 0, {dir.path() / "without", dir.path() / "with"}).train.size(), 5000);
  const std::string message = data_error_of([&] { ltrain::data::load_sets(source, 0, {dir.path() / "without"}); });
  const std::string in_working_directory = (fs::current_path() / root).string();
  EXPECT_NE(message.find(root + "/data_batch_1.bin (" + in_working_directory + "/data_batch_1.bin): no such file"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("; data.root \"" + root + "\" was looked for in " + in_working_directory + " and " +
                         (dir.path() / "without" / root).string()),
            std::string::npos)
      << message;
}

TEST(CifarReader, EmptyFileIsAnError) {
  TempDir dir;
  const auto file = dir.path() / "test_batch.bin";
  write_file(file, "");
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
            file.string() +
                ": empty file (0 bytes): the download was interrupted; fetch it again with scripts/get-cifar10.sh");
}

TEST(CifarReader, LabelAboveNineNamesTheFileAndTheRecord) {
  TempDir dir;
  const auto file = dir.path() / "data_batch_3.bin";
  write_file(file, make_records({4, 7, 200, 12}));
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
            file.string() +
                ": record 2 (byte offset 6146) has label 200 (expected 0-9): not a CIFAR-10 binary file; fetch it "
                "again with scripts/get-cifar10.sh");
}

TEST(CifarReader, MissingFileSaysHowToGetTheData) {
  TempDir dir;
  const auto file = dir.path() / "nowhere" / "data_batch_1.bin";
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
            file.string() +
                ": no such file; run scripts/get-cifar10.sh (or point data.root at a folder with data_batch_1..5.bin "
                "and test_batch.bin)");
  // A missing root names its first file.
  const auto message = data_error_of([&] { ltrain::data::read_cifar10(dir.path() / "nowhere"); });
  EXPECT_NE(message.find((dir.path() / "nowhere" / "data_batch_1.bin").string() + ": no such file"), std::string::npos)
      << message;
  EXPECT_NE(message.find("scripts/get-cifar10.sh"), std::string::npos) << message;
}

// torchvision's Python release where the binary files are missing: data.root pointing at it, at
// the folder that holds it, or beside it (data/cifar-10-batches-bin missing, data/cifar-10-batches-py
// there) gets the one command that converts it.
TEST(CifarReader, TorchvisionsPythonReleaseGetsTheCommandThatConvertsIt) {
  TempDir dir;
  const fs::path python_release = dir.path() / "data" / "cifar-10-batches-py";
  write_file(python_release / "data_batch_1", "a pickle");
  const std::string advice = "holds torchvision's Python release of CIFAR-10, which ltrain does not read: convert it "
                             "once with bash scripts/get-cifar10.sh --from " +
                             python_release.string() +
                             " (the binary files then lie in data/cifar-10-batches-bin, data.root's default)";
  for (const fs::path& root : {python_release, dir.path() / "data", dir.path() / "data" / "cifar-10-batches-bin"}) {
    const std::string message = data_error_of([&] { ltrain::data::read_cifar10(root); });
    EXPECT_EQ(message, (root / "data_batch_1.bin").string() + ": no such file; " + python_release.string() + " " +
                           advice);
  }
  // CIFAR-100's, cifar-100-python, the same way.
  const fs::path cifar100 = dir.path() / "c100" / "cifar-100-python";
  write_file(cifar100 / "train", "a pickle");
  SourceOptions source = source_at(dir.path() / "c100" / "cifar-100-binary");
  source.source = ltrain::config::DataSource::cifar100;
  const std::string message = data_error_of([&] { ltrain::data::load_sets(source, 0); });
  EXPECT_NE(message.find(cifar100.string() + " holds torchvision's Python release of CIFAR-100, which ltrain does "
                                             "not read: convert it once with bash scripts/get-cifar100.sh --from " +
                         cifar100.string()),
            std::string::npos)
      << message;
}

TEST(CifarReader, MissingLaterFileIsNamed) {
  TempDir dir;
  for (int part = 1; part <= 4; ++part) write_file(dir.path() / ("data_batch_" + std::to_string(part) + ".bin"), make_records({1}));
  write_file(dir.path() / "test_batch.bin", make_records({1}));
  const auto message = data_error_of([&] { ltrain::data::read_cifar10(dir.path()); });
  EXPECT_NE(message.find((dir.path() / "data_batch_5.bin").string() + ": no such file"), std::string::npos) << message;
}

TEST(CifarReader, ConcatenatesTrainFilesInOrder) {
  TempDir dir;
  // File k holds records whose labels are k (and file 2 holds two records), so the order shows.
  int record = 0;
  std::vector<int64_t> expected;
  for (int part = 1; part <= 5; ++part) {
    const std::vector<int> labels(part == 2 ? 2 : 1, part);
    write_file(dir.path() / ("data_batch_" + std::to_string(part) + ".bin"), make_records(labels, record));
    record += static_cast<int>(labels.size());
    expected.insert(expected.end(), labels.begin(), labels.end());
  }
  write_file(dir.path() / "test_batch.bin", make_records({0, 8, 9}, 100));
  const auto sets = ltrain::data::read_cifar10(dir.path());

  EXPECT_TRUE(torch::equal(sets.train.labels, torch::tensor(expected, torch::kInt64)));
  ASSERT_EQ(sets.train.images.size(0), 6);
  for (int r = 0; r < 6; ++r) EXPECT_EQ(sets.train.images[r][1][2][3].item<int>(), pattern_pixel(r, 1, 2, 3));
  EXPECT_TRUE(torch::equal(sets.test.labels, torch::tensor({0, 8, 9}, torch::kInt64)));
  EXPECT_EQ(sets.test.images[2][2][31][0].item<int>(), pattern_pixel(102, 2, 31, 0));
}

TEST(CifarReader, LoadSetsDispatchesOnSource) {
  TempDir dir;
  for (int part = 1; part <= 5; ++part) write_file(dir.path() / ("data_batch_" + std::to_string(part) + ".bin"), make_records({part}));
  write_file(dir.path() / "test_batch.bin", make_records({7, 7}));
  SourceOptions source = source_at(dir.path());
  const auto files = ltrain::data::load_sets(source, 0);
  EXPECT_EQ(files.train.size(), 5);
  EXPECT_EQ(files.test.size(), 2);

  source.source = ltrain::config::DataSource::synthetic;
  source.synthetic_train_size = 12;
  source.synthetic_test_size = 5;
  const auto synthetic = ltrain::data::load_sets(source, 4);
  EXPECT_EQ(synthetic.train.size(), 12);
  EXPECT_EQ(synthetic.test.size(), 5);
  EXPECT_TRUE(torch::equal(synthetic.train.images, ltrain::data::make_synthetic(12, 5, 4).train.images));

  source.image_size = 48;
  EXPECT_EQ(ltrain::data::load_sets(source, 4).train.images.sizes(), torch::IntArrayRef({12, 3, 48, 48}));
  source.source = ltrain::config::DataSource::cifar10;
  try {
    ltrain::data::load_sets(source, 0);
    ADD_FAILURE() << "CIFAR-10 at 48x48 loaded";
  } catch (const ltrain::ConfigError& error) {
    EXPECT_STREQ(error.what(), "data.image_size: CIFAR-10's images are 32x32, not 48x48; set data.source to synthetic "
                               "to measure steps at 48x48, or leave data.image_size at 32");
  }
}

// ---- the real subset -------------------------------------------------------------------------------

TEST(CifarMini, SizesAndBalancedClasses) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  const auto sets = ltrain::data::read_cifar10(root);
  ASSERT_EQ(sets.train.images.sizes(), torch::IntArrayRef({5000, 3, 32, 32}));
  ASSERT_EQ(sets.test.images.sizes(), torch::IntArrayRef({1000, 3, 32, 32}));
  EXPECT_TRUE(torch::equal(torch::bincount(sets.train.labels), torch::full({10}, 500, torch::kInt64)));
  EXPECT_TRUE(torch::equal(torch::bincount(sets.test.labels), torch::full({10}, 100, torch::kInt64)));
}

TEST(CifarMini, RecordsEqualTheRawFileBytes) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  const auto sets = ltrain::data::read_cifar10(root);
  // Pixel (c, y, x) of a record is its byte 1 + 1024 c + 32 y + x.
  const auto check = [](const torch::Tensor& image, int64_t label, const std::string& record, const char* what) {
    EXPECT_EQ(label, byte_at(record, 0)) << what;
    for (int c : {0, 1, 2})
      for (auto [y, x] : {std::pair{0, 0}, std::pair{0, 1}, std::pair{1, 0}, std::pair{16, 9}, std::pair{31, 31}})
        EXPECT_EQ(image[c][y][x].item<int>(), byte_at(record, 1 + 1024 * c + 32 * y + x))
            << what << " channel " << c << " y " << y << " x " << x;
  };
  check(sets.test.images[0], sets.test.labels[0].item<int64_t>(), read_bytes(root / "test_batch.bin", 0, 3073),
        "first test record");
  // The last train image is the last record of data_batch_5.bin.
  check(sets.train.images[4999], sets.train.labels[4999].item<int64_t>(),
        read_bytes(root / "data_batch_5.bin", 999 * 3073, 3073), "last train record");
  // The 1001st train image is the first record of data_batch_2.bin.
  check(sets.train.images[1000], sets.train.labels[1000].item<int64_t>(),
        read_bytes(root / "data_batch_2.bin", 0, 3073), "first record of data_batch_2");
}

// ---- published files: SHA-256 and record counts ---------------------------------------------------

/// The warning lines (message only) that `action` logs.
template <class Action>
std::vector<std::string> warnings_of(Action action) {
  std::ostringstream text;
  auto capture = std::make_shared<spdlog::sinks::ostream_sink_mt>(text);
  capture->set_pattern("%v");
  capture->set_level(spdlog::level::warn);
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.push_back(capture);
  action();
  sinks.pop_back();
  std::vector<std::string> lines;
  std::istringstream in(text.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// name -> SHA-256 from `sha256sum`-style lines ("<64 hex>  name.bin") in `text`.
std::map<std::string, std::string> listed_sums(const std::string& text) {
  std::map<std::string, std::string> sums;
  const std::regex line("([0-9a-f]{64})  (\\S+\\.bin)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it)
    sums[(*it)[2]] = (*it)[1];
  return sums;
}

std::map<std::string, std::string> known_sums(std::string_view release) {
  std::map<std::string, std::string> sums;
  for (const auto& file : ltrain::data::known_cifar10_files())
    if (file.release == release) sums[std::string(file.name)] = std::string(file.sha256);
  return sums;
}

TEST(Sha256, StandardTestVectors) {
  EXPECT_EQ(ltrain::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ltrain::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // padding spills over
  EXPECT_EQ(ltrain::sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(ltrain::sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CifarPublished, KnownSumsAreTheDownloadScriptsAndCifarMinis) {
  const std::map<std::string, std::string> script = listed_sums(ltrain::testing::read_file(LTRAIN_SOURCE_DIR "/scripts/get-cifar10.sh"));
  EXPECT_EQ(script.size(), 6u);
  EXPECT_EQ(known_sums("CIFAR-10"), script);
  for (const auto& file : ltrain::data::known_cifar10_files())
    EXPECT_EQ(file.records, file.release == "CIFAR-10" ? ltrain::data::kOfficialRecords : 1000) << file.name;
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  EXPECT_EQ(known_sums("cifar10-mini"), listed_sums(ltrain::testing::read_file(root / "SHA256SUMS")));
}

TEST(CifarPublished, AFileOfTheOfficialSizeWithOtherContentIsDamaged) {
  TempDir dir;
  const auto file = dir.path() / "data_batch_3.bin";
  const std::string zeros(static_cast<size_t>(ltrain::data::kOfficialRecords * ltrain::data::kRecordBytes), '\0');
  write_file(file, zeros);
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar10_file(file); }),
            file.string() + ": the size of CIFAR-10's data_batch_3.bin but not its content (SHA-256 " +
                ltrain::sha256_hex(zeros.data(), zeros.size()) +
                ", published bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67): the file is damaged; "
                "fetch it again with scripts/get-cifar10.sh");
  // The same bytes under a name CIFAR-10 does not use: not checked.
  fs::rename(file, dir.path() / "mine.bin");
  EXPECT_TRUE(warnings_of([&] { EXPECT_EQ(ltrain::data::read_cifar10_file(dir.path() / "mine.bin").size(), 10000); })
                  .empty());
}

TEST(CifarPublished, AFileCutAtARecordBoundaryIsReadWithOneWarning) {
  TempDir dir;
  const auto file = dir.path() / "test_batch.bin";
  write_file(file, make_records({1, 2, 3, 4, 5, 6, 7}));
  int64_t records = 0;
  EXPECT_EQ(warnings_of([&] { records = ltrain::data::read_cifar10_file(file).size(); }),
            std::vector<std::string>{file.string() + ": 7 records where CIFAR-10's test_batch.bin has 10000: training on "
                                     "part of the data set (a cut download?); get the full files with "
                                     "scripts/get-cifar10.sh"});
  EXPECT_EQ(records, 7);
  // A file cut from cifar10-mini's: 500 of its 1000 records.
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  const auto cut = dir.path() / "data_batch_2.bin";
  write_file(cut, read_bytes(root / "data_batch_2.bin", 0, 500 * ltrain::data::kRecordBytes));
  const std::vector<std::string> warnings = warnings_of([&] { ltrain::data::read_cifar10_file(cut); });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].rfind(cut.string() + ": 500 records where CIFAR-10's data_batch_2.bin has 10000", 0), 0u)
      << warnings[0];
}

TEST(CifarPublished, CifarMiniIsRecognisedAndLoadsWithoutWarnings) {
  LTRAIN_REQUIRE_CIFAR_MINI(root);
  EXPECT_TRUE(warnings_of([&] { EXPECT_EQ(ltrain::data::read_cifar10(root).train.size(), 5000); }).empty());
  // 1000 records of other content (one byte changed): someone's own subset, or a changed copy,
  // read with a warning that says so, not refused, and not called a cut download.
  TempDir dir;
  const auto file = dir.path() / "data_batch_1.bin";
  std::string records = read_bytes(root / "data_batch_1.bin", 0, 1000 * ltrain::data::kRecordBytes);
  records[1] = static_cast<char>(records[1] ^ 1);
  write_file(file, records);
  const std::vector<std::string> warnings = warnings_of([&] { ltrain::data::read_cifar10_file(file); });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].rfind(file.string() + ": the size of cifar10-mini's data_batch_1.bin (1000 records) but not "
                                              "its content (SHA-256 ",
                              0),
            0u)
      << warnings[0];
  EXPECT_NE(warnings[0].find("a changed or damaged copy, read as it is; get cifar10-mini's files again if it was "
                             "not changed on purpose"),
            std::string::npos)
      << warnings[0];
}

TEST(CifarPublished, ADamagedFileStopsTrainingWithExitCode3AndOneLine) {
  TempDir dir;
  const fs::path data = dir.path() / "data";
  write_file(data / "data_batch_1.bin",
             std::string(static_cast<size_t>(ltrain::data::kOfficialRecords * ltrain::data::kRecordBytes), '\0'));
  for (int part = 2; part <= 5; ++part) write_file(data / ("data_batch_" + std::to_string(part) + ".bin"), make_records({part}));
  write_file(data / "test_batch.bin", make_records({0, 1}));
  write_file(dir.path() / "c.json", R"({"run": {"device": "cpu", "out_dir": ")" + (dir.path() / "runs").string() +
                                        R"("}, "data": {"source": "cifar10", "root": ")" + data.string() + R"("}})");
  const fs::path log = dir.path() / "log";
  EXPECT_EQ(ltrain::testing::run_ltrain("train --config " + (dir.path() / "c.json").string(), log), 3);
  const std::string text = ltrain::testing::read_file(log);
  EXPECT_NE(text.find("error " + (data / "data_batch_1.bin").string() +
                      ": the size of CIFAR-10's data_batch_1.bin but not its content"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("the file is damaged; fetch it again with scripts/get-cifar10.sh\n"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir.path() / "runs"));  // stopped before anything was written
}

// ---- CIFAR-100: the same reader, two label bytes ---------------------------------------------------

SourceOptions cifar100_source(const fs::path& root, ltrain::config::Cifar100Labels labels) {
  SourceOptions source = source_at(root);
  source.source = ltrain::config::DataSource::cifar100;
  source.cifar100_labels = labels;
  return source;
}

TEST(Cifar100Reader, RecordsReadBackExactlyWithTheFineOrTheCoarseLabel) {
  using ltrain::config::Cifar100Labels;
  TempDir dir;
  ltrain::testing::write_cifar100_files(dir.path(), 200, 100);
  std::vector<int64_t> fine;
  std::vector<int64_t> coarse;
  for (int record = 0; record < 300; ++record) {
    fine.push_back(ltrain::testing::cifar100_fine_label(record));
    coarse.push_back(fine.back() / 5);
  }
  const auto labels = [](const std::vector<int64_t>& all, int64_t first, int64_t count) {
    return torch::tensor(std::vector<int64_t>(all.begin() + first, all.begin() + first + count), torch::kInt64);
  };
  std::vector<std::string> warnings;
  ltrain::data::TrainTestSets sets;
  warnings = warnings_of([&] { sets = ltrain::data::load_sets(cifar100_source(dir.path(), Cifar100Labels::fine), 0); });
  ASSERT_EQ(sets.train.images.sizes(), torch::IntArrayRef({200, 3, 32, 32}));
  ASSERT_EQ(sets.test.images.sizes(), torch::IntArrayRef({100, 3, 32, 32}));
  EXPECT_TRUE(torch::equal(sets.train.labels, labels(fine, 0, 200)));
  EXPECT_TRUE(torch::equal(sets.test.labels, labels(fine, 200, 100)));
  // Every pixel of every record: the R, G and B planes after the two label bytes.
  const auto expected_images = [](int64_t first, int64_t count) {
    auto images = torch::empty({count, 3, 32, 32}, torch::kUInt8);
    auto pixels = images.accessor<uint8_t, 4>();
    for (int64_t r = 0; r < count; ++r)
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < 32; ++y)
          for (int x = 0; x < 32; ++x) pixels[r][c][y][x] = pattern_pixel(static_cast<int>(first + r), c, y, x);
    return images;
  };
  EXPECT_TRUE(torch::equal(sets.train.images, expected_images(0, 200)));
  EXPECT_TRUE(torch::equal(sets.test.images, expected_images(200, 100)));
  // The official files hold 50,000 and 10,000 records: these are named, once each.
  EXPECT_EQ(warnings, (std::vector<std::string>{
                          (dir.path() / "train.bin").string() +
                              ": 200 records where CIFAR-100's train.bin has 50000: training on part of the data set "
                              "(a cut download?); get the full files with scripts/get-cifar100.sh",
                          (dir.path() / "test.bin").string() +
                              ": 100 records where CIFAR-100's test.bin has 10000: training on part of the data set "
                              "(a cut download?); get the full files with scripts/get-cifar100.sh"}));

  const auto coarse_sets = ltrain::data::load_sets(cifar100_source(dir.path(), Cifar100Labels::coarse), 0);
  EXPECT_TRUE(torch::equal(coarse_sets.train.labels, labels(coarse, 0, 200)));
  EXPECT_TRUE(torch::equal(coarse_sets.test.labels, labels(coarse, 200, 100)));
  EXPECT_TRUE(torch::equal(coarse_sets.train.images, sets.train.images));
}

TEST(Cifar100Reader, ReleasesHaveTheClassesTheConfigCounts) {
  using ltrain::config::Cifar100Labels;
  using ltrain::engine::source_options;
  DataSection data;
  EXPECT_EQ(ltrain::data::cifar_release(source_options(data)).name, "CIFAR-10");
  EXPECT_EQ(ltrain::data::cifar_release(source_options(data)).classes(), data.classes());
  EXPECT_EQ(data.classes(), 10);
  data.source = ltrain::config::DataSource::cifar100;
  for (const auto labels : {Cifar100Labels::fine, Cifar100Labels::coarse}) {
    data.cifar100_labels = labels;
    const ltrain::data::SourceOptions options = source_options(data);
    const auto& release = ltrain::data::cifar_release(options);
    EXPECT_EQ(release.name, "CIFAR-100");
    EXPECT_EQ(release.record_bytes(), 3074);
    EXPECT_EQ(release.classes(), data.classes());
  }
  EXPECT_EQ(data.classes(), 20);
  data.cifar100_labels = Cifar100Labels::fine;
  EXPECT_EQ(data.classes(), 100);
  data.source = ltrain::config::DataSource::synthetic;
  EXPECT_EQ(data.classes(), 10);
  EXPECT_THROW(ltrain::data::cifar_release(source_options(data)), std::logic_error);
  // The synthetic source draws labels below its classes.
  EXPECT_LT(ltrain::data::make_synthetic(500, 1, 0).train.labels.max().item<int64_t>(), data.classes());
}

TEST(Cifar100Reader, ALabelByteOutOfItsRangeNamesTheFileTheRecordAndTheLabel) {
  TempDir dir;
  const auto& release = ltrain::data::cifar100_release(ltrain::config::Cifar100Labels::fine);
  const auto file = dir.path() / "train.bin";
  using ltrain::testing::cifar100_record;
  write_file(file, cifar100_record(0, 19, 99) + cifar100_record(1, 3, 100) + cifar100_record(2, 20, 5));
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar_file(file, release); }),
            file.string() + ": record 1 (byte offset 3074) has fine label 100 (expected 0-99): not a CIFAR-100 binary "
                            "file; fetch it again with scripts/get-cifar100.sh");
  // The coarse byte is checked too when the fine labels are trained on.
  write_file(file, cifar100_record(0, 19, 99) + cifar100_record(1, 3, 4) + cifar100_record(2, 20, 5));
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar_file(file, release); }),
            file.string() + ": record 2 (byte offset 6148) has coarse label 20 (expected 0-19): not a CIFAR-100 "
                            "binary file; fetch it again with scripts/get-cifar100.sh");
}

TEST(Cifar100Reader, TruncatedEmptyAndMissingFilesNameTheFileAndTheScript) {
  TempDir dir;
  const auto& release = ltrain::data::cifar100_release(ltrain::config::Cifar100Labels::coarse);
  const auto file = dir.path() / "test.bin";
  // Two whole records and the first 100 bytes of a third.
  write_file(file, ltrain::testing::cifar100_record(0, 1, 5) + ltrain::testing::cifar100_record(1, 2, 10) +
                       ltrain::testing::cifar100_record(2, 3, 15).substr(0, 100));
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar_file(file, release); }),
            file.string() + ": 6248 bytes is not a whole number of 3074-byte CIFAR-100 records: the file is truncated "
                            "or not CIFAR-100 binary; fetch it again with scripts/get-cifar100.sh");
  // CIFAR-10's records (3073 bytes) are not CIFAR-100's.
  write_file(file, make_records({1, 2, 3}));
  EXPECT_NE(data_error_of([&] { ltrain::data::read_cifar_file(file, release); })
                .find(": 9219 bytes is not a whole number of 3074-byte CIFAR-100 records"),
            std::string::npos);
  write_file(file, "");
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar_file(file, release); }),
            file.string() + ": empty file (0 bytes): the download was interrupted; fetch it again with "
                            "scripts/get-cifar100.sh");
  // A folder of CIFAR-10's files: CIFAR-100's first file is named, with the script that gets it.
  TempDir cifar10;
  write_file(cifar10.path() / "data_batch_1.bin", make_records({1}));
  EXPECT_EQ(data_error_of([&] { ltrain::data::read_cifar(cifar10.path(), release); }),
            (cifar10.path() / "train.bin").string() +
                ": no such file; run scripts/get-cifar100.sh (or point data.root at a folder with train.bin and "
                "test.bin)");
  ltrain::testing::write_cifar100_files(dir.path(), 3, 2);
  std::filesystem::remove(dir.path() / "test.bin");
  EXPECT_NE(data_error_of([&] { ltrain::data::read_cifar(dir.path(), release); })
                .find((dir.path() / "test.bin").string() + ": no such file; run scripts/get-cifar100.sh"),
            std::string::npos);
  // Images other than 32x32 are refused as for CIFAR-10.
  SourceOptions source = cifar100_source(dir.path(), ltrain::config::Cifar100Labels::fine);
  source.image_size = 64;
  try {
    ltrain::data::load_sets(source, 0);
    ADD_FAILURE() << "CIFAR-100 at 64x64 loaded";
  } catch (const ltrain::ConfigError& error) {
    EXPECT_STREQ(error.what(), "data.image_size: CIFAR-100's images are 32x32, not 64x64; set data.source to "
                               "synthetic to measure steps at 64x64, or leave data.image_size at 32");
  }
}

// ---- synthetic source ---------------------------------------------------------------------------------

TEST(DataSynthetic, ShapesTypesAndRanges) {
  const auto sets = ltrain::data::make_synthetic(300, 40, 1);
  ASSERT_EQ(sets.train.images.sizes(), torch::IntArrayRef({300, 3, 32, 32}));
  ASSERT_EQ(sets.test.images.sizes(), torch::IntArrayRef({40, 3, 32, 32}));
  EXPECT_EQ(sets.train.images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(sets.train.labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(sets.test.labels.sizes(), torch::IntArrayRef({40}));
  EXPECT_EQ(sets.train.labels.min().item<int64_t>(), 0);
  EXPECT_EQ(sets.train.labels.max().item<int64_t>(), 9);
  // Uniform pixels: the full byte range shows up.
  EXPECT_EQ(sets.train.images.min().item<int>(), 0);
  EXPECT_EQ(sets.train.images.max().item<int>(), 255);
}

TEST(DataSynthetic, SameSeedSameDataOtherSeedOtherData) {
  const auto first = ltrain::data::make_synthetic(64, 16, 5);
  const auto again = ltrain::data::make_synthetic(64, 16, 5);
  const auto other = ltrain::data::make_synthetic(64, 16, 6);
  EXPECT_TRUE(torch::equal(first.train.images, again.train.images));
  EXPECT_TRUE(torch::equal(first.train.labels, again.train.labels));
  EXPECT_TRUE(torch::equal(first.test.images, again.test.images));
  EXPECT_FALSE(torch::equal(first.train.images, other.train.images));
  EXPECT_FALSE(torch::equal(first.train.labels, other.train.labels));
  EXPECT_FALSE(torch::equal(first.train.images.narrow(0, 0, 16), first.test.images));
}

TEST(DataSynthetic, ALargeSetRepeatsItsPoolAndKeepsSmallerSetsUnchanged) {
  using ltrain::data::kSyntheticPool;
  const int64_t size = 2 * kSyntheticPool + 5;
  const auto large = ltrain::data::make_synthetic(size, 3, 7);
  const auto pool = ltrain::data::make_synthetic(kSyntheticPool, 3, 7);
  ASSERT_EQ(large.train.images.size(0), size);
  ASSERT_EQ(large.train.labels.size(0), size);
  for (int64_t copy = 0; copy < 2; ++copy) {
    EXPECT_TRUE(torch::equal(large.train.images.narrow(0, copy * kSyntheticPool, kSyntheticPool), pool.train.images));
    EXPECT_TRUE(torch::equal(large.train.labels.narrow(0, copy * kSyntheticPool, kSyntheticPool), pool.train.labels));
  }
  EXPECT_TRUE(torch::equal(large.train.images.narrow(0, 2 * kSyntheticPool, 5), pool.train.images.narrow(0, 0, 5)));
  // The test set is drawn after the training pool, as for any set size.
  EXPECT_TRUE(torch::equal(large.test.images, pool.test.images));
  // A set within the pool is its prefix: the same seed's draws, independent of the size asked for.
  EXPECT_TRUE(torch::equal(ltrain::data::make_synthetic(100, 3, 7).train.images, pool.train.images.narrow(0, 0, 100)));
}

TEST(DataSynthetic, LargerImagesKeepThePoolsBytes) {
  using ltrain::data::synthetic_pool_images;
  EXPECT_EQ(synthetic_pool_images(32), ltrain::data::kSyntheticPool);
  EXPECT_EQ(synthetic_pool_images(224), 1337);  // 65536 * 32^2 / 224^2, rounded down
  EXPECT_EQ(synthetic_pool_images(64), 16384);
  const auto sets = ltrain::data::make_synthetic(10, 4, 8, 64);
  EXPECT_EQ(sets.train.images.sizes(), torch::IntArrayRef({10, 3, 64, 64}));
  EXPECT_EQ(sets.test.images.sizes(), torch::IntArrayRef({4, 3, 64, 64}));
  EXPECT_EQ(sets.train.side(), 64);
}

TEST(DataSynthetic, LeavesTheGlobalGeneratorAlone) {
  torch::manual_seed(123);
  const auto expected = torch::rand({8});
  torch::manual_seed(123);
  const auto sets = ltrain::data::make_synthetic(64, 8, 9);
  TrainLoader loader(sets.train, loader_config(16, true, 4, true), 9);
  loader.set_epoch(2);
  EXPECT_TRUE(torch::equal(torch::rand({8}), expected));
}

TEST(DataImageSet, ToMovesBothTensors) {
  const auto sets = ltrain::data::make_synthetic(4, 2, 0);
  const auto moved = sets.train.to(torch::Device(torch::kCPU));
  EXPECT_TRUE(torch::equal(moved.images, sets.train.images));
  EXPECT_TRUE(torch::equal(moved.labels, sets.train.labels));
  EXPECT_EQ(ImageSet{}.size(), 0);
}

// ---- normalization --------------------------------------------------------------------------------------

TEST(LoaderNormalizer, MatchesToTensorThenNormalize) {
  NormalizeOptions data = default_normalize();
  ASSERT_TRUE(data.normalize);
  const auto images = indexed_images(4, 3).images;
  images[0][0][0][0] = 0;  // both ends of the byte range
  images[0][1][0][0] = 255;
  const auto normalized = Normalizer(data, torch::Device(torch::kCPU))(images);
  EXPECT_EQ(normalized.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(normalized.is_contiguous());
  EXPECT_TRUE(close(normalized, reference_normalize(images, data)));

  data.normalize = false;
  EXPECT_TRUE(close(Normalizer(data, torch::Device(torch::kCPU))(images), images.to(torch::kFloat32) / 255.0));
}

// ---- training loader ------------------------------------------------------------------------------------

TEST(LoaderTrain, WithoutAugmentationABatchIsTheNormalizedImagesInOrder) {
  const auto set = indexed_images(40, 1);
  const auto data = loader_config(8, false, 4, false);
  TrainLoader loader(set, data, 11);
  loader.set_epoch(0);
  const auto batch = loader.batch(2);
  EXPECT_EQ(batch.images.sizes(), torch::IntArrayRef({8, 3, 32, 32}));
  EXPECT_EQ(batch.images.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(batch.images.is_contiguous());
  EXPECT_TRUE(close(batch.images, reference_normalize(set.images.index_select(0, batch.labels), data.normalize)));
}

TEST(LoaderTrain, ZeroShiftAndNoFlipIsIdentity) {
  const auto set = indexed_images(40, 2);
  const auto data = loader_config(8, true, 0, false);  // the crop path with padding 0
  TrainLoader loader(set, data, 12);
  for (int64_t i = 0; i < loader.batches_per_epoch(); ++i) {
    const auto batch = loader.batch(i);
    EXPECT_TRUE(close(batch.images, reference_normalize(set.images.index_select(0, batch.labels), data.normalize)));
  }
}

TEST(LoaderTrain, FlipOnlyMirrorsAboutHalfTheImages) {
  const auto set = indexed_images(128, 3);
  const auto data = loader_config(32, false, 4, true);
  TrainLoader loader(set, data, 13);
  loader.set_epoch(1);
  int64_t flipped = 0;
  for (const auto& batch : epoch_batches(loader, 1)) {
    // Each image is either itself or tensor.flip(3) of itself, normalized.
    const auto originals = set.images.index_select(0, batch.labels);
    const auto plain = reference_normalize(originals, data.normalize);
    const auto mirrored = reference_normalize(originals.flip({3}), data.normalize);
    for (int64_t b = 0; b < batch.labels.size(0); ++b) {
      const bool is_plain = close(batch.images[b], plain[b]);
      const bool is_mirrored = close(batch.images[b], mirrored[b]);
      EXPECT_NE(is_plain, is_mirrored) << "image " << batch.labels[b].item<int64_t>();
      flipped += is_mirrored ? 1 : 0;
    }
  }
  EXPECT_GT(flipped, 128 / 4);
  EXPECT_LT(flipped, 3 * 128 / 4);
}

TEST(LoaderTrain, CropOnlyEqualsPaddedSlices) {
  const auto set = indexed_images(128, 4);
  const int64_t padding = 2;
  const auto data = loader_config(32, true, padding, false);
  TrainLoader loader(set, data, 14);
  std::set<int64_t> seen_dy;
  std::set<int64_t> seen_dx;
  for (const auto& batch : epoch_batches(loader, 0))
    for (const auto& found : identify_augmentations(batch, set, data, padding, /*flips=*/false)) {
      seen_dy.insert(found.dy);
      seen_dx.insert(found.dx);
    }
  // Every shift in [-padding, padding] occurs, and no other.
  EXPECT_EQ(seen_dy, (std::set<int64_t>{-2, -1, 0, 1, 2}));
  EXPECT_EQ(seen_dx, (std::set<int64_t>{-2, -1, 0, 1, 2}));
}

TEST(LoaderTrain, CropThenFlipEqualsTorchvisionReference) {
  const auto set = indexed_images(64, 5);
  const int64_t padding = 3;
  const auto data = loader_config(16, true, padding, true);
  TrainLoader loader(set, data, 15);
  int64_t flipped = 0;
  int64_t shifted = 0;
  for (const auto& batch : epoch_batches(loader, 2))
    for (const auto& found : identify_augmentations(batch, set, data, padding, /*flips=*/true)) {
      flipped += found.flip ? 1 : 0;
      shifted += (found.dy != 0 || found.dx != 0) ? 1 : 0;
    }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 64);
  EXPECT_GT(shifted, 32);
}

TEST(LoaderTrain, CropThenFlipAtAnotherSideEqualsTorchvisionReference) {
  const auto set = indexed_images(24, 25, 40);
  const int64_t padding = 2;
  const auto data = loader_config(8, true, padding, true);
  TrainLoader loader(set, data, 26);
  int64_t images = 0;
  for (const auto& batch : epoch_batches(loader, 1)) {
    EXPECT_EQ(batch.images.sizes(), torch::IntArrayRef({8, 3, 40, 40}));
    images += static_cast<int64_t>(identify_augmentations(batch, set, data, padding, /*flips=*/true).size());
  }
  EXPECT_EQ(images, 24);
}

TEST(LoaderTrain, WithoutShuffleEveryEpochIsInFileOrderWithTheSameAugmentation) {
  const auto set = indexed_images(40, 27);
  auto data = loader_config(8, true, 2, true);
  TrainLoader shuffled(set, data, 28);
  data.shuffle = false;
  TrainLoader in_order(set, data, 28);
  for (int64_t epoch : {0, 1}) {
    std::vector<torch::Tensor> labels;
    std::map<int64_t, std::tuple<int64_t, int64_t, bool>> in_order_augmentation;
    for (const auto& batch : epoch_batches(in_order, epoch)) {
      labels.push_back(batch.labels);
      const auto found = identify_augmentations(batch, set, data, 2, /*flips=*/true);
      for (size_t b = 0; b < found.size(); ++b)
        in_order_augmentation[batch.labels[static_cast<int64_t>(b)].item<int64_t>()] = {found[b].dy, found[b].dx,
                                                                                      found[b].flip};
    }
    EXPECT_TRUE(torch::equal(torch::cat(labels), torch::arange(40, torch::kInt64))) << "epoch " << epoch;
    // Each image is cropped and flipped as the shuffling loader does it: only the order differs.
    for (const auto& batch : epoch_batches(shuffled, epoch)) {
      const auto found = identify_augmentations(batch, set, data, 2, /*flips=*/true);
      for (size_t b = 0; b < found.size(); ++b)
        EXPECT_EQ(in_order_augmentation.at(batch.labels[static_cast<int64_t>(b)].item<int64_t>()),
                  std::make_tuple(found[b].dy, found[b].dx, found[b].flip));
    }
  }
}

TEST(LoaderTrain, CutoutZeroesOneClippedSquarePerImageAndNothingElse) {
  const auto set = indexed_images(64, 6);
  auto data = loader_config(16, true, 4, true);
  TrainLoader plain(set, data, 17);
  data.cutout = 8;
  TrainLoader cut(set, data, 17);
  int64_t clipped = 0;
  for (int64_t epoch : {0, 3}) {
    const auto plain_batches = epoch_batches(plain, epoch);
    const auto cut_batches = epoch_batches(cut, epoch);
    for (size_t i = 0; i < cut_batches.size(); ++i) {
      // The same order, crops and flips with and without cutout: it only adds its own draws.
      ASSERT_TRUE(torch::equal(cut_batches[i].labels, plain_batches[i].labels));
      const auto changed = (cut_batches[i].images != plain_batches[i].images).any(1);  // [B,32,32] bool
      EXPECT_TRUE(torch::equal(cut_batches[i].images.masked_select(changed.unsqueeze(1)),
                               torch::zeros({3 * changed.sum().item<int64_t>()})));
      for (int64_t b = 0; b < changed.size(0); ++b) {
        const auto rows = changed[b].any(1).nonzero();     // [r,1]
        const auto columns = changed[b].any(0).nonzero();  // [c,1]
        const int64_t height = rows.size(0), width = columns.size(0);
        // A square of side 8 centred anywhere in the image keeps 4 to 8 rows and columns, contiguous.
        EXPECT_GE(height, 4);
        EXPECT_LE(height, 8);
        EXPECT_GE(width, 4);
        EXPECT_LE(width, 8);
        if (height > 0) {
          EXPECT_EQ(rows[-1][0].item<int64_t>() - rows[0][0].item<int64_t>() + 1, height);
        }
        if (width > 0) {
          EXPECT_EQ(columns[-1][0].item<int64_t>() - columns[0][0].item<int64_t>() + 1, width);
        }
        EXPECT_EQ(changed[b].sum().item<int64_t>(), height * width);  // the whole rectangle
        clipped += (height < 8 || width < 8) ? 1 : 0;
      }
    }
  }
  EXPECT_GT(clipped, 0);  // squares at the border are cut short
}

TEST(LoaderTrain, PaddedPixelsAreMinusMeanOverStd) {
  ImageSet white{torch::full({32, 3, 32, 32}, 255, torch::kUInt8), torch::arange(32, torch::kInt64)};
  const auto data = loader_config(32, true, 4, true);
  TrainLoader loader(white, data, 16);
  const auto images = loader.batch(0).images;  // [32,3,32,32]
  for (int64_t c = 0; c < 3; ++c) {
    const auto plane = images.select(1, c);
    const float padded = static_cast<float>(-data.normalize.mean[c] / data.normalize.std[c]);
    const float white_value = static_cast<float>((1.0 - data.normalize.mean[c]) / data.normalize.std[c]);
    const auto is_padded = (plane - padded).abs().lt(1e-5);
    const auto is_white = (plane - white_value).abs().lt(1e-5);
    EXPECT_TRUE(is_padded.logical_or(is_white).all().item<bool>()) << "channel " << c;
    EXPECT_GT(is_padded.sum().item<int64_t>(), 0) << "channel " << c;
    EXPECT_GT(is_white.sum().item<int64_t>(), 0) << "channel " << c;
  }
}

TEST(LoaderTrain, SameSeedAndEpochSameBatches) {
  const auto set = indexed_images(100, 6);
  const auto data = loader_config(16, true, 4, true);
  TrainLoader first(set, data, 21);
  TrainLoader second(set, data, 21);
  const auto a = epoch_batches(first, 3);
  epoch_batches(first, 4);
  const auto again = epoch_batches(first, 3);  // the same loader, back to epoch 3
  const auto b = epoch_batches(second, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].images, b[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].labels, b[i].labels)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].images, again[i].images)) << "batch " << i;
    EXPECT_TRUE(torch::equal(a[i].labels, again[i].labels)) << "batch " << i;
  }
}

TEST(LoaderTrain, OtherEpochOrSeedOtherOrder) {
  const auto set = indexed_images(100, 7);
  const auto data = loader_config(16, true, 4, true);
  TrainLoader loader(set, data, 22);
  TrainLoader other_seed(set, data, 23);
  loader.set_epoch(0);
  const auto epoch0 = loader.batch(0).labels;
  loader.set_epoch(1);
  EXPECT_FALSE(torch::equal(loader.batch(0).labels, epoch0));
  other_seed.set_epoch(0);
  EXPECT_FALSE(torch::equal(other_seed.batch(0).labels, epoch0));
}

TEST(LoaderTrain, EachImageAtMostOncePerEpochAndTheRemainderDropped) {
  const auto set = indexed_images(100, 8);
  TrainLoader loader(set, loader_config(16, true, 4, true), 24);
  EXPECT_EQ(loader.images_per_step(), 16);
  EXPECT_EQ(loader.batches_per_epoch(), 6);  // 100 / 16, the last 4 images dropped
  std::vector<torch::Tensor> labels;
  for (const auto& batch : epoch_batches(loader, 5)) {
    EXPECT_EQ(batch.labels.size(0), 16);
    labels.push_back(batch.labels);
  }
  const auto all = torch::cat(labels);
  EXPECT_EQ(std::get<0>(torch::_unique(all)).size(0), 96);
  EXPECT_GE(all.min().item<int64_t>(), 0);
  EXPECT_LT(all.max().item<int64_t>(), 100);
  EXPECT_THROW(loader.batch(6), std::out_of_range);
}

TEST(LoaderTrain, BatchLargerThanTheSetIsAConfigError) {
  EXPECT_THROW(TrainLoader(indexed_images(10, 9), loader_config(16, false, 4, false), 0), ltrain::ConfigError);
}

// ---- progressive resizing --------------------------------------------------------------------------------

TEST(ProgressiveResize, ZeroEpochsIsOff) {
  ltrain::config::RunConfig config;
  config.data.progressive_start_size = 16;
  config.data.progressive_epochs = 0;
  const ProgressiveResize off = ltrain::engine::train_loader_options(config).progressive;
  EXPECT_EQ(off.start_size, 0);
  for (int64_t epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(off.side(32, epoch), 32);
}

TEST(LoaderTrain, ABatchIsOneStepsImagesTheMicroBatchTimesTheAccumulationSteps) {
  ltrain::config::RunConfig config;
  config.data.batch_size = 8;
  config.optim.accumulation_steps = 3;
  const TrainLoaderOptions options = ltrain::engine::train_loader_options(config);
  EXPECT_EQ(options.images_per_step, 24);
  TrainLoader loader(indexed_images(100, 4), options, 0);
  EXPECT_EQ(loader.images_per_step(), 24);
  EXPECT_EQ(loader.batches_per_epoch(), 4);  // 100 images hold 4 steps of 24
  EXPECT_EQ(loader.batch(3).labels.size(0), 24);
}

TEST(ProgressiveResize, SidesGrowLinearlyInStepsToTheFullSide) {
  const ProgressiveResize sixteen{/*start_size=*/16, /*epochs=*/8, /*size_step=*/4};
  std::vector<int64_t> sides;
  for (int64_t epoch = 0; epoch < 10; ++epoch) sides.push_back(sixteen.side(32, epoch));
  // 16 + 16 * e / 8 = 16, 18, 20, ..., 30, rounded down to multiples of 4; full from epoch 8.
  EXPECT_EQ(sides, (std::vector<int64_t>{16, 16, 20, 20, 24, 24, 28, 28, 32, 32}));

  // A step coarser than the growth keeps the start side until the end; a start side that is not
  // a multiple of the step is never rounded below itself.
  EXPECT_EQ((ProgressiveResize{24, 3, 8}.side(32, 2)), 24);
  EXPECT_EQ((ProgressiveResize{18, 4, 8}.side(32, 1)), 18);
  EXPECT_EQ((ProgressiveResize{18, 4, 8}.side(32, 2)), 24);
  // Off, or a start side not below the images' side: always the full side.
  EXPECT_EQ((ProgressiveResize{0, 5, 4}.side(32, 0)), 32);
  EXPECT_EQ((ProgressiveResize{32, 5, 4}.side(32, 0)), 32);
  EXPECT_EQ((ProgressiveResize{112, 10, 32}.side(224, 5)), 160);
}

TEST(LoaderTrain, ProgressiveResizingScalesEachEpochsBatchesAndChangesNothingElse) {
  const auto set = indexed_images(64, 21);
  const TrainLoaderOptions full = loader_config(16, true, 4, true);
  TrainLoaderOptions progressive = full;
  progressive.progressive = {/*start_size=*/16, /*epochs=*/2, /*size_step=*/8};
  TrainLoader plain(set, full, 5), scaled(set, progressive, 5);
  namespace F = torch::nn::functional;
  for (const auto& [epoch, side] : std::vector<std::pair<int64_t, int64_t>>{{0, 16}, {1, 24}, {2, 32}, {3, 32}}) {
    plain.set_epoch(epoch);
    scaled.set_epoch(epoch);
    EXPECT_EQ(scaled.batch_side(), side) << "epoch " << epoch;
    for (int64_t index = 0; index < plain.batches_per_epoch(); ++index) {
      const Batch a = plain.batch(index), b = scaled.batch(index);
      EXPECT_TRUE(torch::equal(a.labels, b.labels)) << "epoch " << epoch;  // same order
      // The same crop and flip, then torchvision's Resize(side, antialias=True) on tensors.
      const auto expected = side == 32 ? a.images
                                       : F::interpolate(a.images, F::InterpolateFuncOptions()
                                                                      .size(std::vector<int64_t>{side, side})
                                                                      .mode(torch::kBilinear)
                                                                      .align_corners(false)
                                                                      .antialias(true));
      EXPECT_EQ(b.images.sizes(), torch::IntArrayRef({16, 3, side, side})) << "epoch " << epoch;
      EXPECT_TRUE(close(b.images, expected)) << "epoch " << epoch;
    }
  }
}

TEST(LoaderTrain, AProgressiveStartSizeNotBelowTheImagesSideIsAConfigError) {
  TrainLoaderOptions data = loader_config(8, true, 4, true);
  data.progressive = {/*start_size=*/32, /*epochs=*/2, /*size_step=*/4};
  try {
    TrainLoader(indexed_images(16, 1), data, 0);
    FAIL() << "no error";
  } catch (const ltrain::ConfigError& error) {
    EXPECT_EQ(std::string(error.what()),
              "data.progressive_start_size: 32 is not below the images' side (32); use a smaller side or 0 (off)");
  }
}

// ---- evaluation loader -----------------------------------------------------------------------------------

TEST(LoaderEval, CoversEveryImageOnceWithAShortLastBatch) {
  const auto set = indexed_images(10, 10);
  const EvalLoaderOptions data{/*batch_size=*/4, default_normalize()};
  EvalLoader loader(set, data);
  EXPECT_EQ(loader.size(), 10);
  ASSERT_EQ(loader.num_batches(), 3);
  std::vector<int64_t> sizes;
  std::vector<torch::Tensor> labels;
  std::vector<torch::Tensor> images;
  for (int64_t i = 0; i < loader.num_batches(); ++i) {
    const auto batch = loader.batch(i);
    sizes.push_back(batch.labels.size(0));
    labels.push_back(batch.labels);
    images.push_back(batch.images);
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_TRUE(torch::equal(torch::cat(labels), torch::arange(10, torch::kInt64)));
  EXPECT_TRUE(close(torch::cat(images), reference_normalize(set.images, data.normalize)));
  EXPECT_THROW(loader.batch(3), std::out_of_range);
}

// ---- on a GPU ----------------------------------------------------------------------------------------------

TEST(LoaderDevice, SameBatchesAsOnTheCpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  const auto set = indexed_images(100, 11);
  const auto data = loader_config(16, true, 4, true);
  TrainLoader cpu(set, data, 31);
  TrainLoader gpu(set.to(torch::Device(torch::kCUDA)), data, 31);
  const auto expected = epoch_batches(cpu, 2);
  const auto got = epoch_batches(gpu, 2);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(got[i].images.is_cuda());
    EXPECT_TRUE(torch::equal(got[i].labels.cpu(), expected[i].labels)) << "batch " << i;
    EXPECT_TRUE(close(got[i].images.cpu(), expected[i].images)) << "batch " << i;
  }
  const EvalLoaderOptions eval_options{/*batch_size=*/16, data.normalize};
  EvalLoader eval(set.to(torch::Device(torch::kCUDA)), eval_options);
  EXPECT_TRUE(close(eval.batch(eval.num_batches() - 1).images.cpu(), EvalLoader(set, eval_options).batch(6).images));
}

TEST(LoaderDevice, PreparesABatchBesideTheStepBeforeIt_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if LTRAIN_WITH_CUDA
  const torch::Device device(torch::kCUDA);
  const auto set = indexed_images(100, 11);
  const auto data = loader_config(16, true, 4, true);
  TrainLoader on_gpu(set.to(device), data, 31);
  // A kernel's first launch in a process loads its code, which waits for the GPU's work.
  on_gpu.batch(1);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  current.synchronize();
  at::cuda::sleep(1LL << 30);  // the step before: about half a second of one block
  const Batch batch = on_gpu.batch(2);
  bool made_first = false;
  while (!current.query())
    if (gpu::ahead_done(device)) {
      made_first = true;
      break;
    }
  EXPECT_TRUE(made_first) << "the batch's kernels waited for the work queued before them";
  TrainLoader on_cpu(set, data, 31);
  EXPECT_TRUE(close(batch.images.cpu(), on_cpu.batch(2).images));
#endif
}

TEST(LoaderDevice, TheHostMakesAtMostTwoBatchesAheadOfTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if LTRAIN_WITH_CUDA
  const torch::Device device(torch::kCUDA);
  TrainLoader on_gpu(indexed_images(100, 11).to(device), loader_config(16, true, 4, true), 31);
  // A kernel's first launch in a process loads its code, which waits for the GPU's work.
  std::vector<Batch> batches{on_gpu.batch(0)};
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  current.synchronize();
  at::cuda::sleep(1LL << 29);  // the step before: about a quarter of a second
  at::cuda::CUDAEvent step_done;
  step_done.record(current);
  batches.push_back(on_gpu.batch(1));
  batches.push_back(on_gpu.batch(2));
  EXPECT_FALSE(step_done.query()) << "the host waited for the GPU before two batches were ahead";
  batches.push_back(on_gpu.batch(3));  // the first after the step is taken only after it
  EXPECT_TRUE(step_done.query()) << "the host made a third batch while two were ahead";
#endif
}

TEST(LoaderDevice, AStepReadsABatchOnlyOnceItIsMadeAndANewEpochWaitsForIt_CUDA) {
  LTRAIN_REQUIRE_CUDA();
#if LTRAIN_WITH_CUDA
  const torch::Device device(torch::kCUDA);
  const auto set = indexed_images(100, 11);
  auto data = loader_config(16, true, 4, true);
  data.cutout = 8;
  TrainLoader on_cpu(set, data, 31);
  TrainLoader on_gpu(set.to(device), data, 31);
  // A kernel's first launch in a process loads its code, which waits for the GPU's work.
  on_gpu.batch(0);
  c10::cuda::getCurrentCUDAStream().synchronize();
  const auto hold_up_ahead = [&] {
    gpu::run_ahead(device, [] {
      at::cuda::sleep(1LL << 29);
      return std::vector<torch::Tensor>{};
    });
  };
  // The current stream reads the batch behind the work ahead of it.
  hold_up_ahead();
  EXPECT_TRUE(close(on_gpu.batch(4).images.cpu(), on_cpu.batch(4).images));
  // A batch still being made when the epoch's order is replaced: it reads the old one, whose memory
  // the new epoch's tensors would otherwise take.
  hold_up_ahead();
  const Batch last_of_epoch = on_gpu.batch(5);
  on_gpu.set_epoch(1);
  on_cpu.set_epoch(1);
  EXPECT_TRUE(torch::equal(on_gpu.batch(0).labels.cpu(), on_cpu.batch(0).labels));
  on_cpu.set_epoch(0);
  EXPECT_TRUE(close(last_of_epoch.images.cpu(), on_cpu.batch(5).images));
#endif
}

}  // namespace
