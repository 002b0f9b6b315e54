#include "ltrain/data/cifar10.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "ltrain/core/errors.h"

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
  std::error_code ignored;
  if (!fs::is_regular_file(file, ignored))
    throw DataError(fmt::format("{}: no such file; run scripts/get-cifar10.sh (or point data.root at a folder with "
                                "data_batch_1..5.bin and test_batch.bin)",
                                file.string()));
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

  std::vector<ImageSet> train_parts;
  for (const auto& file : train_paths) train_parts.push_back(read_cifar10_file(file));
  return {concatenate(train_parts), read_cifar10_file(test_file(root))};
}

TrainTestSets make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed) {
  // A private generator: the global one (model init, dropout) must not depend on the data source.
  auto generator = at::detail::createCPUGenerator(seed);
  const auto draw = [&generator](int64_t count) {
    const int64_t drawn = std::min(count, kSyntheticPool);
    ImageSet set;
    set.images = torch::randint(0, 256, {drawn, kChannels, kImageSide, kImageSide}, generator,
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
      return read_cifar10(data.root);
    case config::DataSource::synthetic:
      return make_synthetic(data.synthetic_train_size, data.synthetic_test_size, seed);
  }
  throw std::logic_error(fmt::format("{}:{}: unhandled data.source", __FILE__, __LINE__));
}

}  // namespace ltrain::data
