// Loading a run config (load.h): the sources assembled (sources.h), each section read key by key
// (key_reader.h), the defaults that follow data.source filled in, then the checks across keys
// (validate.h).
#include "ltrain/config/load.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "key_reader.h"
#include "ltrain/core/errors.h"
#include "sources.h"
#include "strict_json.h"
#include "validate.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

/// CIFAR-100's folder, as scripts/get-cifar100.sh puts it.
constexpr const char* kCifar100Root = "data/cifar-100-binary";

/// Where `document` (the files, overrides or saved config read) leaves `section.key` out, sets it
/// to `value`, recorded as set where data.source was.
template <class T>
void follow_source(LoadedConfig& loaded, const json& document, const std::string& section, const std::string& key,
                   T& field, T value) {
  const auto given = document.find(section);
  if (given != document.end() && given->is_object() && given->contains(key)) return;
  field = std::move(value);
  const auto source = loaded.origin.find("data.source");
  loaded.origin[section + "." + key] = source == loaded.origin.end() ? loaded.source : source->second;
}

/// A cifar100 config that leaves them out reads data/cifar-100-binary, normalizes with CIFAR-100's
/// training-set channel statistics and has an output per class of the label it trains on.
/// (The struct's defaults are CIFAR-10's, which the other sources keep.)
void follow_data_source(LoadedConfig& loaded, const json& document) {
  RunConfig& c = loaded.config;
  if (c.data.source != DataSource::cifar100) return;
  follow_source(loaded, document, "data", "root", c.data.root, std::string(kCifar100Root));
  follow_source(loaded, document, "data", "mean", c.data.mean, std::vector<double>{0.5071, 0.4865, 0.4409});
  follow_source(loaded, document, "data", "std", c.data.std, std::vector<double>{0.2673, 0.2564, 0.2762});
  follow_source(loaded, document, "model", "num_classes", c.model.num_classes, c.data.classes());
}

/// run.epochs as the files (or document) set it, before any override.
int64_t epochs_before_overrides(const json& root) {
  const auto run = root.find("run");
  if (run != root.end() && run->is_object()) {
    const auto epochs = run->find("epochs");
    if (epochs != run->end() && epochs->is_number_integer() && epochs->get<int64_t>() >= 1)
      return epochs->get<int64_t>();
  }
  return RunSection{}.epochs;
}

bool set_by_override(const LoadedConfig& loaded, const std::string& key) {
  const auto it = loaded.origin.find(key);
  return it != loaded.origin.end() && it->second.rfind("--set ", 0) == 0;
}

/// A recipe run for another number of epochs by a run.epochs override alone keeps its progressive
/// resizing as the same share of the run (at least the last epoch at the full side; none in a
/// one-epoch run), with a note; an override of data.progressive_epochs itself is taken as given.
void follow_run_epochs(LoadedConfig& loaded, int64_t recipe_epochs) {
  DataSection& data = loaded.config.data;
  const int64_t epochs = loaded.config.run.epochs;
  if (data.progressive_start_size == 0 || data.progressive_epochs == 0 || epochs == recipe_epochs) return;
  if (!set_by_override(loaded, "run.epochs") || set_by_override(loaded, "data.progressive_epochs")) return;
  const int64_t before = data.progressive_epochs;
  const auto share = static_cast<double>(before) / static_cast<double>(recipe_epochs);
  data.progressive_epochs =
      epochs < 2 ? 0 : std::clamp<int64_t>(std::llround(share * static_cast<double>(epochs)), 1, epochs - 1);
  const std::string& source = loaded.origin["run.epochs"];
  spdlog::info("data.progressive_epochs {} of {} epochs follows {}: {}; set data.progressive_epochs to choose (0: "
               "off)",
               before, recipe_epochs, source,
               data.progressive_epochs == 0 ? std::string("off in a one-epoch run")
                                            : fmt::format("{} of {}", data.progressive_epochs, epochs));
  loaded.origin["data.progressive_epochs"] = source;
}

LoadedConfig resolve(Document doc, const std::vector<std::string>& overrides, const std::string& default_source,
                     const MoreChecks& more_checks) {
  const int64_t recipe_epochs = epochs_before_overrides(doc.root);
  for (const auto& spec : overrides) apply_override(doc, spec, override_source(spec), config_keys());
  rename_earlier_keys(doc, default_source);
  // Every problem at once: each value that cannot be taken (left at its default meanwhile), then
  // the checks across keys and the caller's, one line each.
  std::vector<std::string> problems;
  LoadedConfig loaded;
  loaded.config = read_run_config(doc, default_source, problems);
  loaded.origin = std::move(doc.origin);
  loaded.source = default_source;
  loaded.files = std::move(doc.files);
  follow_data_source(loaded, doc.root);
  follow_run_epochs(loaded, recipe_epochs);
  validate(loaded, problems);
  if (more_checks) {
    try {
      more_checks(loaded);
    } catch (const ConfigError& error) {
      problems.emplace_back(error.what());
    }
  }
  if (!problems.empty()) throw ConfigError(fmt::format("{}", fmt::join(problems, "\n")));
  return loaded;
}

}  // namespace

LoadedConfig load_file(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  return load_files({path}, overrides);
}

LoadedConfig load_files(const std::vector<std::filesystem::path>& paths, const std::vector<std::string>& overrides,
                        const MoreChecks& more_checks) {
  Document doc;
  for (const fs::path& path : paths) {
    std::vector<fs::path> chain;  // each file starts a chain of its own: two may extend one base
    read_file_into(doc, path, chain);
  }
  return resolve(std::move(doc), overrides, paths.back().string(), more_checks);
}

LoadedConfig load_json(const nlohmann::json& document, const std::string& source,
                       const std::vector<std::string>& overrides) {
  if (!document.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of config sections at the top level", source));
  if (nested_deeper_than(document, kMaxNesting))
    throw ConfigError(fmt::format("{}: objects and lists nested more than {} deep; a run config has two levels "
                                  "(sections and their keys)",
                                  source, kMaxNesting));
  Document doc;
  doc.root = document;
  return resolve(std::move(doc), overrides, source, {});
}

std::string default_data_root(DataSource source) {
  return source == DataSource::cifar100 ? kCifar100Root : DataSection{}.root;
}

ConfigError config_error(const LoadedConfig& loaded, const std::string& key, const std::string& message) {
  auto it = loaded.origin.find(key);
  const std::string& source = it == loaded.origin.end() ? loaded.source : it->second;
  const auto dot = key.find('.');
  const json value = to_json(loaded.config)[key.substr(0, dot)][key.substr(dot + 1)];
  return ConfigError(fmt::format("{}: {} = {}: {}", source, key, shown_value(value), message));
}

}  // namespace ltrain::config
