#include "ltrain/data/cifar10.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <string>
#include <system_error>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/sha256.h"

namespace ltrain::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFetchHint = "fetch it again with scripts/get-cifar10.sh";

std::vector<fs::path> train_files(const fs::path& root) {
  std::vector<fs::path> files;
  for (int part = 1; part <= 5; ++part) files.push_back(root / fmt::format("data_batch_{}.bin", part));
  return files;
}

fs::path test_file(const fs::path& root) { return root / "test_batch.bin"; }

void require_file(const fs::path& file) {
  if (const std::string problem = files::not_a_regular_file(file); !problem.empty())
    throw DataError(fmt::format("{}: {}; run scripts/get-cifar10.sh (or point data.root at a folder with "
                                "data_batch_1..5.bin and test_batch.bin)",
                                file.string(), problem));
}

/// Checks the `records` records at `bytes`, read from `file`, against the published files of its
/// name: the official size must have the official content (DataError: damaged); another number of
/// records is worth a warning unless a known subset has exactly this file. Hashes only files
/// of a published size.
void check_against_published(const fs::path& file, const uint8_t* bytes, int64_t records) {
  const std::string name = file.filename().string();
  const auto& known = known_cifar10_files();
  if (std::none_of(known.begin(), known.end(), [&](const KnownFile& k) { return k.name == name; })) return;
  const auto same_size =
      std::find_if(known.begin(), known.end(), [&](const KnownFile& k) { return k.name == name && k.records == records; });
  if (same_size != known.end()) {
    const std::string digest = sha256_hex(bytes, static_cast<size_t>(records * kRecordBytes));
    if (digest == same_size->sha256) return;
    if (records == kOfficialRecords)
      throw DataError(fmt::format("{}: the size of CIFAR-10's {} but not its content (SHA-256 {}, published {}): the "
                                  "file is damaged; {}",
                                  file.string(), name, digest, same_size->sha256, kFetchHint));
  }
  spdlog::warn("{}: {} record{} where CIFAR-10's {} has {}: training on part of the data set (a cut download?); "
               "get the full files with scripts/get-cifar10.sh",
               file.string(), records, records == 1 ? "" : "s", name, kOfficialRecords);
}

ImageSet concatenate(const std::vector<ImageSet>& parts) {
  std::vector<torch::Tensor> images;
  std::vector<torch::Tensor> labels;
  for (const auto& part : parts) {
    images.push_back(part.images);
    labels.push_back(part.labels);
  }
  return {torch::cat(images, 0), torch::cat(labels, 0)};
}

}  // namespace

ImageSet ImageSet::to(const torch::Device& device) const { return {images.to(device), labels.to(device)}; }

const std::vector<KnownFile>& known_cifar10_files() {
  static const std::vector<KnownFile> files{
      {"data_batch_1.bin", kOfficialRecords, "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5", "CIFAR-10"},
      {"data_batch_2.bin", kOfficialRecords, "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed", "CIFAR-10"},
      {"data_batch_3.bin", kOfficialRecords, "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67", "CIFAR-10"},
      {"data_batch_4.bin", kOfficialRecords, "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48", "CIFAR-10"},
      {"data_batch_5.bin", kOfficialRecords, "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add", "CIFAR-10"},
      {"test_batch.bin", kOfficialRecords, "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b", "CIFAR-10"},
      {"data_batch_1.bin", 1000, "1c5f9ea0fc1111d586f29115efd3db25eecf7db27b29aaebbe84721446b052cc", "cifar10-mini"},
      {"data_batch_2.bin", 1000, "1ff6b481724f6dd4d0e45abc5a69908df8240eb59d06b4386f60e8a0b6e0bd33", "cifar10-mini"},
      {"data_batch_3.bin", 1000, "58abe1a21b6aae11f861d07d539c5816d4374e828abc5010445aba0c191c6612", "cifar10-mini"},
      {"data_batch_4.bin", 1000, "ea25e1f01851da5455ca82f9e2d91fc561863f74916aeaf27fb02652156d2cda", "cifar10-mini"},
      {"data_batch_5.bin", 1000, "cefdf2fa5ec8ab1a9c29b878e6c61bfe713b3d18e6ab90428e45bd9ec5d44d93", "cifar10-mini"},
      {"test_batch.bin", 1000, "2874326af7bc2185faa47540a6da15a077e5b66659f8e479abb9ab628170fa86", "cifar10-mini"}};
  return files;
}

ImageSet read_cifar10_file(const std::filesystem::path& file) {
  require_file(file);
  std::error_code size_error;
  const auto file_bytes = fs::file_size(file, size_error);
  if (size_error)
    throw DataError(fmt::format("{}: cannot read its size ({}); check its permissions", file.string(),
                                size_error.message()));
  const auto bytes = static_cast<int64_t>(file_bytes);
  if (bytes == 0)
    throw DataError(fmt::format("{}: empty file (0 bytes): the download was interrupted; {}", file.string(),
                                kFetchHint));
  if (bytes % kRecordBytes != 0)
    throw DataError(fmt::format("{}: {} bytes is not a whole number of {}-byte CIFAR-10 records: the file is "
                                "truncated or not CIFAR-10 binary; {}",
                                file.string(), bytes, kRecordBytes, kFetchHint));
  const int64_t records = bytes / kRecordBytes;

  // One bulk read straight into a [N,3073] uint8 tensor; labels and planes are split by slicing.
  auto raw = torch::empty({records, kRecordBytes}, torch::kUInt8);
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()), static_cast<std::streamsize>(bytes));
  if (!in || in.gcount() != static_cast<std::streamsize>(bytes))
    throw DataError(fmt::format("{}: read {} of {} bytes: the file changed or cannot be read; {}", file.string(),
                                static_cast<int64_t>(in.gcount()), bytes, kFetchHint));
  check_against_published(file, raw.data_ptr<uint8_t>(), records);

  const auto label_bytes = raw.select(1, 0);  // [N] uint8
  const auto bad_records = torch::nonzero(label_bytes >= kNumClasses);
  if (bad_records.size(0) > 0) {
    const auto record = bad_records[0][0].item<int64_t>();
    const auto label = static_cast<int>(label_bytes[record].item<uint8_t>());
    throw DataError(fmt::format("{}: record {} (byte offset {}) has label {} (expected 0-9): not a CIFAR-10 binary "
                                "file; {}",
                                file.string(), record, record * kRecordBytes, label, kFetchHint));
  }

  ImageSet set;
  set.labels = label_bytes.to(torch::kInt64);  // [N] int64
  // [N,3072] -> [N,3,32,32]: the record already holds the R, G and B planes in row-major order.
  set.images = raw.narrow(1, 1, kPixelBytes).contiguous().view({records, kChannels, kImageSide, kImageSide});
  return set;
}

TrainTestSets read_cifar10(const std::filesystem::path& root) {
  // Check every file before reading any, so a missing one is reported at once.
  const auto train_paths = train_files(root);
  for (const auto& file : train_paths) require_file(file);
  require_file(test_file(root));

  // One thread per file: reading and hashing 30 MB each.
  std::vector<std::future<ImageSet>> reads;
  for (const auto& file : train_paths) reads.push_back(std::async(std::launch::async, read_cifar10_file, file));
  std::future<ImageSet> test_read = std::async(std::launch::async, read_cifar10_file, test_file(root));
  std::vector<ImageSet> train_parts;
  for (auto& read : reads) train_parts.push_back(read.get());  // the first failing file in order throws
  return {concatenate(train_parts), test_read.get()};
}

int64_t synthetic_pool_images(int64_t image_size) {
  return std::max<int64_t>(1, kSyntheticPool * kImageSide * kImageSide / (image_size * image_size));
}

TrainTestSets make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed, int64_t image_size) {
  // A private generator: the global one (model init, dropout) must not depend on the data source.
  auto generator = at::detail::createCPUGenerator(seed);
  const int64_t pool = synthetic_pool_images(image_size);
  const auto draw = [&](int64_t count) {
    const int64_t drawn = std::min(count, pool);
    ImageSet set;
    set.images = torch::randint(0, 256, {drawn, kChannels, image_size, image_size}, generator,
                                torch::TensorOptions().dtype(torch::kUInt8));
    set.labels = torch::randint(0, kNumClasses, {drawn}, generator, torch::TensorOptions().dtype(torch::kInt64));
    if (count > drawn) {
      const int64_t copies = (count + drawn - 1) / drawn;
      set.images = set.images.repeat({copies, 1, 1, 1}).narrow(0, 0, count).contiguous();
      set.labels = set.labels.repeat({copies}).narrow(0, 0, count).contiguous();
    }
    return set;
  };
  TrainTestSets sets;
  sets.train = draw(train_size);
  sets.test = draw(test_size);
  return sets;
}

TrainTestSets load_sets(const config::DataSection& data, uint64_t seed) {
  switch (data.source) {
    case config::DataSource::cifar10:
      if (data.image_size != kImageSide)
        throw ConfigError(fmt::format("data.image_size: CIFAR-10's images are {0}x{0}, not {1}x{1}; set data.source to "
                                      "synthetic to measure steps at {1}x{1}, or leave data.image_size at {0}",
                                      kImageSide, data.image_size));
      return read_cifar10(data.root);
    case config::DataSource::synthetic:
      return make_synthetic(data.synthetic_train_size, data.synthetic_test_size, seed, data.image_size);
  }
  throw std::logic_error(fmt::format("{}:{}: unhandled data.source", __FILE__, __LINE__));
}

}  // namespace ltrain::data
