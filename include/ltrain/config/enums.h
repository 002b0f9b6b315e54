#pragma once
// The run configuration's enumerations, each with its spelled names (the JSON values), and the
// classes of the data sources' labels, apart from the sections of config.h: a module's options may
// hold these values (a network's arch, an optimizer's name) with this header alone, so that a new
// key in a section rebuilds no module.
#include <array>
#include <cstdint>
#include <utility>

namespace ltrain::config {

enum class Arch {
  resnet18,
  resnet34,
  resnet50,
  resnet101,
  resnet152,
  wide_resnet50_2,
  wide_resnet101_2,
  resnext50_32x4d,
  resnext101_32x8d,
  resnext101_64x4d
};
enum class Stem { imagenet, cifar };
enum class DataSource { cifar10, cifar100, synthetic };
enum class Cifar100Labels { fine, coarse };
/// Classes of each labelling the sources give (a label is 0 to N-1). The synthetic source draws
/// CIFAR-10's.
constexpr int64_t kCifar10Classes = 10;
constexpr int64_t kCifar100FineClasses = 100;
constexpr int64_t kCifar100CoarseClasses = 20;
enum class OptimizerKind { sgd, adamw };
enum class ScheduleKind { constant, multistep, cosine, onecycle };
enum class PrecisionMode { fp32, tf32, fp16, bf16 };
enum class BestMetric { none, test_acc, test_loss };
enum class DistBackend { automatic, gloo, nccl };
enum class GradientDtype { fp32, bf16, fp16 };
enum class StepBranches { automatic, on, off };
enum class DependentLaunch { automatic, on, off };

template <class E>
struct EnumNames;  // specialised below: static constexpr std::array<std::pair<E, const char*>, N> names

template <>
struct EnumNames<Arch> {
  static constexpr std::array<std::pair<Arch, const char*>, 10> names{
      {{Arch::resnet18, "resnet18"},
       {Arch::resnet34, "resnet34"},
       {Arch::resnet50, "resnet50"},
       {Arch::resnet101, "resnet101"},
       {Arch::resnet152, "resnet152"},
       {Arch::wide_resnet50_2, "wide_resnet50_2"},
       {Arch::wide_resnet101_2, "wide_resnet101_2"},
       {Arch::resnext50_32x4d, "resnext50_32x4d"},
       {Arch::resnext101_32x8d, "resnext101_32x8d"},
       {Arch::resnext101_64x4d, "resnext101_64x4d"}}};
};
template <>
struct EnumNames<Stem> {
  static constexpr std::array<std::pair<Stem, const char*>, 2> names{
      {{Stem::imagenet, "imagenet"}, {Stem::cifar, "cifar"}}};
};
template <>
struct EnumNames<DataSource> {
  static constexpr std::array<std::pair<DataSource, const char*>, 3> names{
      {{DataSource::cifar10, "cifar10"}, {DataSource::cifar100, "cifar100"}, {DataSource::synthetic, "synthetic"}}};
};
template <>
struct EnumNames<Cifar100Labels> {
  static constexpr std::array<std::pair<Cifar100Labels, const char*>, 2> names{
      {{Cifar100Labels::fine, "fine"}, {Cifar100Labels::coarse, "coarse"}}};
};
template <>
struct EnumNames<OptimizerKind> {
  static constexpr std::array<std::pair<OptimizerKind, const char*>, 2> names{
      {{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adamw, "adamw"}}};
};
template <>
struct EnumNames<ScheduleKind> {
  static constexpr std::array<std::pair<ScheduleKind, const char*>, 4> names{{{ScheduleKind::constant, "constant"},
                                                                              {ScheduleKind::multistep, "multistep"},
                                                                              {ScheduleKind::cosine, "cosine"},
                                                                              {ScheduleKind::onecycle, "onecycle"}}};
};
template <>
struct EnumNames<PrecisionMode> {
  static constexpr std::array<std::pair<PrecisionMode, const char*>, 4> names{{{PrecisionMode::fp32, "fp32"},
                                                                               {PrecisionMode::tf32, "tf32"},
                                                                               {PrecisionMode::fp16, "fp16"},
                                                                               {PrecisionMode::bf16, "bf16"}}};
};

template <>
struct EnumNames<BestMetric> {
  static constexpr std::array<std::pair<BestMetric, const char*>, 3> names{
      {{BestMetric::none, "none"}, {BestMetric::test_acc, "test_acc"}, {BestMetric::test_loss, "test_loss"}}};
};
template <>
struct EnumNames<StepBranches> {
  static constexpr std::array<std::pair<StepBranches, const char*>, 3> names{
      {{StepBranches::automatic, "auto"}, {StepBranches::on, "on"}, {StepBranches::off, "off"}}};
};
template <>
struct EnumNames<DependentLaunch> {
  static constexpr std::array<std::pair<DependentLaunch, const char*>, 3> names{
      {{DependentLaunch::automatic, "auto"}, {DependentLaunch::on, "on"}, {DependentLaunch::off, "off"}}};
};
template <>
struct EnumNames<DistBackend> {
  static constexpr std::array<std::pair<DistBackend, const char*>, 3> names{
      {{DistBackend::automatic, "auto"}, {DistBackend::gloo, "gloo"}, {DistBackend::nccl, "nccl"}}};
};
template <>
struct EnumNames<GradientDtype> {
  static constexpr std::array<std::pair<GradientDtype, const char*>, 3> names{
      {{GradientDtype::fp32, "fp32"}, {GradientDtype::bf16, "bf16"}, {GradientDtype::fp16, "fp16"}}};
};

/// The JSON spelling of an enum value.
template <class E>
const char* to_string(E value) {
  for (const auto& [v, name] : EnumNames<E>::names)
    if (v == value) return name;
  return "?";
}

}  // namespace ltrain::config
