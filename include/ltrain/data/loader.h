#pragma once
// The whole dataset lives on the device as uint8; batches are gathered, augmented (random crop
// with zero padding, horizontal flip, cutout) and normalized there, with no host work per step beyond
// launching kernels and no host-device sync.
#include <cstdint>

#include <torch/torch.h>

#include "ltrain/data/cifar.h"

namespace ltrain::data {

struct Batch {
  /// [B,3,S,S] float32 on the device, normalized (S = 32 for CIFAR-10; less in the epochs
  /// progressive resizing scales training images down)
  torch::Tensor images;
  torch::Tensor labels;  ///< [B] int64 on the device
};

/// The loaders' options are the data module's own; engine/module_options fills them from a run
/// config's data section (data.normalize, data.mean, data.std, ...), the one place that reads those
/// keys and holds their defaults (CIFAR-10's mean and std among them).
struct NormalizeOptions {
  bool normalize = false;  ///< subtract `mean` and divide by `std` per channel, after scaling to [0, 1]
  std::vector<double> mean;  ///< (R, G, B) of pixels in [0, 1]
  std::vector<double> std;   ///< (R, G, B)
};

/// uint8 [B,3,S,S] -> float32 [B,3,S,S]: x/255, then (x - mean) / std per channel when
/// `normalize` is on. One fused multiply-add with per-channel scale and shift.
class Normalizer {
 public:
  Normalizer(const NormalizeOptions& options, const torch::Device& device);
  torch::Tensor operator()(const torch::Tensor& images_uint8) const;

 private:
  torch::Tensor scale_;  // [1,3,1,1] float32: 1 / (255 std)
  torch::Tensor shift_;  // [1,3,1,1] float32: -mean / std
};

/// This process's part of each step's images in a data-parallel run: of a global step of
/// `count` x B images (B: one process's images per step), positions [rank*B, (rank+1)*B).
struct Shard {
  int64_t rank = 0;
  int64_t count = 1;
};

/// Progressive resizing of training images (data.progressive_start_size, _epochs, _size_step).
struct ProgressiveResize {
  int64_t start_size = 0;  // 0: off (as data.progressive_start_size or data.progressive_epochs 0)
  int64_t epochs = 0;
  int64_t size_step = 1;

  /// The side of training images in epoch `epoch` (counted from 0): start_size in epoch 0, then
  /// start_size + (full_side - start_size) * epoch / epochs rounded down to a multiple of
  /// size_step (never below start_size); `full_side` when off and from epoch `epochs` on.
  int64_t side(int64_t full_side, int64_t epoch) const;
};

/// No defaults of its own (engine::train_loader_options fills every field).
struct TrainLoaderOptions {
  /// This process's images per optimizer step: one batch of the loader. With gradient
  /// accumulation the step splits it into micro-batches (config: data.batch_size, the micro-batch,
  /// times optim.accumulation_steps).
  int64_t images_per_step;
  bool shuffle;          ///< a new random order each epoch; false: file order every epoch
  bool random_crop;      ///< a random crop of the image padded with zeros by `crop_padding`
  int64_t crop_padding;  ///< pixels per side
  bool horizontal_flip;  ///< mirror half of the images left-right
  int64_t cutout;        ///< side of the square set to 0 in each normalized image; 0: off
  ProgressiveResize progressive;
  NormalizeOptions normalize;
};

/// Whether a TrainLoader keeps a copy of its images of its own (uint8, beside the ones it is given
/// until those are dropped) to draw augmented batches from: with random crops or flips.
inline bool keeps_augmentation_copy(bool random_crop, bool horizontal_flip) { return random_crop || horizontal_flip; }
/// The zero border on each side of that copy's images: the crop padding with random crops, else none.
inline int64_t augmentation_border(bool random_crop, int64_t crop_padding) { return random_crop ? crop_padding : 0; }

/// Training batches, one per optimizer step: a seeded order per epoch (file order with shuffle off;
/// drop_last: the remainder is skipped) and per-image augmentation drawn per epoch, so batch
/// (epoch, index) is a pure function of (seed, epoch, index) on any device and after any resume.
class TrainLoader {
 public:
  /// `train` must already be on the device the batches are wanted on. Every shard draws the
  /// same order and augmentation, so the shards of a global step are the batch one process
  /// with count x images_per_step images would get.
  TrainLoader(ImageSet train, const TrainLoaderOptions& options, uint64_t seed, Shard shard = {});

  /// This process's images per batch, which is one optimizer step's.
  int64_t images_per_step() const { return images_per_step_; }
  /// Full global batches per epoch (the last partial one is dropped).
  int64_t batches_per_epoch() const;
  /// Draws epoch `epoch`'s order and augmentation parameters (on the CPU, copied once).
  void set_epoch(int64_t epoch);
  /// Batch `index` (0-based) of the current epoch.
  Batch batch(int64_t index) const;
  /// The side of the current epoch's batches (below the images' side while progressive resizing
  /// scales them down).
  int64_t batch_side() const { return batch_side_; }

 private:
  bool augments() const { return keeps_augmentation_copy(random_crop_, flip_); }
  int64_t border() const { return augmentation_border(random_crop_, padding_); }
  /// Side of a stored (bordered) image plane.
  int64_t padded_side() const { return side_ + 2 * border(); }
  /// Crop and flip of the images at `indices` (padded_images_), normalized: [B,3,S,S] float32.
  torch::Tensor cropped_and_flipped(const torch::Tensor& indices, int64_t start) const;
  /// Cutout: zeroes each image's square, in place; `start` is the batch's first position.
  void cut_out(torch::Tensor& images, int64_t start) const;
  /// [B,3,S,S] -> [B,3,s,s] float32, s = batch_side_ (bilinear with antialiasing, as
  /// torchvision's Resize on tensors); the batch itself when s = S.
  torch::Tensor scaled_to_batch_side(torch::Tensor images) const;

  ImageSet train_;  // its images are dropped when augmenting (padded_images_ holds them)
  Normalizer normalize_;
  int64_t side_;  // the images' side, S
  int64_t images_per_step_;  // B, the batch's images
  Shard shard_;
  bool shuffle_;
  bool random_crop_;
  int64_t padding_;
  bool flip_;
  int64_t cutout_;  // side of the cutout square, 0: off
  ProgressiveResize progressive_;
  int64_t batch_side_;  // the current epoch's side of a batch, s <= S
  uint64_t seed_;
  // Fixed, on the device (when augmenting; pixel_index_ with cutout):
  torch::Tensor padded_images_;  // [N,3,P,P] uint8: the images with their zero border, P = padded_side()
  torch::Tensor rows_;           // [1,S,1] int64: y * P
  torch::Tensor columns_;        // [2,1,S] int64: x, and S - 1 - x for a flipped image
  torch::Tensor pixel_index_;    // [S] int64: 0..S-1, the rows and columns cutout compares (with cutout)
  // Per epoch, on the device, indexed by position in the epoch's order (a batch is a slice):
  torch::Tensor order_;           // [N] int64, the epoch's permutation
  torch::Tensor labels_in_order_;  // [N] int64
  torch::Tensor crop_offset_;     // [N,1,1] int64: (dy + border) * P + dx + border, the crop's corner in the padded plane
  torch::Tensor flipped_;         // [N] int64: 1 where the image is mirrored
  torch::Tensor cutout_corner_;   // [N,2] int64 (y, x): the cutout square's top-left corner, maybe outside the image
};

/// No defaults of its own (engine::eval_loader_options fills every field).
struct EvalLoaderOptions {
  int64_t batch_size;  ///< images per evaluation batch
  NormalizeOptions normalize;
};

/// Test batches: every image once, in file order; the last batch may be smaller.
class EvalLoader {
 public:
  EvalLoader(ImageSet test, const EvalLoaderOptions& options);
  int64_t size() const { return test_.size(); }
  int64_t num_batches() const;
  Batch batch(int64_t index) const;

 private:
  ImageSet test_;
  Normalizer normalize_;
  int64_t batch_size_;
};

}  // namespace ltrain::data
