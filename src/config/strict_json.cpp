// Strict JSON reading (strict_json.h): the SAX builder that enforces the reader's limits as it
// parses, UTF-8 checks, and the quoting of values in messages.
#include "strict_json.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"

namespace ltrain::config {
namespace {

using json = nlohmann::json;

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

/// Whether `c` is a control character (U+0000 to U+001F, or DEL).
bool is_control(char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }

/// The offset of the quote that closes the JSON string which holds offset `inside`; the end of
/// that line when the string is not closed on it.
size_t closing_quote(const std::string& text, size_t inside) {
  for (size_t at = inside; at < text.size(); ++at) {
    if (text[at] == '\\') ++at;
    else if (text[at] == '"' || text[at] == '\n') return at;
  }
  return text.size();
}

/// The contents of a JSON string as written between its quotes, its escapes decoded, where raw
/// control characters stand for themselves; as written when it does not decode.
nlohmann::json decoded_string(const std::string& written) {
  std::string escaped;
  for (char c : written)
    escaped += is_control(c) ? fmt::format("\\u{:04x}", static_cast<unsigned char>(c)) : std::string(1, c);
  try {
    return nlohmann::json::parse("\"" + escaped + "\"");
  } catch (const nlohmann::json::exception&) {
    return written;
  }
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

  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::json::exception& error) {
    // Number overflow (406) is the parser's only out_of_range error; the rest are syntax errors.
    if (dynamic_cast<const nlohmann::json::out_of_range*>(&error) != nullptr)
      throw ConfigError(fmt::format("{}: {} = {}: the number is out of range (a double holds about +-1.8e308); use a "
                                    "smaller one",
                                    source_, shown(value_path()), shown(last_token)));
    // The lexer stops at a control character inside a string (the token so far starts with its
    // quote). A line break there is most likely a missing closing quote: nlohmann's syntax error
    // says so. Any other is refused as the same character escaped would be.
    const size_t stop = position - 1;
    if (!last_token.empty() && last_token.front() == '"' && position > 0 && is_control(text_[stop]) &&
        text_[stop] != '\n' && text_[stop] != '\r')
      refuse_string_around(stop);
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

  /// Throws the error string() or key() would for the JSON string around offset `at` of the text,
  /// which holds a raw control character there.
  [[noreturn]] void refuse_string_around(size_t at) const {
    const size_t start = opening_quote(text_, at);
    const size_t end = closing_quote(text_, at);
    const nlohmann::json text = decoded_string(text_.substr(start + 1, end - start - 1));
    const std::string why = string_problem(text.get<std::string>());
    const size_t next = text_.find_first_not_of(" \t\r\n", end + 1);
    if (next != std::string::npos && text_[next] == ':')
      throw ConfigError(fmt::format("{}: key {} at {}: {}", source_, shown_value(text), line_and_column(text_, start), why));
    throw ConfigError(fmt::format("{}: {} = {}: {}", source_, shown(value_path()), shown_value(text), why));
  }

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

}  // namespace

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

bool is_utf8(const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = utf8_sequence_length(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

std::string string_problem(const std::string& text) {
  if (text.size() > kMaxStringBytes) return fmt::format("longer than {} bytes; use a shorter one", kMaxStringBytes);
  if (text.find('\0') != std::string::npos) return "a NUL character (\\u0000) cannot be part of a setting; remove it";
  if (const auto control = std::find_if(text.begin(), text.end(), is_control); control != text.end())
    return fmt::format("a control character (\\u{:04x}) cannot be part of a setting; remove it",
                       static_cast<unsigned char>(*control));
  if (!is_utf8(text)) return "not valid UTF-8; write it in UTF-8";
  return "";
}

template <class Json>
std::optional<Json> parse_strictly(const std::string& text, const std::string& source, const std::string& prefix,
                                   std::string& syntax_error) {
  // nlohmann's lexer takes a NUL byte for the end of its input: what follows one would go unread.
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    const auto before = text.begin() + static_cast<std::ptrdiff_t>(nul);
    const size_t line_start = text.rfind('\n', nul);
    const size_t line = 1 + static_cast<size_t>(std::count(text.begin(), before, '\n'));
    const size_t column = line_start == std::string::npos ? nul + 1 : nul - line_start;
    syntax_error = fmt::format("a NUL byte at line {}, column {}: JSON is text; remove it", line, column);
    return std::nullopt;
  }
  std::istringstream stream(text);
  StrictBuilder<Json> builder(text, *stream.rdbuf(), source, prefix);
  if (!Json::sax_parse(stream, &builder)) {
    syntax_error = builder.syntax_error();
    return std::nullopt;
  }
  return builder.take();
}

namespace {

/// Whether a text that is no JSON is YAML (a Hydra config): `source` ends in .yaml or .yml, or the
/// first line that is neither blank nor a comment reads "key:" or "key: value".
bool looks_like_yaml(const std::string& text, const std::string& source) {
  const std::string extension = std::filesystem::path(source).extension().string();
  if (extension == ".yaml" || extension == ".yml") return true;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    if (line.compare(start, 3, "---") == 0) return true;  // a YAML document's start
    if (line[start] == '{' || line[start] == '[') return false;
    size_t end = start;
    while (end < line.size() && (std::isalnum(static_cast<unsigned char>(line[end])) || line[end] == '_' ||
                                 line[end] == '.' || line[end] == '-'))
      ++end;
    return end > start && end < line.size() && line[end] == ':' &&
           (end + 1 == line.size() || line[end + 1] == ' ' || line[end + 1] == '\r');
  }
  return false;
}

}  // namespace

template <class Json>
Json parse_or_throw(const std::string& text, const std::string& source) {
  std::string syntax_error;
  std::optional<Json> document = parse_strictly<Json>(text, source, "", syntax_error);
  if (document) return std::move(*document);
  if (looks_like_yaml(text, source))
    throw ConfigError(fmt::format("{}: this is YAML (Hydra's format, say), and ltrain reads JSON configs: write it "
                                  "as JSON, e.g. python3 -c 'import json, sys, yaml; json.dump(yaml.safe_load(open("
                                  "sys.argv[1])), sys.stdout, indent=2)' {} > {}.json",
                                  source, source, std::filesystem::path(source).stem().string()));
  throw ConfigError(fmt::format("{}: not valid JSON: {}", source, syntax_error));
}

bool nested_deeper_than(const json& value, int levels) {
  if (!value.is_structured()) return false;
  if (levels == 0) return true;
  return std::any_of(value.begin(), value.end(), [levels](const json& child) { return nested_deeper_than(child, levels - 1); });
}

template std::optional<nlohmann::json> parse_strictly(const std::string&, const std::string&, const std::string&,
                                                      std::string&);
template std::optional<nlohmann::ordered_json> parse_strictly(const std::string&, const std::string&,
                                                              const std::string&, std::string&);
template nlohmann::json parse_or_throw(const std::string&, const std::string&);
template nlohmann::ordered_json parse_or_throw(const std::string&, const std::string&);

std::string shown_path(const std::filesystem::path& path) {
  std::error_code no_working_folder;
  const std::filesystem::path absolute = std::filesystem::absolute(path, no_working_folder).lexically_normal();
  if (path.is_absolute() || no_working_folder) return shown(path.string());
  return fmt::format("{} ({})", shown(path.string()), shown(absolute.string()));
}

std::string read_config_text(const std::filesystem::path& path, const std::string& hint) {
  const files::TextRead read = files::read_regular_file(path, kMaxConfigFileBytes);
  if (!read.problem.empty()) throw ConfigError(fmt::format("{}: {}; {}", shown_path(path), read.problem, hint));
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

}  // namespace ltrain::config
