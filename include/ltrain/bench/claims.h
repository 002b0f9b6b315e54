#pragma once
// The guides' claims that `ltrain reproduce` measures, as data: the guides, the settings each
// A/B claim compares, and the claims with their guide, quote and threshold, read from a JSON file
// (configs/claims/guides.json, carried in the binary; configs/claims/README.md describes its keys).
// The NVIDIA figures the claims about cards are set against live here too.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "ltrain/config/config.h"

namespace ltrain::bench {

/// A guide, as REPORT.md names it.
struct Guide {
  std::string name;   ///< "RTX 5090 guide"
  std::string title;  ///< the article's own title
  std::string about;  ///< its title in English
};

/// The guide of a row of ltrain's own, beside the guides' claims.
inline const char* const kNoGuide = "none";

/// How a claim is measured.
enum class ClaimKind {
  speed,         ///< B's images/s over A's, at least `at_least` (no threshold: measured only)
  memory,        ///< B's peak memory at least `saves` (a fraction) below A's; the time paid reported
  matmul,        ///< the matmul TFLOPS test, a row per precision, measured only
  batch_search,  ///< the batch-size search up to a fraction of the GPU's memory
  card,          ///< a statement about a card, set against NVIDIA's published figures: wrong
  unmeasurable,  ///< a claim no single machine can measure; `why` says so
};

/// One side of an A/B step measurement: its name in the report and the keys it sets on the base
/// config, in order. Both may hold the placeholders {mode}, {batch}, {micro_batch} and
/// {micro_batches} (StepValues).
struct Variant {
  std::string name;
  std::vector<std::string> settings;
};

struct Claim {
  ClaimKind kind = ClaimKind::speed;
  std::string guide;  ///< a Guide's name, or kNoGuide
  std::string text;   ///< what the guide says, in English (placeholders as the kind allows)
  std::string quote;  ///< the guide's line that says it ("" for a row of ltrain's own)
  /// speed, memory: the variants compared (Variant names), B against A.
  std::string a;
  std::string b;
  /// speed: the ratio B / A of images/s the claim needs (NaN: measured only);
  /// memory: the fraction of A's peak memory B saves at least.
  double threshold = std::numeric_limits<double>::quiet_NaN();
  std::vector<config::PrecisionMode> precisions;  ///< matmul: a row each
  int64_t start_batch = 0;              ///< batch_search: the first batch
  double memory_fraction = 0.0;         ///< batch_search: the fraction of the GPU's memory to reach
  std::string card;                     ///< card: the driver's name of the card the statement is about
  std::string wrong;                    ///< card: what is wrong with it ({published}: the card's figures)
  std::string why;                      ///< unmeasurable: why
};

/// A claims file, checked: every claim names a guide of the file (or kNoGuide), every A/B claim
/// variants of the file, every card claim a published card, every setting a run config key.
struct ClaimCatalogue {
  std::string source;  ///< the file, as messages name it
  std::vector<Guide> guides;
  std::map<std::string, Variant> variants;  ///< by name (as written, placeholders unfilled)
  std::vector<Claim> claims;                ///< in the report's order
};

/// The claims file `path`. ConfigError (exit code 2), one line "<path>: <key> ...: what is wrong"
/// for a file that cannot be read, is no JSON, lacks a key, has one of the wrong type or an
/// unknown one, or names a guide, variant, setting or card that does not exist.
ClaimCatalogue load_claims(const std::filesystem::path& path);

/// load_claims of JSON `text`, which `source` names in messages.
ClaimCatalogue parse_claims(const std::string& text, const std::string& source);

/// The path of the claims file ltrain carries, relative to the source folder.
inline const char* const kShippedClaimsFile = "configs/claims/guides.json";

/// The claims ltrain carries: kShippedClaimsFile as it was when ltrain was built.
const ClaimCatalogue& shipped_claims();

/// What the placeholders of the A/B claims stand for on a base config and device.
struct StepValues {
  std::string mode;   ///< {mode}: the precision of the claims that compare none
  int64_t batch = 1;  ///< {batch}: images per optimizer step, data.batch_size x optim.accumulation_steps
  /// {micro_batch}: a quarter of {batch} (at least 1); {micro_batches}: {batch} / {micro_batch}.
  int64_t micro_batch() const;
  int64_t micro_batches() const;
};

/// `text` with each "{name}" of `values` replaced by its value. std::invalid_argument naming the
/// first other "{...}" (or a lone brace): the fields with placeholders hold no literal braces.
std::string fill_placeholders(const std::string& text, const std::map<std::string, std::string>& values);

/// The placeholders of the A/B claims' texts and variants, filled with `values`.
std::map<std::string, std::string> step_placeholders(const StepValues& values);

/// `variant` with its placeholders filled.
Variant fill_variant(const Variant& variant, const StepValues& values);

/// The figures NVIDIA publishes for a card the guides speak of or the report may run on.
struct PublishedCard {
  std::string name;          ///< as the driver names it, e.g. "NVIDIA GeForce RTX 4090 D"
  std::string architecture;  ///< "Ada Lovelace"
  int major = 0;             ///< compute capability
  int minor = 0;
  int multiprocessors = 0;
  int cuda_cores = 0;
  std::string memory;        ///< "24 GB GDDR6X"
  std::string bandwidth;     ///< "1,008 GB/s"
};
/// Every card of the table, in the order published_card looks.
const std::vector<PublishedCard>& published_cards();
/// The card whose name `gpu_name` (the driver's name of a GPU) starts with, or null for one not
/// in the table.
const PublishedCard* published_card(const std::string& gpu_name);

/// "NVIDIA GeForce RTX 4090 D (Ada Lovelace, compute capability 8.9, 114 SMs, 14,592 CUDA cores,
/// 24 GB GDDR6X at 1,008 GB/s)".
std::string describe(const PublishedCard& card);

}  // namespace ltrain::bench
