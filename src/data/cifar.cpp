#include "ltrain/data/cifar.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <string>
#include <system_error>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"
#include "ltrain/core/sha256.h"

namespace ltrain::data {
namespace {

namespace fs = std::filesystem;

std::string fetch_hint(const CifarRelease& release) {
  return fmt::format("fetch it again with {}", release.fetch_script);
}

/// Where torchvision's Python release of `release` lies in or beside `folder`; empty when nowhere.
fs::path python_release_near(const fs::path& folder, const CifarRelease& release) {
  const std::string_view name = release.python_folder;
  std::error_code unreadable;  // a folder that cannot be read holds nothing here
  for (const fs::path& candidate : {folder, folder / name, folder.parent_path() / name})
    if (fs::is_regular_file(candidate / release.python_file, unreadable)) return candidate;
  return {};
}

/// `path`, and for a relative one also where it leads from the working directory.
std::string with_absolute(const fs::path& path) {
  std::error_code no_working_folder;
  const fs::path absolute = fs::absolute(path, no_working_folder).lexically_normal();
  if (path.is_absolute() || no_working_folder) return path.string();
  return fmt::format("{} ({})", path.string(), absolute.string());
}

void require_file(const fs::path& file, const CifarRelease& release) {
  const std::string problem = files::not_a_regular_file(file);
  if (problem.empty()) return;
  std::error_code no_working_folder;
  const fs::path python_release = python_release_near(fs::absolute(file, no_working_folder).parent_path(), release);
  if (!python_release.empty())
    throw DataError(fmt::format("{}: {}; {} holds torchvision's Python release of {}, which ltrain does not read: "
                                "convert it once with bash {} --from {} (the binary files then lie in "
                                "data/{}, data.root's default)",
                                file.string(), problem, python_release.string(), release.name, release.fetch_script,
                                python_release.string(), release.binary_folder));
  throw DataError(fmt::format("{}: {}; run {} (or point data.root at a folder with {})", with_absolute(file), problem,
                              release.fetch_script, release.folder_contents));
}

/// Checks the `records` records at `bytes`, read from `file`, against the release's published
/// files of its name: a file with a published SHA-256 must have that content at the official size
/// (DataError: damaged); another number of records than the release's is worth a warning, returned
/// for the caller to log ("" for none), unless a known subset has exactly this file (a subset's size
/// with other content: a warning that says so). Hashes only files of a published size.
std::string check_against_published(const fs::path& file, const uint8_t* bytes, int64_t records,
                                    const CifarRelease& release) {
  const std::string name = file.filename().string();
  std::vector<ReleaseFile> files = release.train_files;
  files.push_back(release.test_file);
  const auto official = std::find_if(files.begin(), files.end(), [&](const ReleaseFile& f) { return f.name == name; });
  if (official == files.end()) return "";
  const auto& known = release.published;
  const auto same_size =
      std::find_if(known.begin(), known.end(), [&](const KnownFile& k) { return k.name == name && k.records == records; });
  if (same_size != known.end()) {
    const std::string digest = sha256_hex(bytes, static_cast<size_t>(records * release.record_bytes()));
    if (digest == same_size->sha256) return "";
    if (records == official->records)
      throw DataError(fmt::format("{}: the size of {}'s {} but not its content (SHA-256 {}, published {}): the file is "
                                  "damaged; {}",
                                  file.string(), release.name, name, digest, same_size->sha256, fetch_hint(release)));
    // A subset's size with other bytes: a copy of that subset changed since, not a cut download.
    return fmt::format("{}: the size of {}'s {} ({} records) but not its content (SHA-256 {}, published {}): a "
                       "changed or damaged copy, read as it is; get {}'s files again if it was not changed on purpose",
                       file.string(), same_size->release, name, records, digest, same_size->sha256,
                       same_size->release);
  } else if (records == official->records) {
    return "";  // the official size, and no published checksum to hold it to
  }
  return fmt::format("{}: {} record{} where {}'s {} has {}: training on part of the data set (a cut download?); "
                     "get the full files with {}",
                     file.string(), records, records == 1 ? "" : "s", release.name, name, official->records,
                     release.fetch_script);
}

/// The records of the release's file of `file`'s name (its largest for a name it does not have).
int64_t official_records(const fs::path& file, const CifarRelease& release) {
  std::vector<ReleaseFile> files = release.train_files;
  files.push_back(release.test_file);
  int64_t largest = 0;
  for (const ReleaseFile& official : files) {
    if (official.name == file.filename().string()) return official.records;
    largest = std::max(largest, official.records);
  }
  return largest;
}

/// A file's records and the warning about them ("" for none): files read at once log their
/// warnings in file order.
struct FileRecords {
  ImageSet set;
  std::string warning;
};

ImageSet logged(FileRecords read) {
  if (!read.warning.empty()) spdlog::warn("{}", read.warning);
  return std::move(read.set);
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

CifarRelease make_cifar100_release(config::Cifar100Labels labels) {
  CifarRelease release;
  release.name = "CIFAR-100";
  release.fetch_script = "scripts/get-cifar100.sh";
  release.folder_contents = "train.bin and test.bin";
  release.python_folder = "cifar-100-python";
  release.python_file = "train";
  release.binary_folder = "cifar-100-binary";
  release.label_bytes = {{"coarse label", config::kCifar100CoarseClasses},
                         {"fine label", config::kCifar100FineClasses}};
  release.label_byte = labels == config::Cifar100Labels::coarse ? 0 : 1;
  release.train_files = {{"train.bin", 50000}};
  release.test_file = {"test.bin", 10000};
  return release;
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

const CifarRelease& cifar10_release() {
  static const CifarRelease release = [] {
    CifarRelease r;
    r.name = "CIFAR-10";
    r.fetch_script = "scripts/get-cifar10.sh";
    r.folder_contents = "data_batch_1..5.bin and test_batch.bin";
    r.python_folder = "cifar-10-batches-py";
    r.python_file = "data_batch_1";
    r.binary_folder = "cifar-10-batches-bin";
    r.label_bytes = {{"label", config::kCifar10Classes}};
    for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                             "data_batch_5.bin"})
      r.train_files.push_back({name, kOfficialRecords});
    r.test_file = {"test_batch.bin", kOfficialRecords};
    r.published = known_cifar10_files();
    return r;
  }();
  return release;
}

const CifarRelease& cifar100_release(config::Cifar100Labels labels) {
  static const CifarRelease fine = make_cifar100_release(config::Cifar100Labels::fine);
  static const CifarRelease coarse = make_cifar100_release(config::Cifar100Labels::coarse);
  return labels == config::Cifar100Labels::coarse ? coarse : fine;
}

const CifarRelease& cifar_release(const SourceOptions& options) {
  switch (options.source) {
    case config::DataSource::cifar10:
      return cifar10_release();
    case config::DataSource::cifar100:
      return cifar100_release(options.cifar100_labels);
    case config::DataSource::synthetic:
      break;
  }
  throw std::logic_error(fmt::format("{}:{}: data.source {} reads no release", __FILE__, __LINE__,
                                     config::to_string(options.source)));
}

namespace {

FileRecords read_file_records(const fs::path& file, const CifarRelease& release) {
  require_file(file, release);
  std::error_code size_error;
  const auto file_bytes = fs::file_size(file, size_error);
  if (size_error)
    throw DataError(fmt::format("{}: cannot read its size ({}); check its permissions", file.string(),
                                size_error.message()));
  const auto bytes = static_cast<int64_t>(file_bytes);
  const int64_t record_bytes = release.record_bytes();
  // Checked before reading: a file larger than the release's would be read whole into memory.
  const int64_t most_bytes = official_records(file, release) * record_bytes;
  if (bytes > most_bytes)
    throw DataError(fmt::format("{}: {} bytes, more than {}'s {} ({} bytes, {} records of {} bytes): not a {} binary "
                                "file of the expected size; {}",
                                file.string(), bytes, release.name, file.filename().string(), most_bytes,
                                most_bytes / record_bytes, record_bytes, release.name, fetch_hint(release)));
  if (bytes == 0)
    throw DataError(fmt::format("{}: empty file (0 bytes): the download was interrupted; {}", file.string(),
                                fetch_hint(release)));
  if (bytes % record_bytes != 0)
    throw DataError(fmt::format("{}: {} bytes is not a whole number of {}-byte {} records: the file is truncated or "
                                "not {} binary; {}",
                                file.string(), bytes, record_bytes, release.name, release.name, fetch_hint(release)));
  const int64_t records = bytes / record_bytes;

  // One bulk read straight into a [N,R] uint8 tensor (R: the record's bytes); labels and planes
  // are split by slicing.
  auto raw = torch::empty({records, record_bytes}, torch::kUInt8);
  std::ifstream in(file, std::ios::binary);
  in.read(reinterpret_cast<char*>(raw.data_ptr<uint8_t>()), static_cast<std::streamsize>(bytes));
  if (!in || in.gcount() != static_cast<std::streamsize>(bytes))
    throw DataError(fmt::format("{}: read {} of {} bytes: the file changed or cannot be read; {}", file.string(),
                                static_cast<int64_t>(in.gcount()), bytes, fetch_hint(release)));
  std::string warning = check_against_published(file, raw.data_ptr<uint8_t>(), records, release);

  // Every label byte in its range, the one trained on or not: the first record with one outside.
  const auto label_bytes = static_cast<int64_t>(release.label_bytes.size());
  int64_t bad_record = records;
  int64_t bad_byte = 0;
  for (int64_t b = 0; b < label_bytes; ++b) {
    const auto bad = torch::nonzero(raw.select(1, b) >= release.label_bytes[static_cast<size_t>(b)].classes);
    if (bad.size(0) > 0 && bad[0][0].item<int64_t>() < bad_record) {
      bad_record = bad[0][0].item<int64_t>();
      bad_byte = b;
    }
  }
  if (bad_record < records) {
    const LabelByte& label = release.label_bytes[static_cast<size_t>(bad_byte)];
    throw DataError(fmt::format("{}: record {} (byte offset {}) has {} {} (expected 0-{}): not a {} binary file; {}",
                                file.string(), bad_record, bad_record * record_bytes, label.name,
                                static_cast<int>(raw[bad_record][bad_byte].item<uint8_t>()), label.classes - 1,
                                release.name, fetch_hint(release)));
  }

  ImageSet set;
  set.labels = raw.select(1, static_cast<int64_t>(release.label_byte)).to(torch::kInt64);  // [N] int64
  // [N,3072] -> [N,3,32,32]: the record already holds the R, G and B planes in row-major order.
  set.images = raw.narrow(1, label_bytes, kPixelBytes).contiguous().view({records, kChannels, kImageSide, kImageSide});
  return {set, std::move(warning)};
}

}  // namespace

ImageSet read_cifar_file(const std::filesystem::path& file, const CifarRelease& release) {
  return logged(read_file_records(file, release));
}

TrainTestSets read_cifar(const std::filesystem::path& root, const CifarRelease& release) {
  // Check every file before reading any, so a missing one is reported at once.
  std::vector<fs::path> train_paths;
  for (const ReleaseFile& file : release.train_files) train_paths.push_back(root / std::string(file.name));
  const fs::path test_path = root / std::string(release.test_file.name);
  for (const auto& file : train_paths) require_file(file, release);
  require_file(test_path, release);

  // One thread per file: reading and hashing 30 MB each (CIFAR-10). Warnings and the first
  // failing file come in file order, the test file last.
  const auto read = [&release](const fs::path& file) { return read_file_records(file, release); };
  std::vector<std::future<FileRecords>> reads;
  for (const auto& file : train_paths) reads.push_back(std::async(std::launch::async, read, file));
  std::future<FileRecords> test_read = std::async(std::launch::async, read, test_path);
  std::vector<ImageSet> train_parts;
  for (auto& part : reads) train_parts.push_back(logged(part.get()));
  ImageSet test = logged(test_read.get());
  return {concatenate(train_parts), std::move(test)};
}

ImageSet read_cifar10_file(const std::filesystem::path& file) { return read_cifar_file(file, cifar10_release()); }

TrainTestSets read_cifar10(const std::filesystem::path& root) { return read_cifar(root, cifar10_release()); }

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
    set.labels =
        torch::randint(0, config::kCifar10Classes, {drawn}, generator, torch::TensorOptions().dtype(torch::kInt64));
    if (count > drawn) {
      // The pool again and again, written once into the set's own memory (a repeat, then a
      // contiguous copy of its first `count`, would hold the images twice).
      ImageSet repeated;
      repeated.images = torch::empty({count, kChannels, image_size, image_size}, set.images.options());
      repeated.labels = torch::empty({count}, set.labels.options());
      for (int64_t first = 0; first < count; first += drawn) {
        const int64_t n = std::min(drawn, count - first);
        repeated.images.narrow(0, first, n).copy_(set.images.narrow(0, 0, n));
        repeated.labels.narrow(0, first, n).copy_(set.labels.narrow(0, 0, n));
      }
      return repeated;
    }
    return set;
  };
  TrainTestSets sets;
  sets.train = draw(train_size);
  sets.test = draw(test_size);
  return sets;
}

TrainTestSets load_sets(const SourceOptions& options, uint64_t seed, const std::vector<fs::path>& other_bases) {
  switch (options.source) {
    case config::DataSource::cifar10:
    case config::DataSource::cifar100: {
      const CifarRelease& release = cifar_release(options);
      if (options.image_size != kImageSide)
        throw ConfigError(fmt::format("data.image_size: {0}'s images are {1}x{1}, not {2}x{2}; set data.source to "
                                      "synthetic to measure steps at {2}x{2}, or leave data.image_size at {1}",
                                      release.name, kImageSide, options.image_size));
      const fs::path& root = options.root;
      std::error_code unreadable;
      if (root.is_absolute() || fs::is_directory(root, unreadable) || other_bases.empty())
        return read_cifar(root, release);
      for (const fs::path& base : other_bases)
        if (fs::is_directory(base / root, unreadable)) {
          spdlog::info("data.root {}: not in the working directory; reading {}", root.string(), (base / root).string());
          return read_cifar(base / root, release);
        }
      try {
        return read_cifar(root, release);
      } catch (const DataError& error) {
        std::vector<std::string> tried{fs::absolute(root, unreadable).lexically_normal().string()};
        for (const fs::path& base : other_bases)  // each place once: the working directory may be one of them
          if (const std::string place = (base / root).lexically_normal().string();
              std::find(tried.begin(), tried.end(), place) == tried.end())
            tried.push_back(place);
        throw DataError(fmt::format("{}; data.root \"{}\" was looked for in {} (a relative data.root left at its "
                                    "default: the working directory first, then ltrain's own folder)",
                                    error.what(), root.string(), fmt::join(tried, " and ")));
      }
    }
    case config::DataSource::synthetic:
      return make_synthetic(options.synthetic_train_size, options.synthetic_test_size, seed, options.image_size);
  }
  throw std::logic_error(fmt::format("{}:{}: unhandled data.source", __FILE__, __LINE__));
}

}  // namespace ltrain::data
