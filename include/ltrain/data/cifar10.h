#pragma once
// CIFAR-10 binary files (cifar-10-batches-bin) and a synthetic source of the same shapes (or of
// larger square images).
// A record is 1 label byte (0-9) then 3072 pixel bytes: 1024 red, 1024 green, 1024 blue,
// each plane row-major 32x32.
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "ltrain/config/config.h"

namespace ltrain::data {

constexpr int64_t kImageSide = 32;
constexpr int64_t kChannels = 3;
constexpr int64_t kNumClasses = 10;
constexpr int64_t kPixelBytes = kChannels * kImageSide * kImageSide;  // 3072
constexpr int64_t kRecordBytes = 1 + kPixelBytes;                     // 3073

/// Images with their labels, on one device.
struct ImageSet {
  torch::Tensor images;  ///< [N,3,S,S] uint8, RGB; S = 32 for CIFAR-10
  torch::Tensor labels;  ///< [N] int64 in [0, 10)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  /// S: the images' side in pixels.
  int64_t side() const { return images.size(3); }
  ImageSet to(const torch::Device& device) const;
};

struct TrainTestSets {
  ImageSet train;
  ImageSet test;
};

/// Records in each file of the official release.
constexpr int64_t kOfficialRecords = 10000;

/// A file as published: in CIFAR-10's binary release, or in cifar10-mini (ltrain's test subset of
/// it, 1000 records per file).
struct KnownFile {
  std::string_view name;     ///< "data_batch_1.bin"
  int64_t records = 0;       ///< 3073-byte records in it
  std::string_view sha256;   ///< 64 lowercase hex digits
  std::string_view release;  ///< "CIFAR-10" or "cifar10-mini"
};

/// The files read_cifar10_file recognises by name and size (scripts/get-cifar10.sh lists the same
/// sums for the official release).
const std::vector<KnownFile>& known_cifar10_files();

/// Reads one binary file. DataError naming the file when it is missing, empty, not a whole
/// number of 3073-byte records, or holds a label outside 0-9; and when it has the name and size
/// of an official file but not its SHA-256 (damaged). A file named like an official one that
/// holds another number of records (cut at a record boundary, or a subset) is read with one
/// warning naming it and its record count, unless it is a known subset's (cifar10-mini).
ImageSet read_cifar10_file(const std::filesystem::path& file);

/// data_batch_1..5.bin (concatenated, in order) and test_batch.bin under `root`. DataError
/// naming the missing file and saying how to get the data when one is absent.
TrainTestSets read_cifar10(const std::filesystem::path& root);

/// Uniform random pixels and labels, [N,3,S,S] images of side `image_size`, the same for the same
/// seed. A set larger than the pool repeats its first images (labels included): drawing each byte
/// takes minutes for the million-image sets of a batch-size search, copying takes a second. The
/// pool holds kSyntheticPool images of 32x32, and as many bytes (fewer images) at larger sides.
constexpr int64_t kSyntheticPool = 65536;
int64_t synthetic_pool_images(int64_t image_size);
TrainTestSets make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed, int64_t image_size = kImageSide);

/// The source `data.source` names, on the CPU. ConfigError for a data.image_size other than 32 with
/// CIFAR-10.
TrainTestSets load_sets(const config::DataSection& data, uint64_t seed);

}  // namespace ltrain::data
