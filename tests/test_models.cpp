// ResNet architecture, names, init and forward, checked against torchvision's numbers.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ltrain/amp/autocast.h"
#include "ltrain/config/config.h"
#include "ltrain/engine/module_options.h"
#include "ltrain/engine/setup.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/models/resnet.h"
#include "ltrain/ops/batch_norm.h"
#include "ltrain/ops/fused_conv.h"
#include "support.h"

namespace {

using ltrain::config::Arch;
using ltrain::config::ModelSection;
using ltrain::config::Stem;
using ltrain::models::BatchNorm2d;
using ltrain::models::BatchNorm2dImpl;
using ltrain::models::ResNet;
using ltrain::models::ResNetOptions;

constexpr Arch kAllArchs[] = {Arch::resnet18, Arch::resnet34, Arch::resnet50, Arch::resnet101, Arch::resnet152};

/// The model section's defaults but for these.
ResNetOptions model_options(Arch arch, int64_t width, Stem stem = Stem::imagenet, int64_t num_classes = 10) {
  ResNetOptions options = ltrain::engine::resnet_options(ModelSection{});
  options.arch = arch;
  options.width = width;
  options.stem = stem;
  options.num_classes = num_classes;
  return options;
}

using ltrain::engine::state_dict;  // PyTorch's state_dict() order and names

std::vector<std::string> state_dict_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& entry : state_dict(module)) names.push_back(entry.first);
  return names;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// torchvision's state_dict names for a depth, written from its documented layout (independently
/// of ltrain's builder): stem, then per block conv1/bn1/conv2/bn2[/conv3/bn3][/downsample], fc.
std::vector<std::string> torchvision_state_names(const std::vector<int>& blocks_per_stage, bool bottleneck) {
  std::vector<std::string> names;
  auto add_conv = [&](const std::string& prefix) { names.push_back(prefix + ".weight"); };
  auto add_norm = [&](const std::string& prefix) {
    for (const char* leaf : {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"})
      names.push_back(prefix + "." + leaf);
  };
  add_conv("conv1");
  add_norm("bn1");
  for (size_t stage = 0; stage < blocks_per_stage.size(); ++stage) {
    for (int block = 0; block < blocks_per_stage[stage]; ++block) {
      const std::string prefix = "layer" + std::to_string(stage + 1) + "." + std::to_string(block);
      const int convs = bottleneck ? 3 : 2;
      for (int index = 1; index <= convs; ++index) {
        add_conv(prefix + ".conv" + std::to_string(index));
        add_norm(prefix + ".bn" + std::to_string(index));
      }
      // torchvision: a projection where stride != 1 or channels change, i.e. the first block of
      // layer2..4, and of layer1 too for bottlenecks (width -> 4*width).
      if (block == 0 && (stage > 0 || bottleneck)) {
        add_conv(prefix + ".downsample.0");
        add_norm(prefix + ".downsample.1");
      }
    }
  }
  names.push_back("fc.weight");
  names.push_back("fc.bias");
  return names;
}

/// Spatial size [H,W] after the stem and after each of layer1..layer4.
std::vector<std::vector<int64_t>> stage_sizes(ResNet& model, const torch::Tensor& images) {
  std::vector<std::vector<int64_t>> sizes;
  torch::Tensor x = model->forward_stem(images);
  sizes.push_back({x.size(2), x.size(3)});
  for (auto& layer : model->stages()) {
    x = layer->forward(x);
    sizes.push_back({x.size(2), x.size(3)});
  }
  return sizes;
}

// ---- Architecture --------------------------------------------------------------------------------

/// Each model of `expected` (model.arch and its parameter count) at torchvision's width, with the
/// imagenet stem and `num_classes` outputs, has exactly that many parameters.
void expect_parameter_counts(const std::vector<std::pair<Arch, int64_t>>& expected, int64_t num_classes) {
  for (const auto& [arch, count] : expected) {
    ResNet model(model_options(arch, 64, Stem::imagenet, num_classes));
    EXPECT_EQ(ltrain::models::count_parameters(*model), count) << ltrain::config::to_string(arch);
  }
}

TEST(ResNet, ParameterCountsMatchTorchvision) {
  expect_parameter_counts({{Arch::resnet18, 11'181'642},
                           {Arch::resnet34, 21'289'802},
                           {Arch::resnet50, 23'528'522},
                           {Arch::resnet101, 42'520'650},
                           {Arch::resnet152, 58'164'298}},
                          10);
  expect_parameter_counts({{Arch::resnet50, 25'557'032}}, 1000);
}

TEST(ResNet, WideResNetAndResNeXtParameterCountsMatchTorchvision) {
  // torchvision's counts for its 1000-class models (the num_params of their published weights).
  expect_parameter_counts({{Arch::wide_resnet50_2, 68'883'240},
                           {Arch::wide_resnet101_2, 126'886'696},
                           {Arch::resnext50_32x4d, 25'028'904},
                           {Arch::resnext101_32x8d, 88'791'336},
                           {Arch::resnext101_64x4d, 83'455'272}},
                          1000);
}

TEST(ResNet, ResNeXtGroupsTheMiddleConvolution) {
  ResNet model(model_options(Arch::resnext50_32x4d, 64, Stem::cifar, 10));
  const auto modules = model->named_modules();
  // layer1's planes are 64: 64 * 4 / 64 = 4 channels in each of 32 groups.
  auto* conv2 = modules["layer1.0.conv2"]->as<torch::nn::Conv2d>();
  ASSERT_NE(conv2, nullptr);
  EXPECT_EQ(conv2->options.groups(), 32);
  EXPECT_EQ(conv2->weight.sizes(), (std::vector<int64_t>{128, 4, 3, 3}));
  EXPECT_EQ(modules["layer1.0.conv3"]->as<torch::nn::Conv2d>()->weight.size(0), 256);
  // A narrow test model keeps one channel per group.
  ResNet narrow(model_options(Arch::resnext50_32x4d, 8, Stem::cifar, 10));
  EXPECT_EQ(narrow->named_modules()["layer1.0.conv2"]->as<torch::nn::Conv2d>()->weight.size(0), 32);
  const torch::Tensor logits = narrow->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(ResNet, CountParametersSkipsFrozenParameters) {
  ResNet model(model_options(Arch::resnet18, 8));
  const int64_t all = ltrain::models::count_parameters(*model);
  model->named_parameters()["fc.weight"].set_requires_grad(false);
  EXPECT_EQ(ltrain::models::count_parameters(*model), all - 10 * 64);  // fc: [10, 8*8*1]
}

TEST(ResNet, OutputShapeForEveryDepthAndStem) {
  torch::manual_seed(0);
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  for (Arch arch : kAllArchs) {
    for (Stem stem : {Stem::imagenet, Stem::cifar}) {
      ResNet model(model_options(arch, 8, stem));
      const torch::Tensor logits = model->forward(images);
      const std::string label = std::string(ltrain::config::to_string(arch)) + "/" + ltrain::config::to_string(stem);
      EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10})) << label;
      EXPECT_EQ(logits.scalar_type(), torch::kFloat32) << label;
      EXPECT_TRUE(torch::isfinite(logits).all().item<bool>()) << label;
    }
  }
}

TEST(ResNet, ImagesOfAnotherChannelCountAreRefused) {
  // The stem's convolution would ignore channels past its weight's: only the images' own 3, or
  // the padded count of ops::padded_image_channels (3 on the CPU), are taken.
  torch::manual_seed(0);
  ResNet model(model_options(Arch::resnet18, 8, Stem::cifar));
  EXPECT_NO_THROW(model->forward(torch::randn({2, 3, 32, 32})));
  for (const int64_t channels : {1, 4, 8}) {
    try {
      model->forward(torch::randn({2, channels, 32, 32}));
      ADD_FAILURE() << channels << " channels were taken";
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("expected [B,3,H,W]"), std::string::npos) << error.what();
    }
  }
}

TEST(ResNet, FirstStageSideIsTheStemOutputs) {
  torch::manual_seed(0);
  for (Stem stem : {Stem::imagenet, Stem::cifar}) {
    ResNet model(model_options(Arch::resnet18, 8, stem));
    model->eval();
    for (int64_t side : {16, 24, 32, 33, 57}) {
      const torch::Tensor stem_output = model->forward_stem(torch::randn({1, 3, side, side}));  // [1,8,h,h]
      EXPECT_EQ(model->first_stage_side(side), stem_output.size(2)) << ltrain::config::to_string(stem) << " " << side;
    }
  }
}

TEST(ResNet, AcceptsNonSquareInputsAndOtherClassCounts) {
  torch::manual_seed(0);
  const torch::Tensor images = torch::randn({2, 3, 40, 57});
  for (Stem stem : {Stem::imagenet, Stem::cifar}) {
    ResNet model(model_options(Arch::resnet18, 8, stem, 7));
    EXPECT_EQ(model->forward(images).sizes(), (std::vector<int64_t>{2, 7})) << ltrain::config::to_string(stem);
  }
}

TEST(ResNet, LayerShapesOfResNet50) {
  ResNet model(model_options(Arch::resnet50, 64));
  auto parameters = model->named_parameters();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"conv1.weight", {64, 3, 7, 7}},
      {"layer1.0.conv1.weight", {64, 64, 1, 1}},
      {"layer1.0.conv2.weight", {64, 64, 3, 3}},
      {"layer1.0.conv3.weight", {256, 64, 1, 1}},
      {"layer1.0.downsample.0.weight", {256, 64, 1, 1}},
      {"layer1.1.conv1.weight", {64, 256, 1, 1}},
      {"layer2.0.conv1.weight", {128, 256, 1, 1}},
      {"layer2.0.downsample.0.weight", {512, 256, 1, 1}},
      {"layer3.5.conv2.weight", {256, 256, 3, 3}},
      {"layer4.2.conv3.weight", {2048, 512, 1, 1}},
      {"layer4.2.bn3.weight", {2048}},
      {"fc.weight", {10, 2048}},
      {"fc.bias", {10}}};
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(parameters.contains(name)) << name;
    EXPECT_EQ(parameters[name].sizes(), shape) << name;
  }
}

TEST(ResNet, BottleneckStridesOnItsThreeByThreeConv) {
  ResNet model(model_options(Arch::resnet50, 8));
  auto modules = model->named_modules();
  auto stride_of = [&](const std::string& name) {
    return torch::IntArrayRef(modules[name]->as<torch::nn::Conv2d>()->options.stride()).vec();
  };
  EXPECT_EQ(stride_of("layer2.0.conv1"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(stride_of("layer2.0.conv2"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(stride_of("layer2.0.downsample.0"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(stride_of("layer2.1.conv2"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(stride_of("layer1.0.downsample.0"), (std::vector<int64_t>{1, 1}));
}

// ---- Names and order (state dicts move to and from torchvision unchanged) ------------------------

TEST(ResNet, StateDictNamesAndOrderOfResNet50MatchTorchvision) {
  ResNet model(model_options(Arch::resnet50, 8));
  const std::vector<std::string> names = state_dict_names(*model);
  ASSERT_EQ(names.size(), 320u);
  const std::vector<std::string> first = {"conv1.weight",        "bn1.weight",          "bn1.bias",
                                          "bn1.running_mean",    "bn1.running_var",     "bn1.num_batches_tracked",
                                          "layer1.0.conv1.weight", "layer1.0.bn1.weight"};
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 8), first);
  EXPECT_EQ(names[18], "layer1.0.conv3.weight");
  EXPECT_EQ(names[24], "layer1.0.downsample.0.weight");
  EXPECT_EQ(names[29], "layer1.0.downsample.1.num_batches_tracked");
  EXPECT_EQ(names[30], "layer1.1.conv1.weight");
  const std::vector<std::string> last = {"layer4.2.conv3.weight", "layer4.2.bn3.weight",
                                         "layer4.2.bn3.bias",     "layer4.2.bn3.running_mean",
                                         "layer4.2.bn3.running_var", "layer4.2.bn3.num_batches_tracked",
                                         "fc.weight",             "fc.bias"};
  EXPECT_EQ(std::vector<std::string>(names.end() - 8, names.end()), last);
  EXPECT_EQ(names, torchvision_state_names({3, 4, 6, 3}, /*bottleneck=*/true));

  const auto parameters = model->named_parameters();
  ASSERT_EQ(parameters.size(), 161u);
  EXPECT_EQ(parameters.keys().front(), "conv1.weight");
  EXPECT_EQ(parameters.keys()[1], "bn1.weight");
  EXPECT_EQ(parameters.keys()[3], "layer1.0.conv1.weight");
  EXPECT_EQ(parameters.keys()[parameters.size() - 2], "fc.weight");
  EXPECT_EQ(parameters.keys().back(), "fc.bias");
  EXPECT_EQ(model->named_buffers().size(), 159u);  // 53 BatchNorms x (mean, var, count)
}

TEST(ResNet, StateDictNamesOfEveryDepthMatchTorchvision) {
  const std::vector<std::pair<Arch, std::vector<int>>> layouts = {{Arch::resnet18, {2, 2, 2, 2}},
                                                                  {Arch::resnet34, {3, 4, 6, 3}},
                                                                  {Arch::resnet50, {3, 4, 6, 3}},
                                                                  {Arch::resnet101, {3, 4, 23, 3}},
                                                                  {Arch::resnet152, {3, 8, 36, 3}}};
  for (const auto& [arch, blocks] : layouts) {
    ResNet model(model_options(arch, 4));
    const bool bottleneck = arch != Arch::resnet18 && arch != Arch::resnet34;
    EXPECT_EQ(state_dict_names(*model), torchvision_state_names(blocks, bottleneck)) << ltrain::config::to_string(arch);
  }
  ResNet resnet18(model_options(Arch::resnet18, 64));
  EXPECT_EQ(state_dict(*resnet18).size(), 122u);  // torchvision resnet18: 122 entries, 62 parameters
  EXPECT_EQ(resnet18->named_parameters().size(), 62u);
}

// ---- Stems -----------------------------------------------------------------------------------------

TEST(ResNet, StemKernelAndStageResolutions) {
  torch::manual_seed(0);
  const torch::Tensor images = torch::randn({2, 3, 32, 32});

  ResNet imagenet(model_options(Arch::resnet18, 64, Stem::imagenet));
  EXPECT_EQ(imagenet->named_parameters()["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 7, 7}));
  ResNet cifar(model_options(Arch::resnet18, 64, Stem::cifar));
  EXPECT_EQ(cifar->named_parameters()["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 3, 3}));
  // Same names either way: the max-pool has no parameters.
  EXPECT_EQ(state_dict_names(*imagenet), state_dict_names(*cifar));

  // Tiny models for the forward: [H,W] after stem, layer1, layer2, layer3, layer4.
  ResNet imagenet_small(model_options(Arch::resnet18, 8, Stem::imagenet));
  ResNet cifar_small(model_options(Arch::resnet18, 8, Stem::cifar));
  using Sizes = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(stage_sizes(imagenet_small, images), (Sizes{{8, 8}, {8, 8}, {4, 4}, {2, 2}, {1, 1}}));
  EXPECT_EQ(stage_sizes(cifar_small, images), (Sizes{{32, 32}, {32, 32}, {16, 16}, {8, 8}, {4, 4}}));
  EXPECT_EQ(imagenet_small->forward_stem(images).size(1), 8);
}

TEST(ResNet, BlocksInOrderComposeToForward) {
  torch::manual_seed(0);
  const std::vector<std::pair<Arch, size_t>> block_counts = {
      {Arch::resnet18, 8}, {Arch::resnet34, 16}, {Arch::resnet50, 16}, {Arch::resnet101, 33}, {Arch::resnet152, 50}};
  for (const auto& [arch, count] : block_counts) {
    ResNet model(model_options(arch, 4));
    EXPECT_EQ(model->blocks().size(), count) << ltrain::config::to_string(arch);
  }

  ResNet model(model_options(Arch::resnet50, 8, Stem::cifar));
  model->eval();
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  torch::Tensor x = model->forward_stem(images);
  for (const auto& block : model->blocks()) x = block->forward(x);
  EXPECT_TRUE(torch::equal(model->forward_head(x), model->forward(images)));
}

// ---- Initialization ----------------------------------------------------------------------------------

TEST(ResNet, ConvWeightsAreKaimingNormalFanOut) {
  torch::manual_seed(1);
  ResNet model(model_options(Arch::resnet50, 64));
  int checked = 0;
  for (const auto& item : model->named_parameters()) {
    const torch::Tensor& weight = item.value();
    if (weight.dim() != 4) continue;
    const double fan_out = static_cast<double>(weight.size(0) * weight.size(2) * weight.size(3));
    const double expected_std = std::sqrt(2.0 / fan_out);
    const double n = static_cast<double>(weight.numel());
    // The sample std has a relative standard error of ~1/sqrt(2n): allow 6 of them.
    EXPECT_NEAR(weight.std().item<double>() / expected_std, 1.0, 6.0 / std::sqrt(2.0 * n)) << item.key();
    EXPECT_NEAR(weight.mean().item<double>() / expected_std, 0.0, 6.0 / std::sqrt(n)) << item.key();
    ++checked;
  }
  EXPECT_EQ(checked, 53);
  // Normal, not uniform: ~4.55% of the draws lie beyond 2 std (a uniform of that std has none).
  const torch::Tensor big = model->named_parameters()["layer4.0.conv2.weight"];  // 512*512*9 draws
  const double beyond = (big.abs() > 2.0 * std::sqrt(2.0 / (512.0 * 9.0))).to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(beyond, 0.0455, 0.002);
}

TEST(ResNet, BatchNormMatchesLibTorchsAndCountsOncePerTrainingForward) {
  // Our BatchNorm2d against torch::nn::BatchNorm2d with PyTorch's defaults: same outputs, input
  // gradients and running statistics in training, then the same outputs in evaluation.
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({6, 5, 7, 7}) * 3 + 1;
  BatchNorm2d ours(5);
  torch::nn::BatchNorm2d theirs(torch::nn::BatchNorm2dOptions(5).eps(1e-5).momentum(0.1));
  const torch::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
  const torch::Tensor ya = ours->forward(xa), yb = theirs->forward(xb);
  EXPECT_TRUE(torch::allclose(ya, yb, 1e-6, 1e-6));
  (ya * ya).sum().backward();
  (yb * yb).sum().backward();
  EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(ours->running_mean, theirs->running_mean));
  EXPECT_TRUE(torch::allclose(ours->running_var, theirs->running_var));
  ours->eval();
  theirs->eval();
  EXPECT_TRUE(torch::allclose(ours->forward(x), theirs->forward(x), 1e-6, 1e-6));
  std::vector<std::string> names;
  for (const auto& item : ours->named_parameters()) names.push_back(item.key());
  for (const auto& item : ours->named_buffers()) names.push_back(item.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));

  // In a ResNet every counter advances once per training forward, as each torch BatchNorm does.
  ResNet model(model_options(Arch::resnet18, 4));
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  model->forward(images);
  model->forward(images);
  model->eval();
  model->forward(images);
  for (const auto& item : model->named_buffers()) {
    if (item.key().find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(item.value().item<int64_t>(), 2) << item.key();
    }
  }
}

TEST(ResNet, BatchNormForwardReluIsReluOfNormPlusResidual) {
  // The path every run without the fused kernel takes (the CPU, fp32, evaluation): the add and
  // the ReLU in place on the norm's output, with the same gradients as out-of-place operators.
  torch::manual_seed(6);
  const torch::Tensor x = torch::randn({4, 8, 5, 5}), residual = torch::randn({4, 8, 5, 5});
  BatchNorm2d fused(8), separate(8);
  for (const bool with_residual : {false, true}) {
    const torch::Tensor xa = x.clone().requires_grad_(), xb = x.clone().requires_grad_();
    const torch::Tensor ra = residual.clone().requires_grad_(), rb = residual.clone().requires_grad_();
    const torch::Tensor ya = fused->forward_relu(xa, with_residual ? ra : torch::Tensor());
    torch::Tensor yb = separate->forward(xb);
    if (with_residual) yb = yb + rb;
    yb = torch::relu(yb);
    EXPECT_TRUE(torch::allclose(ya, yb, 1e-6, 1e-6));
    EXPECT_GT((ya == 0).sum().item<int64_t>(), 0);  // the ReLU clipped something
    (ya * ya).sum().backward();
    (yb * yb).sum().backward();
    EXPECT_TRUE(torch::allclose(xa.grad(), xb.grad(), 1e-5, 1e-6));
    if (with_residual) {
      EXPECT_TRUE(torch::allclose(ra.grad(), rb.grad(), 1e-5, 1e-6));
    }
    EXPECT_TRUE(torch::allclose(fused->running_mean, separate->running_mean));
    EXPECT_TRUE(torch::allclose(fused->running_var, separate->running_var));
  }
  // model.cudnn_batch_norm and model.ltrain_batch_norm reach every BatchNorm of a ResNet.
  auto options = model_options(Arch::resnet50, 4);
  options.cudnn_batch_norm = false;
  ResNet model(options);
  for (const auto& module : model->modules(/*include_self=*/false))
    if (auto* norm = module->as<BatchNorm2d>()) {
      EXPECT_FALSE(norm->backends().cudnn);
      EXPECT_TRUE(norm->backends().ltrain);
    }
}

TEST(ResNet, BatchNormStartsAtIdentityAndLinearKeepsDefaultInit) {
  ResNet model(model_options(Arch::resnet50, 8));
  int norms = 0;
  for (const auto& item : model->named_modules()) {
    auto* batch_norm = item.value()->as<BatchNorm2d>();
    if (batch_norm == nullptr) continue;
    ++norms;
    EXPECT_TRUE(torch::all(batch_norm->weight == 1).item<bool>()) << item.key();
    EXPECT_TRUE(torch::all(batch_norm->bias == 0).item<bool>()) << item.key();
    EXPECT_TRUE(torch::all(batch_norm->running_mean == 0).item<bool>()) << item.key();
    EXPECT_TRUE(torch::all(batch_norm->running_var == 1).item<bool>()) << item.key();
  }
  EXPECT_EQ(norms, 53);
  EXPECT_DOUBLE_EQ(BatchNorm2dImpl::kEps, 1e-5);  // PyTorch's defaults, which torchvision trained with
  EXPECT_DOUBLE_EQ(BatchNorm2dImpl::kMomentum, 0.1);

  // PyTorch's Linear default: weight and bias uniform in +-1/sqrt(in_features), not all zero.
  auto parameters = model->named_parameters();
  const double bound = 1.0 / std::sqrt(256.0);  // fc in = 8 * width(8) * 4
  for (const char* name : {"fc.weight", "fc.bias"}) {
    const torch::Tensor& value = parameters[name];
    EXPECT_LE(value.abs().max().item<double>(), bound) << name;
    EXPECT_GT(value.abs().max().item<double>(), 0.5 * bound) << name;
  }
}

TEST(ResNet, ZeroInitResidualZeroesTheLastNormOfEachBlock) {
  const std::vector<std::pair<Arch, std::string>> cases = {{Arch::resnet50, ".bn3.weight"},
                                                           {Arch::resnet18, ".bn2.weight"}};
  for (const auto& [arch, last_norm] : cases) {
    for (bool zero_init : {false, true}) {
      ResNetOptions options = model_options(arch, 8);
      options.zero_init_residual = zero_init;
      ResNet model(options);
      size_t zeroed = 0;
      for (const auto& item : model->named_parameters()) {
        const std::string& name = item.key();
        if (!ends_with(name, ".weight") || item.value().dim() != 1 || name == "fc.weight") continue;
        const bool is_last_norm = name.rfind("layer", 0) == 0 && ends_with(name, last_norm);
        const float expected = zero_init && is_last_norm ? 0.0f : 1.0f;
        EXPECT_TRUE(torch::all(item.value() == expected).item<bool>()) << name << " zero_init=" << zero_init;
        if (torch::all(item.value() == 0).item<bool>()) ++zeroed;
      }
      EXPECT_EQ(zeroed, zero_init ? model->blocks().size() : 0u) << ltrain::config::to_string(arch);
    }
  }
}

TEST(ResNet, SameSeedGivesIdenticalWeights) {
  auto build = [](uint64_t seed) {
    torch::manual_seed(seed);
    return ResNet(model_options(Arch::resnet18, 8));
  };
  const auto first = state_dict(*build(42));
  const auto again = state_dict(*build(42));
  const auto other = state_dict(*build(43));
  ASSERT_EQ(first.size(), again.size());
  bool any_difference = false;
  for (size_t index = 0; index < first.size(); ++index) {
    EXPECT_TRUE(torch::equal(first[index].second, again[index].second)) << first[index].first;
    if (!torch::equal(first[index].second, other[index].second)) any_difference = true;
  }
  EXPECT_TRUE(any_difference) << "another seed must give other weights";
}

// ---- Forward paths -------------------------------------------------------------------------------

TEST(ResNet, ChannelsLastGivesTheSameLogits) {
  torch::manual_seed(3);
  const torch::Tensor images = torch::randn({2, 3, 32, 32});
  for (Stem stem : {Stem::imagenet, Stem::cifar}) {
    ResNet model(model_options(Arch::resnet50, 8, stem));
    model->eval();
    torch::NoGradGuard no_grad;
    const torch::Tensor reference = model->forward(images);
    const torch::Tensor input_only = model->forward(images.contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(input_only, reference, 1e-4, 1e-5)) << ltrain::config::to_string(stem);

    // Weights in channels_last too, the way the trainer converts a model.
    for (auto& parameter : model->parameters())
      if (parameter.dim() == 4) parameter.set_data(parameter.data().contiguous(torch::MemoryFormat::ChannelsLast));
    const torch::Tensor all_channels_last = model->forward(images.contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_TRUE(torch::allclose(all_channels_last, reference, 1e-4, 1e-5)) << ltrain::config::to_string(stem);
  }
}

TEST(ResNet, BackwardReachesEveryParameter) {
  torch::manual_seed(4);
  for (Arch arch : {Arch::resnet18, Arch::resnet50}) {
    ResNet model(model_options(arch, 8, Stem::cifar));
    const torch::Tensor images = torch::randn({4, 3, 32, 32});
    const torch::Tensor labels = torch::randint(0, 10, {4}, torch::kLong);
    torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
    for (const auto& item : model->named_parameters()) {
      const torch::Tensor& grad = item.value().grad();
      ASSERT_TRUE(grad.defined()) << item.key();
      EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << item.key();
      EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << item.key();
    }
  }
}

TEST(ResNet, TrainingForwardUpdatesRunningStats) {
  torch::manual_seed(5);
  ResNet model(model_options(Arch::resnet18, 8, Stem::cifar));
  model->forward(torch::randn({2, 3, 32, 32}) * 3 + 1);
  auto buffers = model->named_buffers();
  EXPECT_EQ(buffers["bn1.num_batches_tracked"].item<int64_t>(), 1);
  EXPECT_FALSE(torch::all(buffers["bn1.running_mean"] == 0).item<bool>());
  model->eval();
  model->forward(torch::randn({2, 3, 32, 32}));
  EXPECT_EQ(buffers["bn1.num_batches_tracked"].item<int64_t>(), 1);
}

}  // namespace

namespace ltrain {
namespace {

using testing::gpu_batch;
using testing::gpu_config;
using testing::max_relative_difference;

// ---- On the GPU -------------------------------------------------------------------------------------

TEST(ActivationCheckpointing, SameGradientsOnTheGpu_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  auto gradients = [](const std::vector<std::string>& extra) {
    const auto loaded = gpu_config(extra);
    // Deterministic cuDNN: the same algorithms on both sides.
    const testing::CudnnFlags repeatable(/*deterministic=*/true, /*benchmark=*/false);
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    const data::Batch batch = gpu_batch(16, 3);
    {
      const amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16, loaded.config.precision.mode ==
                                                                             config::PrecisionMode::bf16);
      engine::classification_loss(model->forward(batch.images), batch.labels, 0.0).backward();
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu().clone());
    return grads;
  };
  EXPECT_LT(max_relative_difference(gradients({"model.checkpoint_segments=4"}), gradients({})), 1e-4);
  EXPECT_LT(max_relative_difference(gradients({"model.checkpoint_segments=4", "precision.mode=bf16"}),
                                    gradients({"precision.mode=bf16"})),
            1e-2);
}

/// sqrt(sum ||a_i - b_i||^2) / sqrt(sum ||b_i||^2): all of a model's gradients as one vector.
double overall_relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double difference = 0.0, reference = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - b[i]).square().sum().item<double>();
    reference += b[i].square().sum().item<double>();
  }
  return std::sqrt(difference / reference);
}

TEST(ResNet, GradientsOnEachBatchNormBackendAreAsCloseToFloat32AsTheUnfusedModels_CUDA) {
  LTRAIN_REQUIRE_CUDA();
  // Which BatchNorm a model runs: ltrain's kernels, cuDNN's fused kernel, or three operators.
  enum class Norm { ltrain, cudnn, separate };
  auto gradients = [](const std::string& precision, Norm norm) {
    // ResNet-18 at batch 64: a randomly initialized ResNet-50 at batch 16 is so ill-conditioned
    // that fp16's rounding alone moves its gradients by 60% of their norm, fused or not.
    const auto loaded = gpu_config({"model.channels_last=true", "precision.mode=" + precision,
                                    std::string("model.ltrain_batch_norm=") + (norm == Norm::ltrain ? "true" : "false"),
                                    std::string("model.cudnn_batch_norm=") + (norm == Norm::cudnn ? "true" : "false")});
    // Deterministic cuDNN everywhere, except for ltrain's kernels, which that flag turns off.
    const testing::CudnnFlags repeatable(/*deterministic=*/norm != Norm::ltrain, /*benchmark=*/false);
    models::ResNet model = engine::build_model(loaded, torch::kCUDA);
    const data::Batch batch = gpu_batch(64, 3);
    const torch::Tensor images = batch.images.contiguous(at::MemoryFormat::ChannelsLast);
    {
      const amp::AutocastGuard autocast(torch::kCUDA, torch::kHalf, precision == "fp16");
      // The cifar stem ends in its BatchNorm-ReLU pair: the single kernel's node, or ReLU's.
      const torch::Tensor stem = model->forward_stem(images);
      const std::string stem_node = stem.grad_fn()->name();
      if (precision == "fp16") {
        const bool ltrain_runs = ops::ltrain_batch_norm_fit(torch::kCUDA).runs;
        EXPECT_EQ(stem_node.find("LtrainBatchNorm") != std::string::npos, norm == Norm::ltrain && ltrain_runs) << stem_node;
        EXPECT_EQ(stem_node.find("CudnnBatchNorm") != std::string::npos, norm == Norm::cudnn) << stem_node;
      }
      engine::classification_loss(model->forward(images), batch.labels, 0.0).backward();
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu().to(torch::kFloat32).clone());
    return grads;
  };
  const auto reference = gradients("fp32", Norm::separate);
  const auto unfused = gradients("fp16", Norm::separate);
  const double unfused_error = overall_relative_difference(unfused, reference);
  EXPECT_LT(unfused_error, 0.2);  // a comparison between answers close to float32's
  std::vector<std::pair<std::string, Norm>> single_kernels{{"ltrain's kernels", Norm::ltrain}};
  if (ops::cudnn_batch_norm_built()) single_kernels.emplace_back("cuDNN's fused kernel", Norm::cudnn);
  for (const auto& [name, norm] : single_kernels) {
    const auto fused = gradients("fp16", norm);
    const double fused_error = overall_relative_difference(fused, reference);
    std::cout << "fp16 gradients against float32: " << name << " " << fused_error << " (worst tensor "
              << max_relative_difference(fused, reference) << "), three operators " << unfused_error
              << " (worst tensor " << max_relative_difference(unfused, reference) << "); the two apart "
              << overall_relative_difference(fused, unfused) << "\n";
    EXPECT_LT(fused_error, 1.5 * unfused_error + 1e-3) << name;
  }
}

/// The names of every autograd node `output` was computed through, one entry a node.
std::multiset<std::string> autograd_node_names(const torch::Tensor& output) {
  std::multiset<std::string> names;
  std::vector<torch::autograd::Node*> pending{output.grad_fn().get()};
  std::set<torch::autograd::Node*> seen;
  while (!pending.empty()) {
    torch::autograd::Node* node = pending.back();
    pending.pop_back();
    if (node == nullptr || !seen.insert(node).second) continue;
    names.insert(node->name());
    for (const auto& edge : node->next_edges()) pending.push_back(edge.function.get());
  }
  return names;
}

size_t count_names_containing(const std::multiset<std::string>& names, const std::string& part) {
  return static_cast<size_t>(std::count_if(names.begin(), names.end(), [&](const std::string& name) {
    return name.find(part) != std::string::npos;
  }));
}

bool any_name_contains(const std::multiset<std::string>& names, const std::string& part) {
  return count_names_containing(names, part) > 0;
}

TEST(ResNet, FusedConvolutionsChangeNothingWhereTheyDoNotRun) {
  // On the CPU (and in builds without the kernels) model.fused_conv leaves the model as it was.
  auto logits = [](bool fused) {
    ResNetOptions options = model_options(Arch::resnet50, 8, Stem::cifar);
    options.fused_conv = fused;
    torch::manual_seed(2);
    ResNet model(options);
    model->train();
    torch::manual_seed(3);
    return model->forward(torch::randn({2, 3, 32, 32}));
  };
  EXPECT_TRUE(torch::equal(logits(true), logits(false)));
}

TEST(ResNet, FusedConvolutionsInABottleneckAreAsCloseToFloat32AsCudnns_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::fused_conv_fit(torch::kCUDA));
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  // One bottleneck at 32x32 (C -> 16 -> 16 -> 64 channels): its two 1x1 convolutions are taken,
  // ahead of a ReLU and of an add + ReLU with a second output; with 32 input channels its
  // projection shortcut's 1x1 convolution too, ahead of a BatchNorm without ReLU. One block, not
  // a network: a randomly initialized ResNet-50's gradients move by half their norm with rounding
  // alone, whichever kernels run.
  struct Outcome {
    torch::Tensor y;
    std::vector<torch::Tensor> grads, running;
    std::multiset<std::string> nodes;
  };
  const testing::CudnnFlags repeatable(/*deterministic=*/false, /*benchmark=*/false);
  auto run_block = [](int64_t in_channels, std::optional<torch::ScalarType> half, bool fused) {
    auto backends = std::make_shared<ops::BatchNormBackends>();
    backends->conv_statistics = fused;
    torch::manual_seed(21);
    torch::nn::Sequential projection{nullptr};
    if (in_channels != 64)
      projection = torch::nn::Sequential(
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, 64, 1).bias(false)),
          models::BatchNorm2d(64, backends));
    models::LayerBackends layer_backends;
    layer_backends.batch_norm = backends;
    auto block = std::make_shared<models::BottleneckImpl>(in_channels, 16, 1, projection, layer_backends);
    block->to(torch::kCUDA);
    for (auto& parameter : block->parameters())
      if (parameter.dim() == 4) parameter.set_data(parameter.contiguous(at::MemoryFormat::ChannelsLast));
    block->train();
    torch::manual_seed(22);
    const auto options = torch::TensorOptions().device(torch::kCUDA);
    const torch::Tensor x0 =
        torch::randn({8, in_channels, 32, 32}, options).contiguous(at::MemoryFormat::ChannelsLast);
    const torch::Tensor grad_y = torch::randn({8, 64, 32, 32}, options).contiguous(at::MemoryFormat::ChannelsLast);
    Outcome outcome;
    const torch::Tensor x = (half ? x0.to(*half) : x0).detach().requires_grad_(true);
    {
      const amp::AutocastGuard autocast(torch::kCUDA, half.value_or(torch::kHalf), half.has_value());
      outcome.y = block->forward(x);
      outcome.nodes = autograd_node_names(outcome.y);
    }
    outcome.y.backward(grad_y.to(outcome.y.scalar_type()));
    outcome.y = outcome.y.detach().to(torch::kFloat32);
    outcome.grads.push_back(x.grad().to(torch::kFloat32));
    for (const auto& p : block->parameters()) outcome.grads.push_back(p.grad().to(torch::kFloat32));
    for (const auto& b : block->buffers())
      if (b.is_floating_point()) outcome.running.push_back(b.clone());
    return outcome;
  };
  for (const int64_t in_channels : {64, 32}) {
    const size_t fused_convolutions = in_channels == 64 ? 2 : 3;
    const Outcome reference = run_block(in_channels, std::nullopt, false);
    for (const auto dtype : {torch::kHalf, torch::kBFloat16}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (in_channels == 64 ? ", identity" : ", projection"));
      const Outcome cudnn = run_block(in_channels, dtype, false);
      const Outcome fused = run_block(in_channels, dtype, true);
      EXPECT_EQ(count_names_containing(fused.nodes, "ConvWithStatistics"), fused_convolutions);
      EXPECT_FALSE(any_name_contains(cudnn.nodes, "ConvWithStatistics"));
      const double unfused_error = overall_relative_difference(cudnn.grads, reference.grads);
      const double fused_error = overall_relative_difference(fused.grads, reference.grads);
      std::cout << c10::toString(dtype) << ", " << in_channels << " input channels, bottleneck gradients against "
                << "float32: fused " << fused_error << ", cuDNN's " << unfused_error << "; outputs "
                << overall_relative_difference({fused.y}, {reference.y}) << " and "
                << overall_relative_difference({cudnn.y}, {reference.y}) << "\n";
      EXPECT_LT(fused_error, 1.5 * unfused_error + 1e-3);
      EXPECT_LT(overall_relative_difference({fused.y}, {reference.y}),
                1.5 * overall_relative_difference({cudnn.y}, {reference.y}) + 1e-3);
      EXPECT_LT(overall_relative_difference(fused.running, reference.running), 1e-3);
    }
  }
}

TEST(ResNet, FusedConvolutionsStepAsideInEvaluationAndForSmallMaps_CUDA) {
  LTRAIN_REQUIRE_KERNELS(ops::fused_conv_fit(torch::kCUDA));
  LTRAIN_REQUIRE_KERNELS(ops::ltrain_batch_norm_fit(torch::kCUDA));
  const auto loaded = gpu_config({"model.arch=resnet50", "model.channels_last=true", "precision.mode=bf16",
                                  "model.fused_conv=true"});
  models::ResNet model = engine::build_model(loaded, torch::kCUDA);
  const amp::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);
  // 16x16 images leave every 1x1 convolution below 32x32: none pays.
  const torch::Tensor small = torch::randn({4, 3, 16, 16}, torch::kCUDA).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(any_name_contains(autograd_node_names(model->forward(small)), "ConvWithStatistics"));
  const torch::Tensor images = torch::randn({4, 3, 32, 32}, torch::kCUDA).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(any_name_contains(autograd_node_names(model->forward(images)), "ConvWithStatistics"));
  // Evaluation normalizes with the running statistics: no convolution computes the batch's.
  model->eval();
  EXPECT_FALSE(any_name_contains(autograd_node_names(model->forward(images)), "ConvWithStatistics"));
}

}  // namespace
}  // namespace ltrain
