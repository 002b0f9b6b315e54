#include "ltrain/models/resnet.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/max_pool.h"

namespace ltrain::models {
namespace {

/// model.fused_conv in a build without the kernels: one warning a process, however many models.
void warn_fused_conv_not_built() {
  static std::atomic<bool> warned{false};
  if (warned.exchange(true)) return;
  spdlog::warn("model.fused_conv: {}; the convolutions run on cuDNN",
               ops::fused_conv_fit(torch::Device(torch::kCPU)).reason);
}

/// Padding kernel/2 keeps H,W (divided by the stride); no bias, since every conv feeds a BatchNorm.
torch::nn::Conv2d conv_no_bias(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride,
                               int64_t groups = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, kernel)
                               .stride(stride)
                               .padding(kernel / 2)
                               .groups(groups)
                               .bias(false));
}

/// What a network is made of (torchvision's resnet.py: its block, layers, groups, width_per_group).
struct ArchSpec {
  bool bottleneck;
  std::array<int64_t, 4> blocks_per_stage;
  BottleneckShape shape = {};
};

ArchSpec arch_spec(config::Arch arch) {
  switch (arch) {
    case config::Arch::resnet18: return {false, {2, 2, 2, 2}};
    case config::Arch::resnet34: return {false, {3, 4, 6, 3}};
    case config::Arch::resnet50: return {true, {3, 4, 6, 3}};
    case config::Arch::resnet101: return {true, {3, 4, 23, 3}};
    case config::Arch::resnet152: return {true, {3, 8, 36, 3}};
    case config::Arch::wide_resnet50_2: return {true, {3, 4, 6, 3}, {1, 128}};
    case config::Arch::wide_resnet101_2: return {true, {3, 4, 23, 3}, {1, 128}};
    case config::Arch::resnext50_32x4d: return {true, {3, 4, 6, 3}, {32, 4}};
    case config::Arch::resnext101_32x8d: return {true, {3, 4, 23, 3}, {32, 8}};
    case config::Arch::resnext101_64x4d: return {true, {3, 4, 23, 3}, {64, 4}};
  }
  TORCH_CHECK(false, "unknown ResNet arch ", static_cast<int>(arch));
}

/// layer1..layer4 and the channel count they end with (the fc's input features).
struct Stages {
  std::array<torch::nn::Sequential, 4> layers;
  int64_t out_channels;
};

/// Builds the four stages from `Block` (BasicBlockImpl or BottleneckImpl). Stage i has
/// planes = width * 2^i; its first block halves H,W (except in layer1) and gets a projection
/// shortcut whenever stride or channels change. Modules are created in torchvision's order
/// (a block's downsample before its convs), so the random init draws come in the same order.
template <class Block>
Stages make_stages(int64_t width, const ArchSpec& spec, const LayerBackends& backends) {
  const std::array<int64_t, 4>& blocks_per_stage = spec.blocks_per_stage;
  Stages stages{{}, width};
  int64_t in_channels = width;  // the stem's output
  for (size_t stage = 0; stage < stages.layers.size(); ++stage) {
    const int64_t planes = width << stage;
    const int64_t out_channels = planes * Block::expansion;
    torch::nn::Sequential layer;
    for (int64_t index = 0; index < blocks_per_stage[stage]; ++index) {
      const int64_t stride = (stage > 0 && index == 0) ? 2 : 1;
      torch::nn::Sequential projection{nullptr};
      if (stride != 1 || in_channels != out_channels)
        projection = torch::nn::Sequential(conv_no_bias(in_channels, out_channels, 1, stride),
                                           BatchNorm2d(out_channels, backends.batch_norm));
      if constexpr (std::is_same_v<Block, BottleneckImpl>) {
        layer->push_back(
            std::make_shared<Block>(in_channels, planes, stride, std::move(projection), backends, spec.shape));
      } else {
        layer->push_back(std::make_shared<Block>(in_channels, planes, stride, std::move(projection), backends));
      }
      in_channels = out_channels;
    }
    stages.layers[stage] = layer;
  }
  stages.out_channels = in_channels;
  return stages;
}

}  // namespace

// ---- BatchNorm ---------------------------------------------------------------------------------

BatchNorm2dImpl::BatchNorm2dImpl(int64_t channels, std::shared_ptr<const ops::BatchNormBackends> backends)
    : channels_(channels), backends_(std::move(backends)) {
  reset();
}

void BatchNorm2dImpl::reset() {
  // PyTorch's registration order: weight, bias, running_mean, running_var, num_batches_tracked.
  weight = register_parameter("weight", torch::ones({channels_}));
  bias = register_parameter("bias", torch::zeros({channels_}));
  running_mean = register_buffer("running_mean", torch::zeros({channels_}));
  running_var = register_buffer("running_var", torch::ones({channels_}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kInt64));
}

ops::BatchNormParameters BatchNorm2dImpl::parameters() const {
  return {weight, bias, running_mean, running_var, kMomentum, kEps};
}

torch::Tensor BatchNorm2dImpl::forward(const torch::Tensor& x) {
  return ops::batch_norm(x, {}, /*relu=*/false, parameters(), is_training(), *backends_);
}

torch::Tensor BatchNorm2dImpl::forward_with_statistics(const ops::ConvWithStatistics& input) {
  return ops::batch_norm(input.y, {}, /*relu=*/false, parameters(), is_training(), *backends_, nullptr,
                         input.statistics);
}

torch::Tensor BatchNorm2dImpl::forward_relu(const torch::Tensor& x, const torch::Tensor& residual,
                                            torch::Tensor* second_output) {
  return ops::batch_norm(x, residual, /*relu=*/true, parameters(), is_training(), *backends_, second_output);
}

torch::Tensor BatchNorm2dImpl::forward_relu(const ops::ConvWithStatistics& input, const torch::Tensor& residual,
                                            torch::Tensor* second_output) {
  return ops::batch_norm(input.y, residual, /*relu=*/true, parameters(), is_training(), *backends_, second_output,
                         input.statistics);
}

bool BatchNorm2dImpl::takes_conv_statistics() const {
  return backends_->conv_statistics && backends_->ltrain && !backends_->sum_over_ranks && is_training();
}

ops::ConvWithStatistics convolve(const torch::nn::Conv2d& conv, const torch::Tensor& x,
                                 const ops::ConvolutionBackends& backends, const BatchNorm2dImpl* next_norm) {
  const auto& options = conv->options;
  ops::ConvolutionParameters parameters;
  parameters.stride = options.stride()->at(0);
  // Every convolution of the model comes from conv_no_bias, which pads by kernel / 2.
  parameters.padding = conv->weight.size(2) / 2;
  parameters.groups = options.groups();
  const bool with_statistics = next_norm != nullptr && next_norm->takes_conv_statistics();
  return ops::convolution(x, conv->weight, parameters, backends, with_statistics);
}

// ---- Residual blocks ---------------------------------------------------------------------------

torch::Tensor ResidualBlockImpl::forward(torch::Tensor x) { return forward_block({std::move(x), {}}).y; }

BlockOutput ResidualBlockImpl::forward_block(const BlockOutput& input) {
  const torch::Tensor shortcut_output = shortcut(input.shortcut_input());
  BlockOutput output;
  // A second output only where a gradient will flow back through it.
  const bool wants_second = torch::GradMode::is_enabled();
  output.y = last_norm()->forward_relu(residual_branch(input.y), shortcut_output,
                                       wants_second ? &output.y_for_shortcut : nullptr);
  return output;
}

torch::Tensor ResidualBlockImpl::shortcut(const torch::Tensor& x) {
  if (!downsample) return x;
  // make_stages builds every projection as [Conv2d, BatchNorm2d]; anything else runs as it is.
  std::shared_ptr<torch::nn::Conv2dImpl> conv;
  std::shared_ptr<BatchNorm2dImpl> norm;
  if (downsample->size() == 2) {
    conv = std::dynamic_pointer_cast<torch::nn::Conv2dImpl>(downsample->ptr(0));
    norm = std::dynamic_pointer_cast<BatchNorm2dImpl>(downsample->ptr(1));
  }
  if (!conv || !norm) return downsample->forward(x);
  return norm->forward_with_statistics(convolve(torch::nn::Conv2d(conv), x, norm.get()));
}

void ResidualBlockImpl::register_downsample(torch::nn::Sequential projection) {
  if (projection) downsample = register_module("downsample", std::move(projection));
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t planes, int64_t stride, torch::nn::Sequential projection,
                               const LayerBackends& backends)
    : ResidualBlockImpl(backends) {
  conv1 = register_module("conv1", conv_no_bias(in_channels, planes, 3, stride));
  bn1 = register_module("bn1", BatchNorm2d(planes, backends.batch_norm));
  conv2 = register_module("conv2", conv_no_bias(planes, planes, 3, 1));
  bn2 = register_module("bn2", BatchNorm2d(planes, backends.batch_norm));
  register_downsample(std::move(projection));
}

ops::ConvWithStatistics BasicBlockImpl::residual_branch(torch::Tensor x) {
  x = bn1->forward_relu(convolve(conv1, x).y);  // [B,planes,H/s,W/s]
  return convolve(conv2, x);
}

int64_t BottleneckShape::inner_channels(int64_t planes) const {
  return std::max<int64_t>(1, planes * width_per_group / 64) * groups;
}

BottleneckImpl::BottleneckImpl(int64_t in_channels, int64_t planes, int64_t stride, torch::nn::Sequential projection,
                               const LayerBackends& backends, BottleneckShape shape)
    : ResidualBlockImpl(backends) {
  const int64_t inner = shape.inner_channels(planes);
  conv1 = register_module("conv1", conv_no_bias(in_channels, inner, 1, 1));
  bn1 = register_module("bn1", BatchNorm2d(inner, backends.batch_norm));
  conv2 = register_module("conv2", conv_no_bias(inner, inner, 3, stride, shape.groups));  // v1.5: stride here
  bn2 = register_module("bn2", BatchNorm2d(inner, backends.batch_norm));
  conv3 = register_module("conv3", conv_no_bias(inner, planes * expansion, 1, 1));
  bn3 = register_module("bn3", BatchNorm2d(planes * expansion, backends.batch_norm));
  register_downsample(std::move(projection));
}

ops::ConvWithStatistics BottleneckImpl::residual_branch(torch::Tensor x) {
  x = bn1->forward_relu(convolve(conv1, x, bn1.get()));  // [B,inner,H,W]
  x = bn2->forward_relu(convolve(conv2, x).y);            // [B,inner,H/s,W/s]
  return convolve(conv3, x, bn3.get());                   // [B,4*planes,H/s,W/s]
}

// ---- ResNet ------------------------------------------------------------------------------------

ResNetImpl::ResNetImpl(const ResNetOptions& options)
    : options_(options),
      batch_norm_backends_(std::make_shared<ops::BatchNormBackends>()),
      convolution_backends_(std::make_shared<ops::ConvolutionBackends>()) {
  batch_norm_backends_->ltrain = options_.ltrain_batch_norm;
  batch_norm_backends_->cudnn = options_.cudnn_batch_norm;
  batch_norm_backends_->conv_statistics = options_.fused_conv;
  if (options_.fused_conv && !ops::fused_conv_built()) warn_fused_conv_not_built();
  const int64_t width = options_.width;
  if (options_.stem == config::Stem::imagenet) {
    conv1 = register_module("conv1", conv_no_bias(3, width, 7, 2));
  } else {
    conv1 = register_module("conv1", conv_no_bias(3, width, 3, 1));
  }
  bn1 = register_module("bn1", BatchNorm2d(width, batch_norm_backends_));

  const ArchSpec spec = arch_spec(options_.arch);
  const LayerBackends backends{batch_norm_backends_, convolution_backends_};
  Stages stages = spec.bottleneck ? make_stages<BottleneckImpl>(width, spec, backends)
                                  : make_stages<BasicBlockImpl>(width, spec, backends);
  const std::array<torch::nn::Sequential*, 4> layer_members{&layer1, &layer2, &layer3, &layer4};
  for (size_t stage = 0; stage < layer_members.size(); ++stage)
    *layer_members[stage] = register_module("layer" + std::to_string(stage + 1), stages.layers[stage]);

  fc = register_module("fc", torch::nn::Linear(stages.out_channels, options_.num_classes));
  initialize_weights();
  checkpoint_segments_ = split_into_segments(blocks(), options_.checkpoint_segments);
  // Handles stay valid through to(device) and load_state_dict, which change the tensors in place.
  for (const auto& module : modules(/*include_self=*/false))
    if (auto* batch_norm = module->as<BatchNorm2d>()) batch_counters_.push_back(batch_norm->num_batches_tracked);
}

void ResNetImpl::synchronize_batch_norm(std::function<torch::Tensor(const torch::Tensor&)> sum_over_ranks) {
  batch_norm_backends_->sum_over_ranks = std::move(sum_over_ranks);
}

void ResNetImpl::set_convolution_backends(const ops::ConvolutionBackends& backends) {
  *convolution_backends_ = backends;
}

void ResNetImpl::count_training_batch() {
  torch::NoGradGuard no_grad;
  torch::_foreach_add_(batch_counters_, 1);
}

void ResNetImpl::initialize_weights() {
  torch::NoGradGuard no_grad;
  // Pre-order over the registered modules, the order of torchvision's self.modules().
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* conv = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(conv->weight, /*a=*/0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* batch_norm = module->as<BatchNorm2d>()) {
      torch::nn::init::ones_(batch_norm->weight);
      torch::nn::init::zeros_(batch_norm->bias);
    }
  }
  if (options_.zero_init_residual) {
    for (const auto& block : blocks()) torch::nn::init::zeros_(block->last_norm()->weight);
  }
}

torch::Tensor ResNetImpl::forward(torch::Tensor x) {
  if (is_training() && forward_counts_batches_) count_training_batch();
  x = forward_stem(std::move(x));  // [B,width,H',W']
  if (!checkpoint_segments_.empty() && is_training() && torch::GradMode::is_enabled()) {
    for (size_t s = 0; s + 1 < checkpoint_segments_.size(); ++s) x = checkpointed_segment(checkpoint_segments_[s], x);
    x = run_segment(checkpoint_segments_.back(), std::move(x));
  } else {
    x = run_segment(blocks(), std::move(x));  // [B,8*width*expansion,H'/8,W'/8]
  }
  return forward_head(std::move(x));  // [B,num_classes]
}

torch::Tensor ResNetImpl::forward_stem(torch::Tensor images) {
  // The stem's convolution would take any channels past its weight's and ignore them: only the
  // images' own, or those padded where cuDNN's stem runs faster, are images.
  const int64_t channels = conv1->weight.size(1);
  const int64_t padded = ops::padded_image_channels(channels, images.scalar_type(), images.suggest_memory_format(),
                                                    images.device());
  if (images.dim() != 4 || (images.size(1) != channels && images.size(1) != padded))
    throw std::invalid_argument(fmt::format("ResNet: images of shape [{}], expected [B,{},H,W]{}",
                                            fmt::join(images.sizes(), ","), channels,
                                            padded != channels ? fmt::format(" or [B,{},H,W]", padded) : ""));
  torch::Tensor x = bn1->forward_relu(convolve(conv1, images, *convolution_backends_).y);
  if (options_.stem == config::Stem::imagenet) x = ops::max_pool2d(x, 3, 2, 1, {options_.ltrain_max_pool});
  return x;
}

int64_t ResNetImpl::first_stage_side(int64_t image_side) const {
  if (options_.stem != config::Stem::imagenet) return image_side;
  const int64_t after_conv = (image_side - 1) / 2 + 1;  // 7x7, stride 2, padding 3
  return (after_conv - 1) / 2 + 1;                      // 3x3 max pool, stride 2, padding 1
}

torch::Tensor ResNetImpl::forward_head(torch::Tensor features) {
  // flatten (a reshape), not view: correct whatever the memory format of the pooled map. A 1x1 map
  // (the imagenet stem at 32x32) is its own mean, exactly: no pooling kernel, forward or backward.
  const bool one_position = features.size(2) == 1 && features.size(3) == 1;
  torch::Tensor pooled = torch::flatten(one_position ? features : torch::adaptive_avg_pool2d(features, {1, 1}), 1);
  return fc->forward(pooled);  // pooled [B,C]
}

std::vector<torch::nn::Sequential> ResNetImpl::stages() const { return {layer1, layer2, layer3, layer4}; }

std::vector<std::shared_ptr<ResidualBlockImpl>> ResNetImpl::blocks() const {
  std::vector<std::shared_ptr<ResidualBlockImpl>> result;
  for (const auto& layer : stages()) {
    for (size_t index = 0; index < layer->size(); ++index) {
      auto block = std::dynamic_pointer_cast<ResidualBlockImpl>(layer->ptr(index));
      TORCH_INTERNAL_ASSERT(block, "stage module ", index, " is not a residual block");
      result.push_back(std::move(block));
    }
  }
  return result;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& parameter : module.parameters(/*recurse=*/true))
    if (parameter.requires_grad()) total += parameter.numel();
  return total;
}

}  // namespace ltrain::models
