#pragma once
// The CIFAR-10 and CIFAR-100 binary releases (cifar-10-batches-bin, cifar-100-binary), read by one
// reader that a description of each release steers, and a synthetic source of the same shapes (or
// of larger square images).
// A record is the release's label bytes (CIFAR-10: 1, the class 0-9; CIFAR-100: 2, the coarse
// class 0-19 then the fine class 0-99), then 3072 pixel bytes: 1024 red, 1024 green, 1024 blue,
// each plane row-major 32x32.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include <torch/torch.h>

#include "ltrain/config/enums.h"

namespace ltrain::data {

constexpr int64_t kImageSide = 32;
constexpr int64_t kChannels = 3;
constexpr int64_t kPixelBytes = kChannels * kImageSide * kImageSide;  // 3072
constexpr int64_t kRecordBytes = 1 + kPixelBytes;                     // 3073, a CIFAR-10 record

/// Images with their labels, on one device.
struct ImageSet {
  torch::Tensor images;  ///< [N,3,S,S] uint8, RGB; S = 32 for CIFAR
  torch::Tensor labels;  ///< [N] int64 in [0, classes)
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  /// S: the images' side in pixels.
  int64_t side() const { return images.size(3); }
  ImageSet to(const torch::Device& device) const;
};

struct TrainTestSets {
  ImageSet train;
  ImageSet test;
};

/// Records in each file of CIFAR-10's release.
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

/// One of the label bytes that open each record.
struct LabelByte {
  std::string_view name;  ///< as messages name it: "label"; CIFAR-100: "coarse label", "fine label"
  int64_t classes = 0;    ///< its values are 0 to classes - 1
};

/// A file of a release with the number of records it was published with.
struct ReleaseFile {
  std::string_view name;  ///< "data_batch_1.bin", "train.bin"
  int64_t records = 0;
};

/// A CIFAR binary release as the reader follows it: its files and the layout of their records.
struct CifarRelease {
  std::string_view name;             ///< "CIFAR-10", "CIFAR-100", as messages name it
  std::string_view fetch_script;     ///< "scripts/get-cifar10.sh"
  std::string_view folder_contents;  ///< "data_batch_1..5.bin and test_batch.bin", said when one is missing
  /// torchvision's Python release of the same data: its folder's name and a file it holds
  /// ("cifar-10-batches-py", "data_batch_1"), recognised where the binary files are missing.
  std::string_view python_folder;
  std::string_view python_file;
  std::string_view binary_folder;  ///< the folder fetch_script fills ("cifar-10-batches-bin")
  std::vector<LabelByte> label_bytes;  ///< the bytes before a record's pixels, in order
  size_t label_byte = 0;               ///< which of them is the label the sets get
  std::vector<ReleaseFile> train_files;  ///< concatenated in this order
  ReleaseFile test_file;
  /// Files whose SHA-256 is published (CIFAR-10's and cifar10-mini's; none for CIFAR-100, whose
  /// archive alone has a published checksum): a file of such a name and size must have that content.
  std::vector<KnownFile> published;

  int64_t record_bytes() const { return static_cast<int64_t>(label_bytes.size()) + kPixelBytes; }
  /// The classes of the label the sets get.
  int64_t classes() const { return label_bytes.at(label_byte).classes; }
};

/// CIFAR-10: data_batch_1..5.bin and test_batch.bin, 10,000 records each, one label byte.
const CifarRelease& cifar10_release();
/// CIFAR-100: train.bin (50,000 records) and test.bin (10,000), two label bytes (coarse, fine);
/// the sets get the one `labels` names.
const CifarRelease& cifar100_release(config::Cifar100Labels labels);
/// Where the training and test sets come from: load_sets reads or makes them by these. No defaults
/// of its own (engine::source_options fills every field from the config's data section).
struct SourceOptions {
  config::DataSource source;  ///< cifar10, cifar100: a binary release's files under `root`; synthetic: random images
  std::filesystem::path root;             ///< the folder with the release's files
  config::Cifar100Labels cifar100_labels;  ///< CIFAR-100's label the sets get: fine or coarse
  int64_t image_size;                     ///< the images' side in pixels: kImageSide for CIFAR, any for synthetic
  int64_t synthetic_train_size;           ///< training images of the synthetic source
  int64_t synthetic_test_size;            ///< test images of the synthetic source
};

/// The release `options.source` names (with options.cifar100_labels); std::logic_error for the
/// synthetic source, which reads no files.
const CifarRelease& cifar_release(const SourceOptions& options);

/// Reads one binary file of `release`. DataError naming the file when it is missing, empty, not a
/// whole number of records, or holds a label byte outside its range; and when it has the name and
/// size of a published file but not its SHA-256 (damaged). A file named like one of the release's
/// that holds another number of records (cut at a record boundary, or a subset) is read with one
/// warning naming it and its record count, unless it is a known subset's (cifar10-mini).
ImageSet read_cifar_file(const std::filesystem::path& file, const CifarRelease& release);

/// The release's training files (concatenated, in order) and its test file under `root`. DataError
/// naming the missing file and saying how to get the data when one is absent.
TrainTestSets read_cifar(const std::filesystem::path& root, const CifarRelease& release);

/// read_cifar_file and read_cifar for CIFAR-10.
ImageSet read_cifar10_file(const std::filesystem::path& file);
TrainTestSets read_cifar10(const std::filesystem::path& root);

/// Uniform random pixels and labels, [N,3,S,S] images of side `image_size`, the same for the same
/// seed. A set larger than the pool repeats its first images (labels included): drawing each byte
/// takes minutes for the million-image sets of a batch-size search, copying takes a second. The
/// pool holds kSyntheticPool images of 32x32, and as many bytes (fewer images) at larger sides.
constexpr int64_t kSyntheticPool = 65536;
int64_t synthetic_pool_images(int64_t image_size);
TrainTestSets make_synthetic(int64_t train_size, int64_t test_size, uint64_t seed, int64_t image_size = kImageSide);

/// The sets of the source `options.source` names, on the CPU. ConfigError (naming data.image_size)
/// for an image size other than 32 with CIFAR-10 or CIFAR-100. A relative root that is no folder
/// under the working directory is looked for under each of `other_bases` in turn (the first folder
/// found is read, with a note); where none has it, the DataError names every place looked in.
TrainTestSets load_sets(const SourceOptions& options, uint64_t seed,
                        const std::vector<std::filesystem::path>& other_bases = {});

}  // namespace ltrain::data
