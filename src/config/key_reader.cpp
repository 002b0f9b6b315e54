// Key by key reading (key_reader.h): unknown keys and the closest known one; a run config's sections.
#include "key_reader.h"

#include <fmt/ranges.h>

namespace ltrain::config {
namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_key(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = 3;
  for (const auto& k : known) {
    const size_t d = key.rfind(k, 0) == 0 || k.rfind(key, 0) == 0 ? 1 : edit_distance(key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  return best;
}

void throw_unknown_key(const std::string& source, const std::string& prefix, const std::string& key,
                       const std::vector<std::string>& known) {
  const std::string path = join_key(prefix, key);
  if (const std::string best = closest_key(key, known); !best.empty())
    throw ConfigError(fmt::format("{}: unknown key \"{}\": did you mean \"{}\"?", source, shown(path), join_key(prefix, best)));
  throw ConfigError(fmt::format("{}: unknown key \"{}\"; the keys {} are: {}", source, shown(path),
                                prefix.empty() ? "at the top level" : "of " + prefix, fmt::join(known, ", ")));
}

std::string closest_key_or_section(const std::string& name) {
  // Keys before sections: "optim.lrr" is nearer "optim.lr" than "optim", which it starts with too.
  std::vector<std::string> known;
  for (const KeyInfo& info : config_keys().keys) known.push_back(info.name);
  for (const SectionInfo& section : config_keys().sections) known.push_back(section.name);
  return closest_key(name, known);
}

void throw_unknown_run_key(const std::string& source, const std::string& prefix, const std::string& key) {
  const std::string path = join_key(prefix, key);
  if (const std::string best = closest_key_or_section(key); !best.empty())
    throw ConfigError(fmt::format("{}: unknown key \"{}\": did you mean \"{}\"?", source, shown(path), join_key(prefix, best)));
  throw ConfigError(fmt::format("{}: unknown key \"{}\": {} takes run config keys (section.key) or sections; "
                                "ltrain train --help lists them",
                                source, shown(path), prefix));
}

RunConfig read_run_config(const Document& doc, const std::string& default_source, std::vector<std::string>& problems) {
  RunConfig config;
  KeyReader<nlohmann::json> reader(doc.root, "", doc, default_source, &problems);
  config.visit_sections(reader);
  reader.reject_unknown_keys();
  return config;
}

}  // namespace ltrain::config
