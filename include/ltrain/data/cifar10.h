#pragma once
// CIFAR-10 binary files (cifar-10-batches-bin) and a synthetic source of the same shapes.
// A record is 1 label byte (0-9) then 3072 pixel bytes: 1024 red, 1024 green, 1024 blue,
// each plane row-major 32x32.
#include <cstdint>
#include <filesystem>

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
  torch::Tensor images;  ///< [N,3,32,32] uint8, RGB
  torch::Tensor labels;  ///< [N] int64 in [0, 10)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  ImageSet to(const torch::Device& device) const;
};

struct TrainTestSets {
  ImageSet train;
  ImageSet test;
};

/// Reads one binary file. DataError naming the file when it is missing, empty, not a whole
/// number of 3073-byte records, or holds a label outside 0-9.
ImageSet read_cifar10_file(const std::filesystem::path& file);

/// data_batch_1..5.bin (concatenated, in order) and test_batch.bin under `root`. DataError
/// naming the missing file and saying how to get the data when one is absent.
TrainTestSets read_cifar10(const std::filesystem::path& root);

/// Uniform random pixels and labels of CIFAR-10's shapes, the same for the same seed. A set larger
/// than kSyntheticPool images repeats its first kSyntheticPool (labels included): drawing each
/// byte takes minutes for the million-image sets of a batch-size search, copying takes a second.
constexpr int64_t kSyntheticPool = 65536;
TrainTestSets make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed);

/// The source `data.source` names, on the CPU.
TrainTestSets load_sets(const config::DataSection& data, uint64_t seed);

}  // namespace ltrain::data
