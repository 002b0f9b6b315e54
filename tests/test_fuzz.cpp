// Deterministic fuzzing of what users type: mutated run configs, --set values and sweep files go
// through the real ltrain executable (train, bench step, sweep) on a tiny synthetic CPU run.
// Whatever the input, ltrain must end by itself (within `timeout`) with a user-facing exit code:
// 0, 2 (config), 3 (data) or 4 (run); never 1 (a bug), a signal or a hang.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/core/errors.h"
#include "support.h"

namespace ltrain {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;
using testing::write_file;

/// Seconds one ltrain run may take before it counts as hung.
constexpr int kTimeoutSeconds = 20;
/// ltrain processes running at once.
constexpr size_t kParallelRuns = 2;

/// One fuzzed input.
struct FuzzCase {
  std::string mutation;           ///< what was done to the input, for failure messages
  std::vector<std::string> args;  ///< ltrain's arguments
  bool sweep = false;             ///< a sweep, whose points are configs too
};

/// How a run ended.
struct Outcome {
  int exit_code = -1;  ///< ltrain's exit code, -1 when it did not exit by itself
  std::string how;     ///< "" when it exited; else "timed out" or "killed by signal N"
};

// ---- The inputs -----------------------------------------------------------------------------------

/// A config as text, section by section, each value as JSON text (which a mutation may break).
using ConfigText = std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>>;

/// The tiny run every mutation starts from: one step of a width-4 ResNet-18 on 16 synthetic images.
/// run.out_dir is relative: the runs happen in the test's folder.
ConfigText base_config() {
  return {{"run",
           {{"name", "\"fuzz\""},
            {"out_dir", "\"runs\""},
            {"device", "\"cpu\""},
            {"epochs", "1"},
            {"max_steps", "1"},
            {"log_every_steps", "1"}}},
          {"model", {{"arch", "\"resnet18\""}, {"stem", "\"cifar\""}, {"width", "4"}}},
          {"data",
           {{"source", "\"synthetic\""},
            {"synthetic_train_size", "16"},
            {"synthetic_test_size", "8"},
            {"batch_size", "8"},
            {"eval_batch_size", "8"}}}};
}

/// One key per line, in order.
std::string render(const ConfigText& config) {
  std::string text = "{\n";
  for (size_t s = 0; s < config.size(); ++s) {
    text += "  \"" + config[s].first + "\": {";
    for (size_t k = 0; k < config[s].second.size(); ++k)
      text += fmt::format("{}\n    \"{}\": {}", k ? "," : "", config[s].second[k].first, config[s].second[k].second);
    text += s + 1 < config.size() ? "},\n" : "}\n";
  }
  return text + "}\n";
}

/// Sets section.key to `value` (JSON text, or anything), adding the key or section when missing.
void set_value(ConfigText& config, const std::string& path, const std::string& value) {
  const std::string section = path.substr(0, path.find('.')), key = path.substr(path.find('.') + 1);
  auto in_section = std::find_if(config.begin(), config.end(), [&](const auto& s) { return s.first == section; });
  if (in_section == config.end()) in_section = config.insert(config.end(), {section, {}});
  auto& entries = in_section->second;
  auto entry = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
  if (entry == entries.end()) entries.emplace_back(key, value);
  else entry->second = value;
}

std::string nested(const std::string& open, const std::string& inner, const std::string& close, int depth) {
  std::string text;
  for (int i = 0; i < depth; ++i) text += open;
  text += inner;
  for (int i = 0; i < depth; ++i) text += close;
  return text;
}

/// Every key of a run config, "section.key" (from the config's own list).
std::vector<std::string> all_keys() {
  std::vector<std::string> keys;
  const nlohmann::json defaults = config::to_json(config::RunConfig{});
  for (const auto& [section, fields] : defaults.items())
    for (const auto& [key, value] : fields.items()) keys.push_back(section + "." + key);
  return keys;
}

/// Values that any JSON reader takes: numbers past every range, wrong types, odd strings.
std::vector<std::string> plain_values() {
  return {"9223372036854775807", "-9223372036854775808", "18446744073709551615", "18446744073709551616",
          "2147483648", "4294967297", "1e308", "1e-308", "4.9e-324", "-0", "0", "-1",
          "123456789012345678901234567890", "0.5", "1e300", "\"x\"", "[]", "[1,2,3]", "[0.5,0.5,0.5]", "{}",
          "{\"a\":1}", "null", "true", "false", "\"\"", "\"pipe\"", "\"/dev/zero\"", "\".\"", "\"a/b\"",
          "\"c.json/sub\"", "\"" + std::string(300, 'x') + "\""};
}

/// JSON past ltrain's reader's limits: numbers past a double, NUL, long strings, keys set twice,
/// deep nesting (at most 100 KiB, under the kernel's limit of 128 KiB per argument).
std::vector<std::string> past_limit_values() {
  std::vector<std::string> values{"1e999", "-1e999", "\"\\u0000\"", "\"a\\u0000b\"", "\"\\ud800\"",
                                  "\"" + std::string(5000, 'y') + "\"", "{\"a\":1,\"a\":2}"};
  for (int depth : {33, 1000, 20000}) {
    values.push_back(nested("[", "", "]", depth));
    values.push_back(nested("{\"a\":", "1", "}", depth));
  }
  return values;
}

/// Text that is not JSON, or not UTF-8.
std::vector<std::string> broken_values() {
  return {"\xff", "\"\xc3\x28\"", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "tru", "1e", "--1", "0x10", "NaN", "Infinity",
          "[1,", "{\"a\"", nested("[", "", "", 100000), "\"a\nb\""};
}

/// Keys that are not keys, for --set.
std::vector<std::string> odd_keys() {
  return {"a", "run", "run.", ".name", "run..name", "run.name.x", "x.y", "run.na me", "RUN.NAME", "\xff.name", "",
          std::string(300, 'k') + ".x"};
}

class InputMaker {
 public:
  explicit InputMaker(uint64_t seed)
      : random_(seed), keys_(all_keys()), plain_(plain_values()), past_limit_(past_limit_values()),
        broken_(broken_values()) {}

  template <class T>
  const T& pick(const std::vector<T>& items) {
    return items[std::uniform_int_distribution<size_t>(0, items.size() - 1)(random_)];
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(random_); }
  int number(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random_); }

  /// A key to mutate; run.out_dir stays "runs" (a mutated one could write outside the test's folder).
  std::string key() {
    for (;;)
      if (const std::string& k = pick(keys_); k != "run.out_dir") return k;
  }
  /// A JSON value that any reader takes, or (with `past_limits`) often one past ltrain's limits or
  /// not JSON at all.
  std::string value(bool past_limits) {
    if (!past_limits) return pick(plain_);
    const double draw = std::uniform_real_distribution<double>(0, 1)(random_);
    return draw < 0.25 ? pick(broken_) : draw < 0.5 ? pick(past_limit_) : pick(plain_);
  }

  /// `text` with 1 to 3 bits flipped at random.
  std::string flip_bits(std::string text) {
    for (int flips = number(1, 3); flips > 0; --flips) {
      const size_t at = std::uniform_int_distribution<size_t>(0, text.size() - 1)(random_);
      text[at] = static_cast<char>(text[at] ^ (1 << number(0, 7)));
    }
    return text;
  }

 private:
  std::mt19937_64 random_;
  std::vector<std::string> keys_;
  std::vector<std::string> plain_;
  std::vector<std::string> past_limit_;
  std::vector<std::string> broken_;
};

/// train, or bench step with one timed step, of `config` with `sets`.
std::vector<std::string> command_for(InputMaker& maker, const std::string& config, const std::vector<std::string>& sets) {
  std::vector<std::string> args = maker.chance(0.6)
                                      ? std::vector<std::string>{"train", "--config", config}
                                      : std::vector<std::string>{"bench", "step", "--warmup", "0", "--steps", "1",
                                                                 "--config", config};
  for (const std::string& set : sets) args.insert(args.end(), {"--set", set});
  return args;
}

/// The fuzzed run configs and --set values, each a case of its own; files go into `dir`.
std::vector<FuzzCase> config_cases(InputMaker& maker, const fs::path& dir, int count) {
  std::vector<FuzzCase> cases;
  for (int i = 0; i < count; ++i) {
    const std::string file = fmt::format("config-{:03d}.json", i);
    ConfigText config = base_config();
    std::string text, mutation;
    std::vector<std::string> sets;
    switch (i % 8) {
      case 0:
      case 1:
        text = maker.flip_bits(render(config));
        mutation = "bit flips";
        break;
      case 2: {
        const std::string key = maker.key(), value = maker.value(true);
        set_value(config, key, value);
        mutation = "file value " + key;
        break;
      }
      case 3: {
        const std::string key = maker.key(), value = maker.value(true);
        sets.push_back(key + "=" + value);
        mutation = "--set " + key;
        break;
      }
      case 4: {
        const std::string key = maker.chance(0.5) ? maker.pick(odd_keys()) : maker.key();
        sets.push_back(key + "=" + maker.value(true));
        if (maker.chance(0.5)) sets.push_back(maker.key() + "=" + maker.value(false));
        mutation = "--set odd key " + key;
        break;
      }
      case 5: {
        // A section as one object, a key in it set twice, or a whole section twice.
        const std::string key = maker.key();
        const std::string section = key.substr(0, key.find('.')), name = key.substr(key.find('.') + 1);
        if (maker.chance(0.5)) {
          sets.push_back(fmt::format("{}={{\"{}\":{},\"{}\":{}}}", section, name, maker.value(false), name,
                                     maker.value(false)));
          mutation = "--set section object " + section;
        } else {
          text = render(config);
          const std::string duplicate = maker.chance(0.5) ? fmt::format("\"{}\": {{}},\n  ", section)
                                                          : fmt::format("\"{}\": {{\"{}\": 1, \"{}\": 2}},\n  ", section,
                                                                        name, name);
          text.insert(text.find('"'), duplicate);
          mutation = "duplicate in file " + key;
        }
        break;
      }
      case 6: {
        const int depth = maker.pick(std::vector<int>{33, 20000, 100000});
        text = maker.chance(0.5) ? nested("{\"run\":", "1", "}", depth) : nested("[", "", "]", depth);
        mutation = fmt::format("nesting {} deep", depth);
        break;
      }
      default: {
        // Paths that are not files: as the config, as "extends", as a path key's value.
        const std::string odd = maker.pick(std::vector<std::string>{
            "pipe", "/dev/zero", "/dev/null", ".", "nope.json", "", std::string(300, 'p') + ".json", "c.json/x"});
        const int where = maker.number(0, 2);
        if (where == 0) {
          cases.push_back({"--config " + odd.substr(0, 40), command_for(maker, odd, {}), false});
          continue;
        }
        if (where == 1) {
          text = "{\"extends\": " + nlohmann::json(odd).dump() + "}";
        } else {
          const std::string key =
              maker.pick(std::vector<std::string>{"model.init_from", "checkpoint.resume", "run.name", "run.out_dir"});
          const std::string value = key == "run.out_dir" ? maker.pick(std::vector<std::string>{"pipe", "pipe/x", "c.json/x", ".", ""}) : odd;
          set_value(config, key, nlohmann::json(value).dump());
        }
        mutation = "odd path " + odd.substr(0, 40);
        break;
      }
    }
    write_file(dir / file, text.empty() ? render(config) : text);
    cases.push_back({mutation, command_for(maker, file, sets), false});
  }
  return cases;
}

/// Sweeps over the base config: grids of fuzzed values, fuzzed "set" lists, broken sweep files.
std::vector<FuzzCase> sweep_cases(InputMaker& maker, const fs::path& dir, int count) {
  std::vector<FuzzCase> cases;
  const std::string bench = R"("mode": "bench", "bench": {"warmup": 0, "steps": 1})";
  for (int i = 0; i < count; ++i) {
    const std::string file = fmt::format("sweep-{:03d}.json", i);
    std::string text, mutation;
    switch (i % 4) {
      case 0:
      case 1: {
        // Mode train runs each point whole (one step, an evaluation, a checkpoint): fewer of them.
        const bool train = i % 8 == 1;
        const std::string key = maker.key();
        std::string values;
        for (int v = train ? maker.number(3, 5) : maker.number(6, 12); v > 0; --v)
          values += (values.empty() ? "" : ", ") + maker.value(false);
        const std::string mode = train ? R"("mode": "train")" : bench;
        text = fmt::format(R"({{"base": "c.json", {}, "grid": {{"{}": [{}]}}}})", mode, key, values);
        mutation = "grid of " + key;
        break;
      }
      case 2: {
        nlohmann::json sets = nlohmann::json::array();
        for (int s = maker.number(1, 3); s > 0; --s) sets.push_back(maker.key() + "=" + maker.value(true));
        text = fmt::format(R"({{"base": "c.json", {}, "set": {}, "grid": {{"data.batch_size": [4, 8]}}}})", bench,
                           sets.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        mutation = "sweep set list";
        break;
      }
      default: {
        const std::string sound =
            fmt::format(R"({{"base": "c.json", {}, "grid": {{"data.batch_size": [4, 8], "optim.lr": [0.1, 0.01]}}}})", bench);
        text = maker.chance(0.7) ? maker.flip_bits(sound)
                                 : fmt::format(R"({{"base": "c.json", "grid": {{"a.b": [{}], "c.d": [{}], "e.f": [{}]}}}})",
                                               std::string(99, '1') + "1", std::string(99, '1') + "1",
                                               std::string(99, '1') + "1");
        mutation = "sweep file mutation";
        break;
      }
    }
    write_file(dir / file, text);
    cases.push_back({mutation, {"sweep", "--config", file, "--out", fmt::format("sweep-out-{:03d}", i)}, true});
  }
  return cases;
}

// ---- Running them ----------------------------------------------------------------------------------

Outcome outcome_of(int status) {
  if (WIFSIGNALED(status)) return {-1, fmt::format("killed by signal {}", WTERMSIG(status))};
  const int code = WEXITSTATUS(status);
  if (code == 124) return {-1, "timed out"};
  if (code > 128) return {-1, fmt::format("killed by signal {}", code - 128)};
  return {code, ""};
}

/// The `timeout` program on the PATH ("" when there is none).
std::string timeout_program() {
  const char* path = std::getenv("PATH");
  std::stringstream folders(path ? path : "/usr/bin:/bin");
  for (std::string folder; std::getline(folders, folder, ':');)
    if (const std::string candidate = folder + "/timeout"; ::access(candidate.c_str(), X_OK) == 0) return candidate;
  return "";
}

/// Runs each case as `timeout kTimeoutSeconds ltrain ARGS` in `dir` (output in dir/log-N),
/// kParallelRuns at a time. Arguments go to the process as they are, without a shell.
std::vector<Outcome> run_all(const std::vector<FuzzCase>& cases, const fs::path& dir) {
  const std::string timeout = timeout_program();
  if (timeout.empty()) ADD_FAILURE() << "no timeout program on the PATH";
  std::vector<Outcome> outcomes(cases.size());
  std::map<pid_t, size_t> running;
  size_t next = 0;
  while (next < cases.size() || !running.empty()) {
    if (next < cases.size() && running.size() < kParallelRuns) {
      // Everything the child needs is made before fork(): it only opens, redirects and execs.
      std::vector<std::string> words{timeout, std::to_string(kTimeoutSeconds), LTRAIN_EXECUTABLE};
      words.insert(words.end(), cases[next].args.begin(), cases[next].args.end());
      std::vector<char*> argv;
      for (std::string& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      const std::string log = (dir / fmt::format("log-{:03d}", next)).string();
      const pid_t child = ::fork();
      if (child == 0) {
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || ::chdir(dir.c_str()) != 0) ::_exit(127);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::execv(argv[0], argv.data());
        ::_exit(127);
      }
      if (child < 0) ADD_FAILURE() << "fork failed";
      else running[child] = next;
      ++next;
      continue;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, 0);
    if (done < 0) break;
    const auto it = running.find(done);
    if (it == running.end()) continue;
    outcomes[it->second] = outcome_of(status);
    running.erase(it);
  }
  return outcomes;
}

TEST(Fuzz, NoInputCrashesHangsOrExitsOne) {
  TempDir dir;
  InputMaker maker(/*seed=*/12345);
  write_file(dir.path() / "c.json", render(base_config()));
  ASSERT_EQ(::mkfifo((dir.path() / "pipe").c_str(), 0600), 0);
  std::vector<FuzzCase> cases = config_cases(maker, dir.path(), 96);
  const std::vector<FuzzCase> sweeps = sweep_cases(maker, dir.path(), 24);
  cases.insert(cases.end(), sweeps.begin(), sweeps.end());

  const std::vector<Outcome> outcomes = run_all(cases, dir.path());
  std::map<int, int> exit_codes;
  int sweep_points = 0, failed_points = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Outcome& outcome = outcomes[i];
    ++exit_codes[outcome.exit_code];
    // A sweep that ran to its end with failed points exits 7; a single run never does.
    const bool points_failed = cases[i].sweep && outcome.exit_code == static_cast<int>(ExitCode::points_failed);
    const bool user_facing =
        outcome.exit_code == 0 || (outcome.exit_code >= 2 && outcome.exit_code <= 4) || points_failed;
    if (!user_facing) {
      std::string command;
      for (const std::string& arg : cases[i].args) command += " " + config::shown(arg);
      const std::string log = read_file(dir.path() / fmt::format("log-{:03d}", i));
      ADD_FAILURE() << "case " << i << " (" << cases[i].mutation << "): ltrain" << command << ": "
                    << (outcome.how.empty() ? fmt::format("exit code {}", outcome.exit_code) : outcome.how) << "\n"
                    << log.substr(log.size() > 2000 ? log.size() - 2000 : 0);
    }
    if (cases[i].sweep && (outcome.exit_code == 0 || points_failed)) {
      const fs::path results = dir.path() / fmt::format("sweep-out-{:03d}", i - (cases.size() - sweeps.size())) / "results.json";
      const nlohmann::json saved = nlohmann::json::parse(read_file(results));
      for (const auto& row : saved["rows"]) {
        ++sweep_points;
        if (!row["error"].is_null()) ++failed_points;
      }
    }
  }
  std::string counts;
  for (const auto& [code, n] : exit_codes) counts += fmt::format("{}exit {}: {}", counts.empty() ? "" : ", ", code, n);
  std::cout << fmt::format("Fuzz: {} runs of ltrain ({} of them sweeps, whose {} points include {} that failed as "
                           "their rows); {}\n",
                           cases.size(), sweeps.size(), sweep_points, failed_points, counts);
}

}  // namespace
}  // namespace ltrain
