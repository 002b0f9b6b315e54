// ltrain_parity: one fp32 training forward/backward of ltrain's ResNet on a given batch, written
// out for scripts/pytorch/parity_torchvision.py to compare against torchvision's resnet with the same
// weights. A development tool, not part of the user-facing CLI.
#include <iostream>

#include <cxxopts.hpp>
#include <fmt/format.h>

#include "ltrain/config/config.h"
#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/engine/train_step.h"
#include "ltrain/io/tensor_file.h"

namespace {

torch::Tensor require_tensor(const ltrain::NamedTensors& tensors, const std::string& name, const std::string& file) {
  const torch::Tensor* tensor = ltrain::find_tensor(tensors, name);
  if (!tensor) throw ltrain::DataError(fmt::format("{}: has no tensor \"{}\"", file, name));
  return *tensor;
}

int run(int argc, char** argv) {
  cxxopts::Options options("ltrain_parity", "fp32 forward/backward of one batch, for comparison with torchvision");
  options.add_options()("arch", "torchvision's name: resnet18..resnet152, wide_resnet50_2, resnext50_32x4d, ...",
                        cxxopts::value<std::string>()->default_value("resnet50"))(
      "stem", "imagenet | cifar", cxxopts::value<std::string>()->default_value("imagenet"))(
      "device", "cpu | cuda | cuda:N", cxxopts::value<std::string>()->default_value("cpu"))(
      "seed", "initialization seed", cxxopts::value<int64_t>()->default_value("0"))(
      "batch-in", "safetensors with images [B,3,H,W] float32 and labels [B] int64", cxxopts::value<std::string>())(
      "out", "safetensors to write", cxxopts::value<std::string>())("help", "show this help");
  const auto args = options.parse(argc, argv);
  if (args.count("help") || !args.count("batch-in") || !args.count("out")) {
    std::cout << options.help();
    return args.count("help") ? 0 : 2;
  }
  const auto loaded = ltrain::config::load_json(
      nlohmann::json::object(), "ltrain_parity",
      {"model.arch=" + args["arch"].as<std::string>(), "model.stem=" + args["stem"].as<std::string>(),
       "run.device=" + args["device"].as<std::string>(), "run.seed=" + std::to_string(args["seed"].as<int64_t>())});
  ltrain::engine::RunParts parts;
  parts.data = false;
  parts.training = false;
  ltrain::engine::Run run(loaded, parts);
  const torch::Device& device = run.device();
  ltrain::compat::set_tf32(false, false);  // plain float32 arithmetic on both sides
  ltrain::compat::set_cudnn(false, true);

  const std::string batch_file = args["batch-in"].as<std::string>();
  const auto batch = ltrain::io::read_safetensors(batch_file);
  const torch::Tensor images = require_tensor(batch, "images", batch_file).to(device);  // [B,3,H,W] float32
  const torch::Tensor labels = require_tensor(batch, "labels", batch_file).to(device);  // [B] int64

  ltrain::models::ResNet& model = run.model();
  ltrain::NamedTensors out;
  for (const auto& [name, tensor] : ltrain::engine::state_dict(*model))
    out.emplace_back("weights." + name, tensor.detach().clone());  // before the forward updates BN statistics
  model->train();
  const torch::Tensor logits = model->forward(images);
  const torch::Tensor loss = ltrain::engine::classification_loss(logits, labels, 0.0);
  loss.backward();
  out.emplace_back("logits", logits.detach());
  out.emplace_back("loss", loss.detach());
  for (const auto& [name, param] : ltrain::engine::named_parameters(*model)) out.emplace_back("grad." + name, param.grad());
  ltrain::io::write_safetensors(args["out"].as<std::string>(), out);
  std::cout << fmt::format("ltrain_parity: loss {:.6f}, wrote {} tensors to {}\n", loss.item<double>(), out.size(),
                           args["out"].as<std::string>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ltrain::UserError& error) {
    std::cerr << "ltrain_parity: " << error.what() << "\n";
    return static_cast<int>(error.code());
  } catch (const std::exception& error) {
    std::cerr << "ltrain_parity: " << error.what() << "\n";
    return 1;
  }
}
