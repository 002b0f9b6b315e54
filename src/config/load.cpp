#include "ltrain/config/load.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kExtendsKey = "extends";
/// The longest file or folder name in a path (Linux's NAME_MAX), in bytes.
constexpr size_t kMaxNameBytes = 255;

/// A JSON document being assembled from files and overrides, with the source of every key.
struct Document {
  json root = json::object();
  std::map<std::string, std::string> origin;         // "optim.lr" -> "configs/x.json"
  std::map<std::string, std::string> override_text;  // "run.name" -> "123" as typed after --set
  std::vector<std::string> files;                     // the config files read, the top one first
};

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// ---- Text: UTF-8, and values as error messages quote them ----------------------------------------

/// The length of the UTF-8 sequence that starts at text[at], or 0 when no valid one starts there
/// (overlong forms, UTF-16 surrogates and code points past U+10FFFF are not valid).
size_t utf8_sequence_length(const std::string& text, size_t at) {
  const auto byte = [&text](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned lead = byte(at);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned code = 0, smallest = 0;
  if ((lead & 0xE0) == 0xC0) length = 2, code = lead & 0x1F, smallest = 0x80;
  else if ((lead & 0xF0) == 0xE0) length = 3, code = lead & 0x0F, smallest = 0x800;
  else if ((lead & 0xF8) == 0xF0) length = 4, code = lead & 0x07, smallest = 0x10000;
  else return 0;
  if (at + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(at + i) & 0x3F);
  }
  if (code < smallest || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return length;
}

bool is_utf8(const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

/// A JSON value as error messages quote it (see shown()).
template <class Json>
std::string shown_value(const Json& value) {
  return shown(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

/// What is wrong with a string of a config (a value or a key), as the end of a message; "" when
/// nothing is.
std::string string_problem(const std::string& text) {
  if (text.size() > kMaxStringBytes) return fmt::format("longer than {} bytes; use a shorter one", kMaxStringBytes);
  if (text.find('\0') != std::string::npos) return "a NUL character (\\u0000) cannot be part of a setting; remove it";
  if (!is_utf8(text)) return "not valid UTF-8; write it in UTF-8";
  return "";
}

// ---- The strict JSON reader --------------------------------------------------------------------

/// "line L, column C" of byte `offset` of `text` (both from 1).
std::string line_and_column(const std::string& text, size_t offset) {
  offset = std::min(offset, text.size());
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n');
  const size_t newline = offset == 0 ? std::string::npos : text.rfind('\n', offset - 1);
  const size_t column = newline == std::string::npos ? offset + 1 : offset - newline;
  return fmt::format("line {}, column {}", line, column);
}

/// The offset of the quote that opens the JSON string whose closing quote is at `closing`.
size_t opening_quote(const std::string& text, size_t closing) {
  for (size_t at = closing; at-- > 0;) {
    if (text[at] != '"') continue;
    size_t backslashes = 0;
    while (backslashes < at && text[at - 1 - backslashes] == '\\') ++backslashes;
    if (backslashes % 2 == 0) return at;
  }
  return 0;
}

/// nlohmann's SAX interface, building the document while enforcing the reader's limits as it
/// goes: a document nested too deep is refused before it is built (it would overflow the stack
/// of the recursive code that copies and prints documents). The parser reads `text` through
/// `read_so_far`, which says how far it has got, so errors can name lines and columns.
template <class Json>
class StrictBuilder {
 public:
  using string_t = typename Json::string_t;

  StrictBuilder(const std::string& text, std::streambuf& read_so_far, const std::string& source,
                const std::string& prefix)
      : text_(text), read_so_far_(read_so_far), source_(source), prefix_(prefix) {}

  bool null() { return add(Json(nullptr)); }
  bool boolean(bool value) { return add(Json(value)); }
  bool number_integer(typename Json::number_integer_t value) { return add(Json(value)); }
  bool number_unsigned(typename Json::number_unsigned_t value) { return add(Json(value)); }
  bool number_float(typename Json::number_float_t value, const string_t&) { return add(Json(value)); }
  bool binary(typename Json::binary_t& value) { return add(Json::binary(std::move(value))); }
  bool string(string_t& value) {
    if (const std::string why = string_problem(value); !why.empty())
      throw ConfigError(fmt::format("{}: {} = {}: {}", source_, shown(value_path()), shown_value(Json(value)), why));
    return add(Json(std::move(value)));
  }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& name) {
    OpenContainer& object = open_.back();
    const size_t start = opening_quote(text_, read_offset() - 1);  // the parser has just read the closing quote
    const std::string path = join_key(object.path, name);
    if (const std::string why = string_problem(name); !why.empty())
      throw ConfigError(fmt::format("{}: key {} at {}: {}", source_, shown_value(Json(name)), line_and_column(text_, start), why));
    const auto [first, inserted] = object.key_offsets.emplace(name, start);
    if (!inserted)
      throw ConfigError(fmt::format("{}: \"{}\" is set twice, at {} and at {}; keep one", source_,
                                    shown(path), line_and_column(text_, first->second), line_and_column(text_, start)));
    pending_key_ = std::move(name);
    return true;
  }

  bool parse_error(std::size_t, const std::string& last_token, const nlohmann::json::exception& error) {
    // Number overflow (406) is the parser's only out_of_range error; the rest are syntax errors.
    if (dynamic_cast<const nlohmann::json::out_of_range*>(&error) != nullptr)
      throw ConfigError(fmt::format("{}: {} = {}: the number is out of range (a double holds about +-1.8e308); use a "
                                    "smaller one",
                                    source_, shown(value_path()), shown(last_token)));
    syntax_error_ = error.what();
    // nlohmann prefixes "[json.exception.parse_error.101] ": keep only the human part.
    if (const auto close = syntax_error_.find("] "); close != std::string::npos) syntax_error_.erase(0, close + 2);
    return false;
  }

  /// The document read, once the parse succeeded.
  Json take() { return std::move(root_); }
  /// nlohmann's description of the syntax error that stopped the parse ("" when none did).
  const std::string& syntax_error() const { return syntax_error_; }

 private:
  struct OpenContainer {
    Json* node;
    std::string path;                           ///< its key path, "section.key" or "grid.key[2]"
    std::map<std::string, size_t> key_offsets;  ///< an object's keys so far: where each begins
  };

  size_t read_offset() const {
    return static_cast<size_t>(read_so_far_.pubseekoff(0, std::ios::cur, std::ios::in));
  }

  /// The key path of the value the parser is about to hand over.
  std::string value_path() const {
    if (open_.empty()) return prefix_;
    const OpenContainer& parent = open_.back();
    if (parent.node->is_object()) return join_key(parent.path, pending_key_);
    return fmt::format("{}[{}]", parent.path, parent.node->size());
  }

  /// Puts `value` where the parser is (the root, the pending key, or the end of a list).
  Json* place(Json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *open_.back().node;
    if (parent.is_object()) return &(parent[pending_key_] = std::move(value));
    parent.push_back(std::move(value));
    return &parent.back();
  }

  bool add(Json value) {
    place(std::move(value));
    return true;
  }

  bool open(Json container) {
    if (open_.size() >= static_cast<size_t>(kMaxNesting))
      throw ConfigError(fmt::format("{}: {}: objects and lists nested more than {} deep; a run config has two levels "
                                    "(sections and their keys)",
                                    source_, line_and_column(text_, read_offset() - 1), kMaxNesting));
    std::string path = value_path();
    Json* node = place(std::move(container));
    open_.push_back({node, std::move(path), {}});
    return true;
  }

  bool close() {
    open_.pop_back();
    return true;
  }

  const std::string& text_;
  std::streambuf& read_so_far_;
  const std::string& source_;
  const std::string& prefix_;
  Json root_;
  std::vector<OpenContainer> open_;
  string_t pending_key_;
  std::string syntax_error_;
};

/// The strict parse of `text` (see parse_json), the values' key paths starting at `prefix`; nullopt
/// when `text` is not JSON at all, with nlohmann's description in `syntax_error`. ConfigError
/// when it is JSON that breaks a limit.
template <class Json>
std::optional<Json> parse_strictly(const std::string& text, const std::string& source, const std::string& prefix,
                                   std::string& syntax_error) {
  std::istringstream stream(text);
  StrictBuilder<Json> builder(text, *stream.rdbuf(), source, prefix);
  if (!Json::sax_parse(stream, &builder)) {
    syntax_error = builder.syntax_error();
    return std::nullopt;
  }
  return builder.take();
}

template <class Json>
Json parse_or_throw(const std::string& text, const std::string& source) {
  std::string syntax_error;
  std::optional<Json> document = parse_strictly<Json>(text, source, "", syntax_error);
  if (!document) throw ConfigError(fmt::format("{}: not valid JSON: {}", source, syntax_error));
  return std::move(*document);
}

/// Whether `value` holds objects and lists more than `levels` deep (looks no deeper than that).
bool nested_deeper_than(const json& value, int levels) {
  if (!value.is_structured()) return false;
  if (levels == 0) return true;
  return std::any_of(value.begin(), value.end(), [levels](const json& child) { return nested_deeper_than(child, levels - 1); });
}

// ---- Files and "extends" -----------------------------------------------------------------------

/// Copies `source_value` over `target`, recursing into objects, and records who set each key.
void merge(json& target, const json& source_value, const std::string& prefix, const std::string& source,
           std::map<std::string, std::string>& origin) {
  for (const auto& [key, value] : source_value.items()) {
    const std::string path = join_key(prefix, key);
    origin[path] = source;
    if (value.is_object()) {
      if (!target.contains(key) || !target[key].is_object()) target[key] = json::object();
      merge(target[key], value, path, source, origin);
    } else {
      target[key] = value;
    }
  }
}

void load_file_into(Document& doc, const fs::path& path, std::vector<fs::path>& chain) {
  const std::string text = read_config_text(path, "give the path of a run config (the examples are in configs/)");
  std::error_code no_canonical_form;
  fs::path canonical = fs::weakly_canonical(path, no_canonical_form);
  if (no_canonical_form) canonical = path.lexically_normal();
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end()) {
    std::string cycle;
    for (const auto& p : chain) cycle += p.filename().string() + " -> ";
    throw ConfigError(fmt::format("{}: \"extends\" makes a cycle: {}{}; remove one of the links", path.string(),
                                  cycle, path.filename().string()));
  }
  if (chain.size() >= static_cast<size_t>(kMaxNesting))
    throw ConfigError(fmt::format("{}: \"extends\" chains more than {} files; merge some of them", path.string(),
                                  kMaxNesting));
  json file_doc = parse_or_throw<json>(text, path.string());
  if (!file_doc.is_object())
    throw ConfigError(fmt::format("{}: expected a JSON object of config sections at the top level", path.string()));

  chain.push_back(canonical);
  doc.files.push_back(path.string());
  if (file_doc.contains(kExtendsKey)) {
    const json& extends = file_doc[kExtendsKey];
    std::vector<std::string> bases;
    if (extends.is_string()) {
      bases.push_back(extends.get<std::string>());
    } else if (extends.is_array() && std::all_of(extends.begin(), extends.end(), [](const json& e) { return e.is_string(); })) {
      for (const auto& e : extends) bases.push_back(e.get<std::string>());
    } else {
      throw ConfigError(fmt::format("{}: extends = {}: expected a file name or a list of file names", path.string(),
                                    shown_value(extends)));
    }
    for (const auto& base : bases) {
      const fs::path base_path = (path.parent_path() / base).lexically_normal();
      if (const std::string problem = files::not_a_regular_file(base_path); !problem.empty())
        throw ConfigError(fmt::format("{}: extends = \"{}\": {}: {} (paths are relative to this file)", path.string(),
                                      shown(base), shown(base_path.string()), problem));
      load_file_into(doc, base_path, chain);
    }
    file_doc.erase(kExtendsKey);
  }
  chain.pop_back();
  merge(doc.root, file_doc, "", path.string(), doc.origin);
}

/// Applies one `--set KEY=VALUE`. VALUE is JSON when it parses as JSON (a number, true/false, a
/// list, an object: `--set optim={"lr":0.05}` sets the keys it holds), otherwise a plain string.
void apply_override(Document& doc, const std::string& spec) {
  const std::string source = "--set " + shown(spec);
  if (!is_utf8(spec)) throw ConfigError(fmt::format("{}: not valid UTF-8; write the setting in UTF-8", source));
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("{}: expected KEY=VALUE, for example --set optim.lr=0.05", source));
  const std::string key = spec.substr(0, eq);
  const std::string text = spec.substr(eq + 1);
  // "section.name", or "section" with an object; nothing else names a setting.
  std::vector<std::string> parts;
  std::stringstream split(key);
  for (std::string part; std::getline(split, part, '.');) parts.push_back(part);
  if (key.size() > kMaxStringBytes || key.back() == '.' || parts.size() > 2 ||
      std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    parts.clear();

  std::string not_json;
  std::optional<json> parsed = parse_strictly<json>(text, source, key, not_json);
  json value = parsed ? std::move(*parsed) : json(text);
  if (!parsed) {
    if (const std::string why = string_problem(text); !why.empty())
      throw ConfigError(fmt::format("{}: {} = {}: {}", source, shown(key), shown_value(value), why));
  }
  const bool whole_section = parts.size() == 1 && value.is_object();
  if (parts.size() < 2 && !whole_section)
    throw ConfigError(fmt::format("{}: expected a key of the form section.name, for example optim.lr", source));

  json& section = doc.root[parts[0]];
  if (!section.is_object()) section = json::object();
  doc.origin[parts[0]] = source;
  if (whole_section) {
    merge(section, value, parts[0], source, doc.origin);
    return;
  }
  section[parts[1]] = std::move(value);
  doc.origin[key] = source;
  doc.override_text[key] = text;
}

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

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

/// "unknown key" with the closest known key, or the list of known keys.
[[noreturn]] void throw_unknown_key(const std::string& source, const std::string& prefix, const std::string& key,
                                    const std::vector<std::string>& known) {
  const std::string path = join_key(prefix, key);
  // The closest known key within two edits, or one that the typed key starts with ("optimizer").
  std::string best;
  size_t best_distance = 3;
  for (const auto& k : known) {
    const size_t d = key.rfind(k, 0) == 0 || k.rfind(key, 0) == 0 ? 1 : edit_distance(key, k);
    if (d < best_distance) best_distance = d, best = k;
  }
  if (!best.empty())
    throw ConfigError(fmt::format("{}: unknown key \"{}\": did you mean \"{}\"?", source, shown(path), join_key(prefix, best)));
  throw ConfigError(fmt::format("{}: unknown key \"{}\"; the keys {} are: {}", source, shown(path),
                                prefix.empty() ? "at the top level" : "of " + prefix, join(known, ", ")));
}

// ---- Constraint texts ----------------------------------------------------------------------------

[[maybe_unused]] std::string describe_range(const NoLimit&) { return ""; }
std::string describe_range(const Range& r) {
  if (r.hi >= 1e299) return fmt::format("{} {}", r.lo_exclusive ? ">" : ">=", r.lo);
  if (r.lo_exclusive) return fmt::format("> {} and <= {}", r.lo, r.hi);
  return fmt::format("between {} and {}", r.lo, r.hi);
}
[[maybe_unused]] bool in_range(double, const NoLimit&) { return true; }
bool in_range(double value, const Range& r) {
  return (r.lo_exclusive ? value > r.lo : value >= r.lo) && value <= r.hi;
}
template <class C>
std::string with_range(const std::string& noun, const C& constraint) {
  const std::string range = describe_range(constraint);
  return range.empty() ? noun : noun + " " + range;
}

template <class E>
std::string enum_choices(const char* separator) {
  std::vector<std::string> names;
  for (const auto& [value, name] : EnumNames<E>::names) names.push_back(name);
  return join(names, separator);
}

// What the user must give for a field of type T, e.g. "an integer >= 1", "one of sgd, adamw".
template <class T, class C>
std::string expectation(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("an integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("a number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("a list of numbers", c);
  else return "one of " + enum_choices<T>(", ");
}

// The short type column of --help, e.g. "integer >= 1", "sgd|adamw".
template <class T, class C>
std::string type_text(const C& c) {
  if constexpr (std::is_same_v<T, bool>) return "true|false";
  else if constexpr (std::is_same_v<T, int64_t>) return with_range("integer", c);
  else if constexpr (std::is_same_v<T, double>) return with_range("number", c);
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return with_range("list of numbers", c);
  else return enum_choices<T>("|");
}

template <class T>
json value_to_json(const T& value) {
  if constexpr (std::is_enum_v<T>) return to_string(value);
  else return value;
}

// ---- JSON Schema (draft 2020-12) of one key ------------------------------------------------------

[[maybe_unused]] void add_limits(nlohmann::ordered_json&, const NoLimit&) {}
void add_limits(nlohmann::ordered_json& schema, const Range& r) {
  schema[r.lo_exclusive ? "exclusiveMinimum" : "minimum"] = r.lo;
  if (r.hi < 1e299) schema["maximum"] = r.hi;
}

/// The schema of a number's value: JSON Schema's integer for int64_t (limits as integers there).
template <class C>
nlohmann::ordered_json number_schema(const char* type, const C& constraint) {
  nlohmann::ordered_json schema{{"type", type}};
  add_limits(schema, constraint);
  if (std::string(type) == "integer")
    for (const char* limit : {"minimum", "exclusiveMinimum", "maximum"})
      if (schema.contains(limit)) schema[limit] = static_cast<int64_t>(schema[limit].get<double>());
  return schema;
}

template <class T, class C>
nlohmann::ordered_json key_schema(const C& constraint) {
  if constexpr (std::is_same_v<T, bool>) return {{"type", "boolean"}};
  else if constexpr (std::is_same_v<T, int64_t>) return number_schema("integer", constraint);
  else if constexpr (std::is_same_v<T, double>) return number_schema("number", constraint);
  else if constexpr (std::is_same_v<T, std::string>) return {{"type", "string"}};
  else if constexpr (std::is_same_v<T, std::vector<double>>)
    return {{"type", "array"}, {"items", number_schema("number", constraint)}};
  else {
    nlohmann::ordered_json names = nlohmann::ordered_json::array();
    for (const auto& [value, name] : EnumNames<T>::names) names.push_back(name);
    return {{"type", "string"}, {"enum", names}};
  }
}

// ---- Visitors over the sections ----------------------------------------------------------------

/// Parses one section's JSON object into its struct, strictly.
class FieldReader {
 public:
  FieldReader(const json& object, std::string section, const Document& doc, const std::string& default_source)
      : object_(object), section_(std::move(section)), doc_(doc), default_source_(default_source) {}

  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* /*description*/, const C& constraint = {}) {
    known_.emplace_back(key);
    auto it = object_.find(key);
    if (it == object_.end()) return;
    const std::string path = join_key(section_, key);
    if (!parse(*it, path, field, constraint)) {
      throw ConfigError(fmt::format("{}: {} = {}: expected {}", source_of(path), path, shown_value(*it),
                                    expectation<T>(constraint)));
    }
  }

  void reject_unknown_keys() const {
    for (const auto& [key, value] : object_.items()) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        throw_unknown_key(source_of(join_key(section_, key)), section_, key, known_);
    }
  }

 private:
  std::string source_of(const std::string& path) const {
    auto it = doc_.origin.find(path);
    return it == doc_.origin.end() ? default_source_ : it->second;
  }

  template <class C>
  bool parse(const json& v, const std::string&, int64_t& out, const C& c) {
    // An unsigned JSON number past int64's range would wrap around to a negative one.
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) return false;
    out = v.get<int64_t>();
    return in_range(static_cast<double>(out), c);
  }
  template <class C>
  bool parse(const json& v, const std::string&, double& out, const C& c) {
    if (!v.is_number() || !std::isfinite(v.get<double>())) return false;
    out = v.get<double>();
    return in_range(out, c);
  }
  template <class C>
  bool parse(const json& v, const std::string&, bool& out, const C&) {
    if (!v.is_boolean()) return false;
    out = v.get<bool>();
    return true;
  }
  template <class C>
  bool parse(const json& v, const std::string& path, std::string& out, const C&) {
    if (v.is_string()) {
      out = v.get<std::string>();
      // A document built elsewhere (a checkpoint's saved config) has not been through the reader.
      if (const std::string why = string_problem(out); !why.empty())
        throw ConfigError(fmt::format("{}: {} = {}: {}", source_of(path), path, shown_value(v), why));
      return true;
    }
    // `--set run.name=2024` reads as a number; for a string key, take the text as typed.
    auto typed = doc_.override_text.find(path);
    if (typed == doc_.override_text.end() || v.is_object() || v.is_array()) return false;
    out = typed->second;
    return true;
  }
  template <class C>
  bool parse(const json& v, const std::string&, std::vector<double>& out, const C& c) {
    if (!v.is_array()) return false;
    std::vector<double> values;
    for (const auto& e : v) {
      if (!e.is_number() || !std::isfinite(e.get<double>()) || !in_range(e.get<double>(), c)) return false;
      values.push_back(e.get<double>());
    }
    out = std::move(values);
    return true;
  }
  template <class E, class C, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  bool parse(const json& v, const std::string&, E& out, const C&) {
    if (!v.is_string()) return false;
    for (const auto& [value, name] : EnumNames<E>::names) {
      if (v.get<std::string>() == name) {
        out = value;
        return true;
      }
    }
    return false;
  }

  const json& object_;
  std::string section_;
  const Document& doc_;
  const std::string& default_source_;
  std::vector<std::string> known_;
};

class SectionReader {
 public:
  SectionReader(const Document& doc, const std::string& default_source) : doc_(doc), default_source_(default_source) {}

  template <class S>
  void section(const char* name, S& target, const char* /*description*/) {
    known_.emplace_back(name);
    auto it = doc_.root.find(name);
    if (it == doc_.root.end()) return;
    if (!it->is_object()) {
      throw ConfigError(fmt::format("{}: {} = {}: expected an object of {} keys", source_of(name), name,
                                    shown_value(*it), name));
    }
    FieldReader reader(*it, name, doc_, default_source_);
    target.visit(reader);
    reader.reject_unknown_keys();
  }

  void reject_unknown_sections() const {
    for (const auto& [key, value] : doc_.root.items()) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        throw_unknown_key(source_of(key), "", key, known_);
    }
  }

 private:
  std::string source_of(const std::string& path) const {
    auto it = doc_.origin.find(path);
    return it == doc_.origin.end() ? default_source_ : it->second;
  }
  const Document& doc_;
  const std::string& default_source_;
  std::vector<std::string> known_;
};

struct JsonWriter {
  json out = json::object();
  json* current = nullptr;

  template <class S>
  void section(const char* name, S& s, const char* /*description*/) {
    out[name] = json::object();
    current = &out[name];
    s.visit(*this);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* /*description*/, const C& = {}) {
    (*current)[key] = value_to_json(field);
  }
};

/// Every section and key of a default config as ConfigKeys describes them.
struct KeyLister {
  ConfigKeys keys;

  template <class S>
  void section(const char* name, S& s, const char* description) {
    keys.sections.push_back({name, description});
    s.visit(*this);
  }
  template <class T, class C = NoLimit>
  void operator()(const char* key, T& field, const char* description, const C& constraint = {}) {
    KeyInfo info;
    info.name = keys.sections.back().name + "." + key;
    info.description = description;
    info.type = type_text<T>(constraint);
    info.default_value = value_to_json(field);
    if constexpr (std::is_enum_v<T>) {
      for (const auto& [value, spelled] : EnumNames<T>::names) info.choices.emplace_back(spelled);
    } else if constexpr (std::is_same_v<T, bool>) {
      info.choices = {"true", "false"};
    }
    info.schema = key_schema<T>(constraint);
    info.schema["default"] = info.default_value;
    info.schema["description"] = description;
    keys.keys.push_back(std::move(info));
  }
};

// ---- Checks across keys ------------------------------------------------------------------------

/// Throws config_error(loaded, key, message) unless `ok`.
void require(const LoadedConfig& loaded, bool ok, const std::string& key, const std::string& message) {
  if (!ok) throw config_error(loaded, key, message);
}

/// Whether every file or folder name in `path` is at most kMaxNameBytes long (the system refuses
/// longer ones with "File name too long").
bool names_fit(const std::string& path) {
  size_t name_start = 0;
  for (size_t at = 0; at <= path.size(); ++at) {
    if (at < path.size() && path[at] != '/') continue;
    if (at - name_start > kMaxNameBytes) return false;
    name_start = at + 1;
  }
  return true;
}

bool valid_device(const std::string& device) {
  if (device == "auto" || device == "cpu" || device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void validate(const LoadedConfig& loaded) {
  const RunConfig& c = loaded.config;

  require(loaded, !c.run.name.empty() && c.run.name.find('/') == std::string::npos && c.run.name != "." &&
                    c.run.name != "..",
                "run.name", "expected a folder name without '/'");
  require(loaded, c.run.name.size() <= kMaxNameBytes, "run.name",
          fmt::format("expected a folder name of at most {} bytes", kMaxNameBytes));
  for (const auto& [key, path] : {std::pair{"run.out_dir", &c.run.out_dir}, std::pair{"data.root", &c.data.root},
                                  std::pair{"model.init_from", &c.model.init_from},
                                  std::pair{"checkpoint.resume", &c.checkpoint.resume}})
    require(loaded, names_fit(*path), key,
            fmt::format("a file or folder name in this path is longer than {} bytes; use a shorter path", kMaxNameBytes));
  require(loaded, valid_device(c.run.device), "run.device", "expected auto, cpu, cuda or cuda:N");
  require(loaded, c.data.mean.size() == 3, "data.mean", "expected a list of 3 numbers (R, G, B)");
  require(loaded, c.data.std.size() == 3, "data.std", "expected a list of 3 numbers (R, G, B)");
  require(loaded, c.optim.betas.size() == 2, "optim.betas", "expected a list of 2 numbers (beta1, beta2)");
  require(loaded, !c.optim.nesterov || (c.optim.name == OptimizerKind::sgd && c.optim.momentum > 0), "optim.nesterov",
                "Nesterov momentum needs optim.name \"sgd\" and optim.momentum > 0");
  require(loaded, c.schedule.name != ScheduleKind::onecycle || c.schedule.warmup_epochs == 0, "schedule.warmup_epochs",
                "the onecycle schedule has its own warm-up (schedule.pct_start); set schedule.warmup_epochs to 0");
  require(loaded, c.schedule.warmup_epochs < static_cast<double>(c.run.epochs), "schedule.warmup_epochs",
                fmt::format("expected fewer epochs than run.epochs ({})", c.run.epochs));
  require(loaded, std::is_sorted(c.schedule.milestones.begin(), c.schedule.milestones.end()) &&
                    std::adjacent_find(c.schedule.milestones.begin(), c.schedule.milestones.end()) ==
                        c.schedule.milestones.end(),
                "schedule.milestones", "expected epochs in increasing order");
  require(loaded, c.schedule.name != ScheduleKind::multistep || !c.schedule.milestones.empty(), "schedule.milestones",
                "the multistep schedule needs at least one milestone epoch");
  require(loaded, !(c.precision.mode == PrecisionMode::tf32 && loaded.origin.count("precision.tf32") && !c.precision.tf32),
          "precision.tf32", "precision.mode \"tf32\" means TF32 on; use precision.mode \"fp32\" for IEEE float32");
  require(loaded, !(c.precision.deterministic && c.precision.cudnn_benchmark), "precision.cudnn_benchmark",
          "cuDNN autotuning picks algorithms by timing, which is not deterministic; turn off one of "
          "precision.cudnn_benchmark and precision.deterministic");
  require(loaded, c.data.progressive_start_size == 0 || c.data.progressive_start_size >= kMinProgressiveSize,
          "data.progressive_start_size",
          fmt::format("expected 0 (off) or a side of at least {} pixels", kMinProgressiveSize));
  require(loaded, c.data.progressive_start_size == 0 || c.data.progressive_epochs >= 1,
          "data.progressive_epochs",
          "progressive resizing needs its number of epochs: 1 or more");
  require(loaded, c.data.progressive_start_size == 0 || c.data.progressive_epochs < c.run.epochs,
          "data.progressive_epochs",
          fmt::format("expected fewer than run.epochs ({}): at least the last epoch trains at the full side",
                      c.run.epochs));
  require(loaded, c.data.cifar100_labels == Cifar100Labels::fine || c.data.source == DataSource::cifar100,
          "data.cifar100_labels",
          fmt::format("coarse labels are CIFAR-100's and data.source is {}; set data.source to cifar100 or remove "
                      "data.cifar100_labels",
                      to_string(c.data.source)));
}

// ---- Settings whose defaults follow data.source --------------------------------------------------

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

LoadedConfig resolve(Document doc, const std::vector<std::string>& overrides, const std::string& default_source) {
  for (const auto& spec : overrides) apply_override(doc, spec);
  LoadedConfig loaded;
  SectionReader reader(doc, default_source);
  loaded.config.visit_sections(reader);
  reader.reject_unknown_sections();
  loaded.origin = std::move(doc.origin);
  loaded.source = default_source;
  loaded.files = std::move(doc.files);
  follow_data_source(loaded, doc.root);
  validate(loaded);
  return loaded;
}

}  // namespace

LoadedConfig load_file(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  Document doc;
  std::vector<fs::path> chain;
  load_file_into(doc, path, chain);
  return resolve(std::move(doc), overrides, path.string());
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
  return resolve(std::move(doc), overrides, source);
}

std::string read_config_text(const std::filesystem::path& path, const std::string& hint) {
  const files::TextRead read = files::read_regular_file(path, kMaxConfigFileBytes);
  if (!read.problem.empty()) throw ConfigError(fmt::format("{}: {}; {}", path.string(), read.problem, hint));
  return read.text;
}

nlohmann::json parse_json(const std::string& text, const std::string& source) {
  return parse_or_throw<json>(text, source);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& source) {
  return parse_or_throw<nlohmann::ordered_json>(text, source);
}

std::string shown(const std::string& text) {
  std::string out;
  size_t characters = 0;
  for (size_t at = 0; at < text.size(); ++characters) {
    if (characters == kMaxShownChars) return out + "...";
    const size_t length = utf8_sequence_length(text, at);
    const auto lead = static_cast<unsigned char>(text[at]);
    if (length == 0 || lead < 0x20 || lead == 0x7F) {
      out += fmt::format("\\x{:02X}", lead);
      at += 1;
    } else {
      out.append(text, at, length);
      at += length;
    }
  }
  return out;
}

ConfigError config_error(const LoadedConfig& loaded, const std::string& key, const std::string& message) {
  auto it = loaded.origin.find(key);
  const std::string& source = it == loaded.origin.end() ? loaded.source : it->second;
  const auto dot = key.find('.');
  const json value = to_json(loaded.config)[key.substr(0, dot)][key.substr(dot + 1)];
  return ConfigError(fmt::format("{}: {} = {}: {}", source, key, shown_value(value), message));
}

nlohmann::json data_summary(const DataSection& data) {
  json summary{{"source", to_string(data.source)}, {"classes", data.classes()}};
  if (data.source == DataSource::cifar100) summary["cifar100_labels"] = to_string(data.cifar100_labels);
  return summary;
}

nlohmann::json to_json(const RunConfig& config) {
  JsonWriter writer;
  RunConfig copy = config;  // visit() hands out mutable references; the writer only reads them
  copy.visit_sections(writer);
  return writer.out;
}

std::vector<std::string> changed_settings(const nlohmann::json& before, const nlohmann::json& after) {
  static const json defaults = to_json(RunConfig{});
  std::vector<std::string> changes;
  for (const auto& [section, keys] : after.items()) {
    for (const auto& [key, value] : keys.items()) {
      const bool known = before.contains(section) && before[section].contains(key);
      const json fallback = defaults.contains(section) ? defaults[section].value(key, json()) : json();
      const json& old = known ? before[section][key] : fallback;
      if (old != value) changes.push_back(fmt::format("{}.{} ({} -> {})", section, key, old.dump(), value.dump()));
    }
  }
  return changes;
}

std::string format_table(const LoadedConfig& loaded) {
  const json resolved = to_json(loaded.config);
  std::vector<std::array<std::string, 3>> rows{{"key", "value", "from"}};
  for (const KeyInfo& key : config_keys().keys) {
    const auto dot = key.name.find('.');
    const json& value = resolved[key.name.substr(0, dot)][key.name.substr(dot + 1)];
    if (value == key.default_value) continue;
    // A document loaded whole (a checkpoint's config) records no origin per key.
    auto from = loaded.origin.find(key.name);
    rows.push_back({key.name, value.is_string() ? value.get<std::string>() : value.dump(),
                    from == loaded.origin.end() ? loaded.source : from->second});
  }
  const size_t changed = rows.size() - 1;
  if (changed == 0) return "every setting is at its default\n";
  size_t key_width = 0, value_width = 0;
  for (const auto& row : rows) {
    key_width = std::max(key_width, row[0].size());
    value_width = std::max(value_width, row[1].size());
  }
  std::string out = fmt::format("{} setting{} from the defaults:\n", changed, changed == 1 ? " differs" : "s differ");
  for (const auto& row : rows)
    out += fmt::format("  {:<{}}  {:<{}}  {}\n", row[0], key_width, row[1], value_width, row[2]);
  return out;
}

const ConfigKeys& config_keys() {
  static const ConfigKeys keys = [] {
    KeyLister lister;
    RunConfig defaults;
    defaults.visit_sections(lister);
    return lister.keys;
  }();
  return keys;
}

bool is_key_or_section(const std::string& name) {
  const ConfigKeys& all = config_keys();
  return std::any_of(all.keys.begin(), all.keys.end(), [&](const KeyInfo& key) { return key.name == name; }) ||
         std::any_of(all.sections.begin(), all.sections.end(),
                     [&](const SectionInfo& section) { return section.name == name; });
}

std::string describe_keys() {
  // argparse's layout, which Lightning's and jsonargparse's help share: the key, then its
  // description and (type, default), wrapped under the description; a key longer than its column
  // has the description on the next line.
  constexpr size_t kLineWidth = 110;
  constexpr size_t kKeyWidth = 28;
  const std::string indent(2 + kKeyWidth + 2, ' ');
  std::string out;
  for (const KeyInfo& key : config_keys().keys) {
    std::string text = "  " + key.name;
    text += text.size() + 2 > indent.size() ? "\n" + indent : std::string(indent.size() - text.size(), ' ');
    size_t column = indent.size();
    bool line_start = true;
    // Spaces around an enum's "|", so that a long list of choices wraps like words.
    std::string type = key.type;
    for (size_t at = type.find('|'); at != std::string::npos; at = type.find('|', at + 3)) type.replace(at, 1, " | ");
    std::istringstream words(fmt::format("{} ({}, default {})", key.description, type, key.default_value.dump()));
    for (std::string word; words >> word; line_start = false) {
      if (!line_start && column + 1 + word.size() > kLineWidth) {
        text += "\n" + indent;
        column = indent.size();
        line_start = true;
      }
      if (!line_start) {
        text += ' ';
        ++column;
      }
      text += word;
      column += word.size();
    }
    out += text + "\n";
  }
  return out;
}

nlohmann::ordered_json json_schema() {
  using ordered = nlohmann::ordered_json;
  const ConfigKeys& all = config_keys();
  ordered properties = ordered::object();
  properties[kExtendsKey] = {
      {"description", "the config file (or files, in order) this one builds on, relative to this file"},
      {"anyOf", ordered::array({{{"type", "string"}}, {{"type", "array"}, {"items", {{"type", "string"}}}}})}};
  for (const SectionInfo& section : all.sections)
    properties[section.name] = {{"description", section.description},
                                {"type", "object"},
                                {"properties", ordered::object()},
                                {"additionalProperties", false}};
  for (const KeyInfo& key : all.keys) {
    const auto dot = key.name.find('.');
    properties[key.name.substr(0, dot)]["properties"][key.name.substr(dot + 1)] = key.schema;
  }
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"title", "ltrain run config"},
          {"description", "A run config of ltrain (ltrain train --config FILE); every key is optional and has a "
                          "default."},
          {"type", "object"},
          {"properties", properties},
          {"additionalProperties", false}};
}

}  // namespace ltrain::config
