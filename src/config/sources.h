#pragma once
// Where a document's keys come from: a run config's file and the files it extends ("extends",
// relative to the file that names them, depth first), or a sweep file; then the --set / KEY=VALUE
// overrides in the order given. The source of every key is kept, so that an error names the file
// or the override that set it.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"

namespace ltrain::config {

/// A JSON document being assembled from files and overrides, with the source of every key. `Json`
/// is nlohmann::json, or nlohmann::ordered_json where the order of keys matters (a sweep's grid).
template <class Json>
struct BasicDocument {
  Json root = Json::object();
  std::map<std::string, std::string> origin;         ///< "optim.lr" -> "configs/x.json"
  std::map<std::string, std::string> override_text;  ///< "run.name" -> "123" as typed after --set
  std::vector<std::string> files;                     ///< the files read, the top one first
};
using Document = BasicDocument<nlohmann::json>;
using OrderedDocument = BasicDocument<nlohmann::ordered_json>;

/// Reads the run config `path` into `doc`, the files it extends first, so that its own keys win.
/// `chain` holds the files being read, the outermost first, to refuse a cycle.
void read_file_into(Document& doc, const std::filesystem::path& path, std::vector<std::filesystem::path>& chain);

/// "--set KEY=VALUE" as messages name an override (cut and made one line by shown()).
std::string override_source(const std::string& spec);

/// Applies one override KEY=VALUE of a document that `keys` describes, named `source` in messages
/// and origins. VALUE is JSON when it parses as JSON (a number, true/false, a list, an object),
/// otherwise a plain string. KEY is "section.name", a section with an object (`optim={"lr":0.05}`
/// sets the keys it holds), or a key of the top level (a sweep's "mode"), whose value it replaces.
template <class Json>
void apply_override(BasicDocument<Json>& doc, const std::string& spec, const std::string& source,
                    const ConfigKeys& keys);

/// Moves each key `doc` holds under an earlier name (renamed_keys()) to its name now, with its
/// source, and logs one note per earlier name and process saying so. ConfigError when a document
/// sets both names.
void rename_earlier_keys(Document& doc, const std::string& default_source);

/// Where `path` ("optim.lr", "optim") was set: its file or override, else `default_source`.
template <class Json>
const std::string& source_of(const BasicDocument<Json>& doc, const std::string& path,
                             const std::string& default_source) {
  const auto it = doc.origin.find(path);
  return it == doc.origin.end() ? default_source : it->second;
}

}  // namespace ltrain::config
