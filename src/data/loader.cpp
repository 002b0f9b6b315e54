#include "ltrain/data/loader.h"

#include <algorithm>
#include <stdexcept>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "ltrain/core/errors.h"

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

Normalizer::Normalizer(const config::DataSection& data, const torch::Device& device) {
  std::vector<double> scale(kChannels, 1.0 / 255.0);
  std::vector<double> shift(kChannels, 0.0);
  if (data.normalize) {
    require_rgb(data.mean, "mean");
    require_rgb(data.std, "std");
    for (size_t c = 0; c < scale.size(); ++c) {
      scale[c] = 1.0 / (255.0 * data.std[c]);
      shift[c] = -data.mean[c] / data.std[c];
    }
  }
  scale_ = per_channel(scale, device);
  shift_ = per_channel(shift, device);
}

torch::Tensor Normalizer::operator()(const torch::Tensor& images_uint8) const {
  // (x/255 - mean)/std == x * scale + shift: one fused multiply-add, [B,3,32,32] float32.
  return torch::addcmul(shift_, images_uint8.to(torch::kFloat32), scale_).contiguous();
}

// ---- TrainLoader ------------------------------------------------------------------------------

TrainLoader::TrainLoader(ImageSet train, const config::DataSection& data, uint64_t seed)
    : train_(std::move(train)),
      normalize_(data, train_.images.device()),
      batch_size_(data.batch_size),
      random_crop_(data.random_crop),
      padding_(data.crop_padding),
      flip_(data.horizontal_flip),
      seed_(seed) {
  if (batch_size_ < 1) throw ConfigError(fmt::format("data.batch_size: {} is not a positive number", batch_size_));
  if (train_.size() < batch_size_)
    throw ConfigError(fmt::format("data.batch_size: {} is larger than the training set ({} images): no full batch "
                                  "fits in an epoch; lower data.batch_size",
                                  batch_size_, train_.size()));
  if (padding_ < 0 || padding_ >= kImageSide)
    throw ConfigError(fmt::format("data.crop_padding: {} is outside 0-{}", padding_, kImageSide - 1));
  set_epoch(0);  // batches are valid from the start
}

int64_t TrainLoader::batches_per_epoch() const { return train_.size() / batch_size_; }

void TrainLoader::set_epoch(int64_t epoch) {
  // Drawn on the CPU from a private generator, so the result is the same on every device and
  // independent of the global generator; then copied to the device once per epoch.
  auto generator = at::detail::createCPUGenerator(epoch_seed(seed_, epoch));
  const int64_t count = train_.size();
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64);
  auto order = torch::randperm(count, generator, long_options);  // [N] int64
  // Always drawn, in a fixed sequence, so switching one augmentation off leaves the others'
  // draws (and the order) unchanged.
  auto shift = torch::randint(-padding_, padding_ + 1, {count, 2}, generator, long_options);  // [N,2] (dy, dx)
  auto flip = torch::randint(0, 2, {count}, generator, long_options).to(torch::kBool);       // [N] Bernoulli(0.5)
  if (!random_crop_) shift.zero_();
  if (!flip_) flip.zero_();

  const auto device = train_.images.device();
  order_ = order.to(device);
  crop_shift_ = shift.to(device);
  flip_mask_ = flip.to(device);
}

Batch TrainLoader::batch(int64_t index) const {
  if (index < 0 || index >= batches_per_epoch())
    throw std::out_of_range(fmt::format("{}:{}: TrainLoader::batch({}) outside 0-{}", __FILE__, __LINE__, index,
                                        batches_per_epoch() - 1));
  const auto indices = order_.narrow(0, index * batch_size_, batch_size_);  // [B] int64, device
  const auto images = train_.images.index_select(0, indices);              // [B,3,32,32] uint8, device
  const auto labels = train_.labels.index_select(0, indices);              // [B] int64, device
  if (!random_crop_ && !flip_) return {normalize_(images), labels};

  // torchvision's RandomCrop(32, padding=p) then RandomHorizontalFlip, as one gather:
  //   crop[y, x] = padded[y + p + dy, x + p + dx] = image[y + dy, x + dx]  (0 outside the image)
  //   out[y, x]  = crop[y, flip ? 31 - x : x]
  // so out[y, x] = image[y + dy, x' + dx] with x' = flip ? 31 - x : x.
  const int64_t batch_size = indices.size(0);
  const auto long_options = torch::TensorOptions().dtype(torch::kInt64).device(images.device());
  const auto shift = crop_shift_.index_select(0, indices);                       // [B,2] int64
  const auto dy = shift.select(1, 0).view({batch_size, 1, 1});                    // [B,1,1]
  const auto dx = shift.select(1, 1).view({batch_size, 1, 1});                    // [B,1,1]
  const auto flipped = flip_mask_.index_select(0, indices).view({batch_size, 1, 1});  // [B,1,1] bool
  const auto rows = torch::arange(kImageSide, long_options).view({1, kImageSide, 1});  // [1,32,1]
  const auto cols = torch::arange(kImageSide, long_options).view({1, 1, kImageSide});  // [1,1,32]

  const auto source_row = rows + dy;                                         // [B,32,1]
  const auto source_col = torch::where(flipped, cols.flip({2}), cols) + dx;  // [B,1,32]
  const auto inside = source_row.ge(0).logical_and(source_row.lt(kImageSide))
                          .logical_and(source_col.ge(0).logical_and(source_col.lt(kImageSide)));  // [B,32,32] bool
  // Clamped so every index is legal; pixels from outside the image are zeroed by `inside`.
  const int64_t plane = kImageSide * kImageSide;
  const auto source = (source_row.clamp(0, kImageSide - 1) * kImageSide + source_col.clamp(0, kImageSide - 1))
                          .view({batch_size, 1, plane});  // [B,1,1024] int64, shared by the 3 channels
  const auto gathered = images.view({batch_size, kChannels, plane})
                            .gather(2, source.expand({batch_size, kChannels, plane}))           // [B,3,1024] uint8
                            .masked_fill(inside.view({batch_size, 1, plane}).logical_not(), 0);  // zero padding
  return {normalize_(gathered.view({batch_size, kChannels, kImageSide, kImageSide})), labels};
}

// ---- EvalLoader -------------------------------------------------------------------------------

EvalLoader::EvalLoader(ImageSet test, const config::DataSection& data)
    : test_(std::move(test)), normalize_(data, test_.images.device()), batch_size_(data.eval_batch_size) {
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
  // [b,3,32,32] uint8 -> float32, b = B except perhaps for the last batch.
  return {normalize_(test_.images.narrow(0, start, count)), test_.labels.narrow(0, start, count)};
}

}  // namespace ltrain::data
