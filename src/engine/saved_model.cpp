#include "ltrain/engine/saved_model.h"

#include "ltrain/config/config.h"
#include "ltrain/engine/run.h"
#include "ltrain/engine/state_dict.h"
#include "ltrain/io/tensor_file.h"

namespace ltrain::engine {

CheckpointEvaluation evaluate_checkpoint(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  const Checkpoint checkpoint = read_checkpoint(file);
  const config::LoadedConfig loaded =
      config::load_json(checkpoint.meta.config, file.string() + " (its saved config)", overrides);
  RunParts parts;
  parts.training = false;
  parts.weights_from_caller = true;
  Run run(loaded, parts);
  load_state_dict(*run.model(), evaluation_weights(checkpoint), file.string());
  return {checkpoint.meta.step, loaded.config.data, evaluate(run.model(), run.eval_loader(), loaded.config)};
}

std::map<std::string, std::string> export_metadata(const Checkpoint& checkpoint, const std::filesystem::path& file) {
  std::map<std::string, std::string> metadata{{"format", "pt"},
                                              {"producer", "ltrain " LTRAIN_VERSION},
                                              {"source_checkpoint", file.string()},
                                              {"step", std::to_string(checkpoint.meta.step)}};
  const nlohmann::json& model = checkpoint.meta.config.value("model", nlohmann::json::object());
  for (const auto& [key, value] : model.items())
    metadata["model." + key] = value.is_string() ? value.get<std::string>() : value.dump();
  const nlohmann::json& data = checkpoint.meta.config.value("data", nlohmann::json::object());
  for (const char* key : {"source", "cifar100_labels", "normalize", "mean", "std"}) {
    if (!data.contains(key)) continue;
    const nlohmann::json& value = data[key];
    metadata[std::string("data.") + key] = value.is_string() ? value.get<std::string>() : value.dump();
  }
  // CIFAR-100's labelling only where the test set is CIFAR-100's.
  if (data.value("source", "") != config::to_string(config::DataSource::cifar100))
    metadata.erase("data.cifar100_labels");
  return metadata;
}

size_t export_weights(const std::filesystem::path& file, const std::filesystem::path& out) {
  const Checkpoint checkpoint = read_checkpoint(file);
  const NamedTensors& weights = evaluation_weights(checkpoint);
  io::write_safetensors(out, weights, export_metadata(checkpoint, file));
  return weights.size();
}

}  // namespace ltrain::engine
