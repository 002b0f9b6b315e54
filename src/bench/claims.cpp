#include "ltrain/bench/claims.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"

namespace ltrain::bench {

// configs/claims/guides.json's bytes, written into the build by CMakeLists.txt.
extern const unsigned char kShippedClaimsBytes[];
extern const std::size_t kShippedClaimsSize;

namespace {

using nlohmann::json;

/// A kind of claim: its name in the file and the keys it has besides guide, claim, quote and kind.
struct KindKeys {
  ClaimKind kind;
  const char* name;
  std::vector<std::string> keys;
};
const std::vector<KindKeys>& kinds() {
  static const std::vector<KindKeys> all{{ClaimKind::speed, "speed", {"a", "b", "at_least"}},
                                         {ClaimKind::memory, "memory", {"a", "b", "saves"}},
                                         {ClaimKind::matmul, "matmul", {"precisions"}},
                                         {ClaimKind::batch_search, "batch_search", {"start", "memory_fraction"}},
                                         {ClaimKind::card, "card", {"card", "wrong"}},
                                         {ClaimKind::unmeasurable, "unmeasurable", {"why"}}};
  return all;
}

/// The placeholders each kind's claim text may hold.
std::vector<std::string> step_placeholder_names();
std::vector<std::string> text_placeholders(ClaimKind kind) {
  if (kind == ClaimKind::speed || kind == ClaimKind::memory) return step_placeholder_names();
  if (kind == ClaimKind::matmul) return {"n", "products", "precision"};
  return {};
}

/// An object of the claims file, read key by key: every error names the file and the key's path
/// ("claims[3].at_least") in one line.
class Entry {
 public:
  Entry(const std::string& source, const json& value, std::string path, const std::vector<std::string>& keys)
      : source_(source), value_(value), path_(std::move(path)) {
    if (!value_.is_object()) fail(path_.empty() ? "the document" : path_, value_, "expected an object");
    for (const auto& [key, unused] : value_.items()) {
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      // Longer keys first: of keys equally close, "at_least" is meant rather than "a", which
      // every key beginning with an "a" starts with.
      std::vector<std::string> longest_first = keys;
      std::stable_sort(longest_first.begin(), longest_first.end(),
                       [](const std::string& x, const std::string& y) { return x.size() > y.size(); });
      const std::string best = config::closest_key(key, longest_first);
      if (!best.empty())
        throw ConfigError(fmt::format("{}: unknown key \"{}\": did you mean \"{}\"?", source_, config::shown(at(key)),
                                      at(best)));
      throw ConfigError(fmt::format("{}: unknown key \"{}\"; the keys of {} are: {}", source_, config::shown(at(key)),
                                    path_.empty() ? "the top level" : path_, fmt::join(keys, ", ")));
    }
  }

  std::string at(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& required(const std::string& key, const std::string& expected) const {
    if (!value_.contains(key))
      throw ConfigError(fmt::format("{}: {}: missing; expected {}", source_, at(key), expected));
    return value_.at(key);
  }

  std::string string(const std::string& key, const std::string& expected) const {
    const json& value = required(key, expected);
    if (!value.is_string()) fail(at(key), value, "expected " + expected);
    return value.get<std::string>();
  }

  /// A number within (lo, hi] (or [lo, hi] when `lo_included`).
  double number(const std::string& key, double lo, double hi, bool lo_included, const std::string& expected) const {
    const json& value = required(key, expected);
    if (!value.is_number()) fail(at(key), value, "expected " + expected);
    const double number = value.get<double>();
    if (!(lo_included ? number >= lo : number > lo) || !(number <= hi)) fail(at(key), value, "expected " + expected);
    return number;
  }

  /// A list of strings, at least one.
  std::vector<std::string> strings(const std::string& key, const std::string& expected) const {
    const json& value = required(key, expected);
    if (!value.is_array() || value.empty()) fail(at(key), value, "expected " + expected);
    std::vector<std::string> out;
    for (size_t i = 0; i < value.size(); ++i) {
      if (!value[i].is_string()) fail(fmt::format("{}[{}]", at(key), i), value[i], "expected " + expected);
      out.push_back(value[i].get<std::string>());
    }
    return out;
  }

  bool has(const std::string& key) const { return value_.contains(key); }
  const json& value() const { return value_; }

  /// ConfigError "<source>: <path> = <value>: <message>".
  [[noreturn]] void fail(const std::string& path, const json& value, const std::string& message) const {
    throw ConfigError(fmt::format("{}: {} = {}: {}", source_, path, config::shown(value.dump()), message));
  }

 private:
  const std::string& source_;
  const json& value_;
  std::string path_;
};

/// "{mode}, {batch}": the placeholders `names` as a text holds them.
std::string braced(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) out.push_back("{" + name + "}");
  return fmt::format("{}", fmt::join(out, ", "));
}

/// The placeholders of the A/B claims' texts and variants.
std::vector<std::string> step_placeholder_names() {
  std::vector<std::string> names;
  for (const auto& [name, unused] : step_placeholders({})) names.push_back(name);
  return names;
}

/// `text`, the value of `key`, filled with sample values of `names`: a ConfigError names the key
/// where it holds another placeholder.
void check_placeholders(const Entry& entry, const std::string& key, const std::string& text,
                        const std::vector<std::string>& names) {
  std::map<std::string, std::string> values;
  for (const std::string& name : names) values[name] = "1";
  try {
    fill_placeholders(text, values);
  } catch (const std::invalid_argument& error) {
    entry.fail(entry.at(key), entry.value().at(key),
               fmt::format("{}; {}", error.what(),
                           names.empty() ? "this text takes no placeholders" : "this text takes " + braced(names)));
  }
}

std::vector<Guide> read_guides(const std::string& source, const Entry& top) {
  const json& list = top.required("guides", "a list of the guides, each {\"name\", \"title\", \"about\"}");
  if (!list.is_array() || list.empty()) top.fail("guides", list, "expected a list of the guides, at least one");
  std::vector<Guide> guides;
  for (size_t i = 0; i < list.size(); ++i) {
    const Entry entry(source, list[i], fmt::format("guides[{}]", i), {"name", "title", "about"});
    Guide guide{entry.string("name", "the guide's name in the report, a string"),
                entry.string("title", "the article's own title, a string"),
                entry.string("about", "its title in English, a string")};
    const bool taken = guide.name == kNoGuide || std::any_of(guides.begin(), guides.end(), [&](const Guide& g) {
                         return g.name == guide.name;
                       });
    if (guide.name.empty() || taken)
      entry.fail(entry.at("name"), list[i].at("name"),
                 fmt::format("expected a name of its own (not \"{}\", nor another guide's)", kNoGuide));
    guides.push_back(guide);
  }
  return guides;
}

/// Each variant's settings, checked on the default run config with its placeholders filled with
/// sample values: a setting must name a run config key and give it a value of its type and limits.
std::map<std::string, Variant> read_variants(const std::string& source, const Entry& top) {
  const std::string expected = "an object of variants, each a name and the list of settings (KEY=VALUE) it sets";
  const json& object = top.required("variants", expected);
  if (!object.is_object()) top.fail("variants", object, "expected " + expected);
  const std::map<std::string, std::string> samples = step_placeholders({"fp32", 256});
  const std::string takes = braced(step_placeholder_names());
  std::map<std::string, Variant> variants;
  for (const auto& [name, value] : object.items()) {
    const std::string path = fmt::format("variants.\"{}\"", config::shown(name));
    try {
      fill_placeholders(name, samples);
    } catch (const std::invalid_argument& error) {
      throw ConfigError(fmt::format("{}: {}: {}; a variant's name takes {}", source, path, error.what(), takes));
    }
    if (!value.is_array() || value.empty()) top.fail(path, value, "expected a list of settings (KEY=VALUE), at least one");
    Variant variant{name, {}};
    std::map<std::string, size_t> set_keys;  // key -> the first setting that sets it
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string setting_path = fmt::format("{}[{}]", path, i);
      if (!value[i].is_string()) top.fail(setting_path, value[i], "expected a setting KEY=VALUE, a string");
      const std::string setting = value[i].get<std::string>();
      std::string filled;
      try {
        filled = fill_placeholders(setting, samples);
        config::load_json(json::object(), source, {filled});
      } catch (const std::invalid_argument& error) {
        top.fail(setting_path, value[i], fmt::format("{}; a setting takes {}", error.what(), takes));
      } catch (const ConfigError& error) {
        // The config's line names the override first ("--set KEY=VALUE: ..."): the rest says what is wrong.
        std::string why = compat::first_line(error.what());
        const std::string prefix = "--set " + filled + ": ";
        if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
        top.fail(setting_path, value[i], why);
      }
      // The last of two settings of one key would win without a word: a variant says each once.
      const std::string key = setting.substr(0, setting.find('='));
      const auto [first, is_new] = set_keys.emplace(key, i);
      if (!is_new)
        top.fail(setting_path, value[i], fmt::format("sets {} again ({}[{}] sets it); a variant sets each key once",
                                                     key, path, first->second));
      variant.settings.push_back(setting);
    }
    variants.emplace(name, variant);
  }
  return variants;
}

Claim read_claim(const std::string& source, const json& value, size_t index, const std::vector<Guide>& guides,
                 const std::map<std::string, Variant>& variants) {
  const std::string path = fmt::format("claims[{}]", index);
  std::vector<std::string> kind_names;
  for (const KindKeys& kind : kinds()) kind_names.push_back(kind.name);
  const std::string kind_expected = fmt::format("one of {}", fmt::join(kind_names, ", "));
  // The kind first: it says which other keys the claim has.
  if (!value.is_object())
    throw ConfigError(fmt::format("{}: {} = {}: expected an object", source, path, config::shown(value.dump())));
  if (!value.contains("kind"))
    throw ConfigError(fmt::format("{}: {}.kind: missing; expected {}", source, path, kind_expected));
  const json& kind_value = value.at("kind");
  const auto kind = std::find_if(kinds().begin(), kinds().end(), [&](const KindKeys& k) {
    return kind_value.is_string() && kind_value.get<std::string>() == k.name;
  });
  if (kind == kinds().end())
    throw ConfigError(fmt::format("{}: {}.kind = {}: expected {}", source, path, config::shown(kind_value.dump()),
                                  kind_expected));
  std::vector<std::string> keys{"guide", "claim", "quote", "kind"};
  keys.insert(keys.end(), kind->keys.begin(), kind->keys.end());
  const Entry entry(source, value, path, keys);

  Claim claim;
  claim.kind = kind->kind;
  std::vector<std::string> guide_names;
  for (const Guide& guide : guides) guide_names.push_back(guide.name);
  guide_names.push_back(kNoGuide);
  const std::string guide_expected = fmt::format("one of the guides' names ({})", fmt::join(guide_names, ", "));
  claim.guide = entry.string("guide", guide_expected);
  if (std::find(guide_names.begin(), guide_names.end(), claim.guide) == guide_names.end())
    entry.fail(entry.at("guide"), value.at("guide"), "expected " + guide_expected);
  claim.text = entry.string("claim", "what the guide says, in English, a string");
  if (claim.text.empty()) entry.fail(entry.at("claim"), value.at("claim"), "expected what the guide says, in English");
  check_placeholders(entry, "claim", claim.text, text_placeholders(claim.kind));
  claim.quote = entry.string("quote", "the guide's line that says it, a string (\"\" for a row of ltrain's own)");
  if (claim.quote.empty() && claim.guide != kNoGuide)
    entry.fail(entry.at("quote"), value.at("quote"), "expected the guide's line that says it");

  const auto variant = [&](const std::string& key) {
    const std::string name = entry.string(key, "the name of a variant of \"variants\"");
    if (!variants.count(name)) {
      std::vector<std::string> known;
      for (const auto& [known_name, unused] : variants) known.push_back(known_name);
      const std::string best = config::closest_key(name, known);
      entry.fail(entry.at(key), value.at(key),
                 best.empty() ? "expected the name of a variant of \"variants\""
                              : fmt::format("no such variant; did you mean \"{}\"?", best));
    }
    return name;
  };
  switch (claim.kind) {
    case ClaimKind::speed:
      claim.a = variant("a");
      claim.b = variant("b");
      if (entry.has("at_least"))
        claim.threshold = entry.number("at_least", 0.0, std::numeric_limits<double>::max(), false,
                                       "the ratio B / A of images/s the claim needs, a number > 0 (none: measured only)");
      break;
    case ClaimKind::memory:
      claim.a = variant("a");
      claim.b = variant("b");
      claim.threshold =
          entry.number("saves", 0.0, 1.0, false, "the fraction of A's peak memory that B saves at least, in (0, 1]");
      break;
    case ClaimKind::matmul:
    {
      std::vector<std::string> modes;
      for (const auto& [mode, name] : config::EnumNames<config::PrecisionMode>::names) modes.push_back(name);
      const std::string expected = fmt::format("one of {}", fmt::join(modes, ", "));
      const std::vector<std::string> precisions = entry.strings("precisions", "a list of precisions, each " + expected);
      for (size_t i = 0; i < precisions.size(); ++i) {
        const auto& names = config::EnumNames<config::PrecisionMode>::names;
        const auto found = std::find_if(names.begin(), names.end(), [&](const auto& pair) { return precisions[i] == pair.second; });
        if (found == names.end())
          entry.fail(fmt::format("{}[{}]", entry.at("precisions"), i), value.at("precisions")[i], "expected " + expected);
        claim.precisions.push_back(found->first);
      }
      break;
    }
    case ClaimKind::batch_search: {
      const double start = entry.number("start", 1.0, 1 << 20, true, "the first batch, an integer from 1 to 1048576");
      if (start != std::floor(start))
        entry.fail(entry.at("start"), value.at("start"), "expected the first batch, an integer from 1 to 1048576");
      claim.start_batch = static_cast<int64_t>(start);
      claim.memory_fraction = entry.number("memory_fraction", 0.0, 1.0, false,
                                           "the fraction of the GPU's memory the search reaches, in (0, 1]");
      break;
    }
    case ClaimKind::card: {
      claim.card = entry.string("card", "a card's name as the driver gives it, e.g. \"NVIDIA GeForce RTX 4090 D\"");
      if (!published_card(claim.card)) {
        std::vector<std::string> known;
        for (const PublishedCard& card : published_cards()) known.push_back(card.name);
        entry.fail(entry.at("card"), value.at("card"),
                   fmt::format("expected a card whose published figures ltrain knows: {}", fmt::join(known, ", ")));
      }
      claim.wrong = entry.string("wrong", "what is wrong with the statement, a string");
      check_placeholders(entry, "wrong", claim.wrong, {"published"});
      break;
    }
    case ClaimKind::unmeasurable:
      claim.why = entry.string("why", "why no machine here can measure it, a string");
      break;
  }
  return claim;
}

}  // namespace

ClaimCatalogue parse_claims(const std::string& text, const std::string& source) {
  const json document = config::parse_json(text, source);
  const Entry top(source, document, "", {"about", "guides", "variants", "claims"});
  ClaimCatalogue catalogue;
  catalogue.source = source;
  catalogue.guides = read_guides(source, top);
  catalogue.variants = read_variants(source, top);
  const json& claims = top.required("claims", "the list of claims, in the report's order");
  if (!claims.is_array() || claims.empty()) top.fail("claims", claims, "expected the list of claims, at least one");
  for (size_t i = 0; i < claims.size(); ++i)
    catalogue.claims.push_back(read_claim(source, claims[i], i, catalogue.guides, catalogue.variants));
  return catalogue;
}

ClaimCatalogue load_claims(const std::filesystem::path& path) {
  return parse_claims(config::read_config_text(path, "--claims names a JSON file of claims as " +
                                                         std::string(kShippedClaimsFile)),
                      path.string());
}

const ClaimCatalogue& shipped_claims() {
  static const ClaimCatalogue catalogue = parse_claims(
      std::string(reinterpret_cast<const char*>(kShippedClaimsBytes), kShippedClaimsSize), kShippedClaimsFile);
  return catalogue;
}

int64_t StepValues::micro_batch() const { return std::max<int64_t>(1, batch / 4); }
int64_t StepValues::micro_batches() const { return batch / micro_batch(); }

std::string fill_placeholders(const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const size_t open = text.find_first_of("{}", at);
    if (open == std::string::npos) {
      out.append(text, at, std::string::npos);
      break;
    }
    out.append(text, at, open - at);
    const size_t close = text[open] == '{' ? text.find('}', open) : std::string::npos;
    if (close == std::string::npos) throw std::invalid_argument(fmt::format("a lone \"{}\"", text[open]));
    const std::string name = text.substr(open + 1, close - open - 1);
    const auto value = values.find(name);
    if (value == values.end())
      throw std::invalid_argument(fmt::format("unknown placeholder \"{{{}}}\"", config::shown(name)));
    out += value->second;
    at = close + 1;
  }
  return out;
}

std::map<std::string, std::string> step_placeholders(const StepValues& values) {
  return {{"mode", values.mode},
          {"batch", std::to_string(values.batch)},
          {"micro_batch", std::to_string(values.micro_batch())},
          {"micro_batches", std::to_string(values.micro_batches())}};
}

Variant fill_variant(const Variant& variant, const StepValues& values) {
  const std::map<std::string, std::string> placeholders = step_placeholders(values);
  Variant filled{fill_placeholders(variant.name, placeholders), {}};
  for (const std::string& setting : variant.settings) filled.settings.push_back(fill_placeholders(setting, placeholders));
  return filled;
}

const std::vector<PublishedCard>& published_cards() {
  // NVIDIA's published figures. "RTX 4090 D" before "RTX 4090": the driver's names share the prefix.
  static const std::vector<PublishedCard> cards{
      {"NVIDIA GeForce RTX 5090", "Blackwell", 12, 0, 170, 21760, "32 GB GDDR7", "1,792 GB/s"},
      {"NVIDIA GeForce RTX 4090 D", "Ada Lovelace", 8, 9, 114, 14592, "24 GB GDDR6X", "1,008 GB/s"},
      {"NVIDIA GeForce RTX 4090", "Ada Lovelace", 8, 9, 128, 16384, "24 GB GDDR6X", "1,008 GB/s"},
      {"NVIDIA GeForce RTX 3090", "Ampere", 8, 6, 82, 10496, "24 GB GDDR6X", "936 GB/s"},
      {"NVIDIA H200", "Hopper", 9, 0, 132, 16896, "141 GB HBM3e", "4.8 TB/s"}};
  return cards;
}

const PublishedCard* published_card(const std::string& gpu_name) {
  for (const PublishedCard& card : published_cards())
    if (gpu_name.rfind(card.name, 0) == 0) return &card;
  return nullptr;
}

namespace {
/// 21760 -> "21,760".
std::string thousands(int64_t value) {
  std::string digits = std::to_string(value);
  for (auto at = static_cast<int64_t>(digits.size()) - 3; at > 0; at -= 3) digits.insert(static_cast<size_t>(at), ",");
  return digits;
}
}  // namespace

std::string describe(const PublishedCard& card) {
  return fmt::format("{} ({}, compute capability {}.{}, {} SMs, {} CUDA cores, {} at {})", card.name, card.architecture,
                     card.major, card.minor, card.multiprocessors, thousands(card.cuda_cores), card.memory,
                     card.bandwidth);
}

}  // namespace ltrain::bench
