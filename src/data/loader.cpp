#include "ltrain/data/loader.h"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/gpu.h"

namespace ltrain::data {
namespace {

/// SplitMix64's finalizer: spreads nearby inputs (seed, seed+1, epoch 3, epoch 4) over all bits.
uint64_t splitmix64(uint64_t value) {
  value += 0x9E3779B97F4A7C15ULL;
  value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ULL;
  value = (value ^ (value >> 27)) * 0x94D049BB133111EBULL;
  return value ^ (value >> 31);
}

/// The seed of epoch `epoch`'s order and augmentation. The stream tag keeps it apart from other
/// users of the run seed (model initialization draws from the same `run.seed`).
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  constexpr uint64_t kTrainOrderStream = 0x6C747261696E4450ULL;  // "ltrainDP"
  return splitmix64(splitmix64(seed ^ kTrainOrderStream) + static_cast<uint64_t>(epoch));
}

torch::Tensor per_channel(const std::vector<double>& values, const torch::Device& device) {
  // Computed in double on the host, stored as [1,3,1,1] float32 on the device.
  return torch::tensor(values, torch::TensorOptions().dtype(torch::kFloat64))
      .to(torch::kFloat32)
      .view({1, kChannels, 1, 1})
      .to(device);
}

void require_rgb(const std::vector<double>& values, const char* key) {
  if (values.size() != static_cast<size_t>(kChannels))
    throw ConfigError(fmt::format("data.{}: expected a list of 3 numbers (R, G, B), got {}", key, values.size()));
}

}  // namespace

// ---- Normalizer -------------------------------------------------------------------------------

Normalizer::Normalizer(const NormalizeOptions& options, const torch::Device& device) {
  std::vector<double> scale(kChannels, 1.0 / 255.0);
  std::vector<double> shift(kChannels, 0.0);
  if (options.normalize) {
    require_rgb(options.mean, "mean");
    require_rgb(options.std, "std");
    for (size_t c = 0; c < scale.size(); ++c) {
      scale[c] = 1.0 / (255.0 * options.std[c]);
      shift[c] = -options.mean[c] / options.std[c];
    }
  }
  scale_ = per_channel(scale, device);
  shift_ = per_channel(shift, device);
}

torch::Tensor Normalizer::operator()(const torch::Tensor& images_uint8) const {
  // (x/255 - mean)/std == x * scale + shift: one fused multiply-add, [B,3,S,S] float32.
  return torch::addcmul(shift_, images_uint8.to(torch::kFloat32), scale_).contiguous();
}

// ---- ProgressiveResize --------------------------------------------------------------------------

int64_t ProgressiveResize::side(int64_t full_side, int64_t epoch) const {
  if (start_size <= 0 || start_size >= full_side || epoch >= epochs) return full_side;
  const int64_t grown = start_size + (full_side - start_size) * epoch / epochs;  // integer: floor
  return std::max(start_size, grown / size_step * size_step);
}

// ---- TrainLoader ------------------------------------------------------------------------------

TrainLoader::TrainLoader(ImageSet train, const TrainLoaderOptions& options, uint64_t seed, Shard shard)
    : train_(std::move(train)),
      normalize_(options.normalize, train_.images.device()),
      side_(train_.side()),
      images_per_step_(options.images_per_step),
      shard_(shard),
      shuffle_(options.shuffle),
      random_crop_(options.random_crop),
      padding_(options.crop_padding),
      flip_(options.horizontal_flip),
      cutout_(options.cutout),
      progressive_(options.progressive),
      batch_side_(side_),
      seed_(seed) {
  // The run's set-up checks data.batch_size against the training set first, naming
  // optim.accumulation_steps and the processes; this guards the loader's own use.
  if (images_per_step_ < 1)
    throw ConfigError(fmt::format("data.batch_size: {} images a step is not a positive number", images_per_step_));
  if (train_.size() < images_per_step_ * shard_.count)
    throw ConfigError(fmt::format("data.batch_size: {} images a step x {} process(es) is larger than the training set "
                                  "({} images): no full step fits in an epoch; lower data.batch_size",
                                  images_per_step_, shard_.count, train_.size()));
  if (padding_ < 0 || padding_ >= side_)
    throw ConfigError(fmt::format("data.crop_padding: {} is outside 0-{}", padding_, side_ - 1));
  if (cutout_ < 0 || cutout_ > side_)
    throw ConfigError(fmt::format("data.cutout: {} is outside 0-{}", cutout_, side_));
  if (progressive_.start_size >= side_)
    throw ConfigError(fmt::format("data.progressive_start_size: {} is not below the images' side ({}); use a smaller "
                                  "side or 0 (off)",
                                  progressive_.start_size, side_));
  if (cutout_ > 0) {
    const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(train_.labels.device());
    pixel_index_ = torch::arange(side_, long_options);
  }
  if (augments()) {
    // Padded once, so that a crop is one gather with no bounds tests (the border is the zero fill).
    const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(train_.images.device());
    padded_images_ = torch::constant_pad_nd(train_.images, {border(), border(), border(), border()}, 0);
    rows_ = (torch::arange(side_, long_options) * padded_side()).view({1, side_, 1});
    const auto x = torch::arange(side_, long_options);
    columns_ = torch::stack({x, x.flip({0})}).view({2, 1, side_});
    train_.images = torch::Tensor();  // batches come from the padded copy only
  }
  set_epoch(0);  // batches are valid from the start
}

int64_t TrainLoader::batches_per_epoch() const { return train_.size() / (images_per_step_ * shard_.count); }

void TrainLoader::set_epoch(int64_t epoch) {
  // Drawn on the CPU from a private generator, so the result is the same on every device and
  // independent of the global generator; then copied to the device once per epoch.
  batch_side_ = progressive_.side(side_, epoch);
  auto generator = at::detail::createCPUGenerator(epoch_seed(seed_, epoch));
  const int64_t count = train_.size();
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64);
  auto order = torch::randperm(count, generator, long_options);  // [N] int64
  if (!shuffle_) order = torch::arange(count, long_options);  // still drawn: the draws below stay the same
  // Always drawn, in a fixed sequence, so switching one augmentation off leaves the others'
  // draws (and the order) unchanged.
  auto shift = torch::randint(-padding_, padding_ + 1, {count, 2}, generator, long_options);  // [N,2] (dy, dx)
  auto flip = torch::randint(0, 2, {count}, generator, long_options);                        // [N] Bernoulli(0.5)
  auto centre = torch::randint(0, side_, {count, 2}, generator, long_options);              // [N,2] cutout (cy, cx)
  if (!random_crop_) shift.zero_();
  if (!flip_) flip.zero_();

  const auto device = train_.labels.device();
  // The batches prepared ahead read the epoch's tensors: they are done before these are replaced.
  gpu::settle_ahead(device);
  order_ = order.to(device);
  labels_in_order_ = train_.labels.index_select(0, order_);
  if (cutout_ > 0) cutout_corner_ = (centre.index_select(0, order) - cutout_ / 2).to(device);
  if (augments()) {
    // Put in the epoch's order here, so that a batch takes slices instead of gathering them.
    shift = shift.index_select(0, order) + border();
    crop_offset_ = (shift.select(1, 0) * padded_side() + shift.select(1, 1)).view({count, 1, 1}).to(device);
    flipped_ = flip.index_select(0, order).to(device);
  }
  gpu::settle_ahead(device);  // and the new ones are there before the next batch reads them
}

Batch TrainLoader::batch(int64_t index) const {
  if (index < 0 || index >= batches_per_epoch())
    throw std::out_of_range(fmt::format("{}:{}: TrainLoader::batch({}) outside 0-{}", __FILE__, __LINE__, index,
                                        batches_per_epoch() - 1));
  const int64_t start = (index * shard_.count + shard_.rank) * images_per_step_;
  const auto indices = order_.narrow(0, start, images_per_step_);           // [B] int64, device
  const auto labels = labels_in_order_.narrow(0, start, images_per_step_);  // [B] int64, device
  // On a GPU, on a stream of its own: its kernels run while the step before is still running.
  const std::vector<torch::Tensor> prepared = gpu::run_ahead(labels.device(), [&] {
    torch::Tensor images =
        augments() ? cropped_and_flipped(indices, start) : normalize_(train_.images.index_select(0, indices));
    if (cutout_ > 0) cut_out(images, start);
    return std::vector<torch::Tensor>{scaled_to_batch_side(std::move(images))};
  });
  return {prepared.front(), labels};
}

torch::Tensor TrainLoader::scaled_to_batch_side(torch::Tensor images) const {
  if (batch_side_ == side_) return images;
  namespace F = torch::nn::functional;
  return F::interpolate(images, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{batch_side_, batch_side_})
                                    .mode(torch::kBilinear)
                                    .align_corners(false)
                                    .antialias(true));
}

torch::Tensor TrainLoader::cropped_and_flipped(const torch::Tensor& indices, int64_t start) const {
  // torchvision's RandomCrop(S, padding=p) then RandomHorizontalFlip, as one gather from the
  // zero-padded image Q (Q[Y, X] = image[Y - p, X - p], 0 in the border):
  //   out[y, x] = crop[y, flip ? S-1-x : x] = Q[y + p + dy, x' + p + dx],  x' = flip ? S-1-x : x
  // whose flat index in Q's P x P plane is y * P + crop_offset + x'.
  const int64_t batch = images_per_step_;  // B
  const int64_t plane = side_ * side_;
  const int64_t padded = padded_side();
  const auto columns = columns_.index_select(0, flipped_.narrow(0, start, batch));  // [B,1,S] x'
  const auto source = (rows_ + crop_offset_.narrow(0, start, batch)) + columns;    // [B,S,S] int64
  const auto gathered = padded_images_.index_select(0, indices)                 // [B,3,P,P] uint8
                            .view({batch, kChannels, padded * padded})
                            .gather(2, source.view({batch, 1, plane}).expand({batch, kChannels, plane}));
  return normalize_(gathered.view({batch, kChannels, side_, side_}));
}

void TrainLoader::cut_out(torch::Tensor& images, int64_t start) const {
  const int64_t batch = images_per_step_;  // B
  const auto corner = cutout_corner_.narrow(0, start, batch);  // [B,2] int64
  const auto top = corner.select(1, 0).view({batch, 1, 1});
  const auto left = corner.select(1, 1).view({batch, 1, 1});
  const auto y = pixel_index_.view({1, side_, 1});
  const auto x = pixel_index_.view({1, 1, side_});
  const auto inside = (y >= top) & (y < top + cutout_) & (x >= left) & (x < left + cutout_);  // [B,S,S] bool
  images.masked_fill_(inside.unsqueeze(1), 0.0);
}

// ---- EvalLoader -------------------------------------------------------------------------------

EvalLoader::EvalLoader(ImageSet test, const EvalLoaderOptions& options)
    : test_(std::move(test)), normalize_(options.normalize, test_.images.device()), batch_size_(options.batch_size) {
  if (batch_size_ < 1)
    throw ConfigError(fmt::format("data.eval_batch_size: {} is not a positive number", batch_size_));
}

int64_t EvalLoader::num_batches() const { return (test_.size() + batch_size_ - 1) / batch_size_; }

Batch EvalLoader::batch(int64_t index) const {
  if (index < 0 || index >= num_batches())
    throw std::out_of_range(fmt::format("{}:{}: EvalLoader::batch({}) outside 0-{}", __FILE__, __LINE__, index,
                                        num_batches() - 1));
  const int64_t start = index * batch_size_;
  const int64_t count = std::min(batch_size_, test_.size() - start);
  // [b,3,S,S] uint8 -> float32, b = B except perhaps for the last batch.
  return {normalize_(test_.images.narrow(0, start, count)), test_.labels.narrow(0, start, count)};
}

}  // namespace ltrain::data
