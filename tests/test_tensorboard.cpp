// TensorBoard event files: CRC-32C and the TFRecord framing, the Event and Summary messages read
// back by a reader of the tests' own (framing, CRCs, fields), a short run's file against its
// metrics.jsonl, a resumed run's files, a refused write, and, where Python's tensorboard package
// imports, TensorBoard's own loader.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <stdexcept>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ltrain/config/load.h"
#include "ltrain/engine/checkpoint.h"
#include "ltrain/engine/trainer.h"
#include "ltrain/io/provenance.h"
#include "ltrain/io/run_files.h"
#include "ltrain/io/tensorboard.h"
#include "support.h"

namespace ltrain::io {
namespace {

namespace fs = std::filesystem;
using testing::read_file;
using testing::TempDir;

// ---- A reader of the tests' own: TFRecord framing, CRCs, and the protobuf fields ----------------

/// CRC-32C bit by bit, apart from the library's table.
uint32_t reference_crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (const char c : bytes) {
    crc ^= static_cast<unsigned char>(c);
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}
uint32_t reference_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

uint64_t little_endian(std::string_view bytes, size_t at, size_t count) {
  uint64_t value = 0;
  for (size_t i = count; i-- > 0;) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

/// One field of a protobuf message: its number, wire type, and value (varint, fixed bits, or bytes).
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t value = 0;
  std::string bytes;
};

/// The fields of `message` in order; std::runtime_error where it is not well formed.
std::vector<Field> fields_of(std::string_view message) {
  std::vector<Field> fields;
  size_t at = 0;
  auto varint = [&] {
    uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= message.size() || shift > 63) throw std::runtime_error("a varint runs past its message");
      const auto byte = static_cast<unsigned char>(message[at++]);
      value |= uint64_t{byte & 0x7Fu} << shift;
      if (!(byte & 0x80u)) return value;
    }
  };
  while (at < message.size()) {
    Field field;
    const uint64_t key = varint();
    field.number = static_cast<uint32_t>(key >> 3);
    field.wire_type = static_cast<uint32_t>(key & 7);
    if (field.wire_type == 0) {
      field.value = varint();
    } else if (field.wire_type == 1 || field.wire_type == 5) {
      const size_t size = field.wire_type == 1 ? 8 : 4;
      if (message.size() - at < size) throw std::runtime_error("a fixed-size field runs past its message");
      field.value = little_endian(message, at, size);
      at += size;
    } else if (field.wire_type == 2) {
      const uint64_t size = varint();
      if (size > message.size() - at) throw std::runtime_error("a length-delimited field runs past its message");
      field.bytes = std::string(message.substr(at, size));
      at += size;
    } else {
      throw std::runtime_error("wire type " + std::to_string(field.wire_type));
    }
    fields.push_back(field);
  }
  return fields;
}

double as_double(uint64_t bits) {
  double value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
float as_float(uint64_t bits) {
  const auto narrow = static_cast<uint32_t>(bits);
  float value = 0;
  std::memcpy(&value, &narrow, sizeof value);
  return value;
}

/// A Summary.Value as TensorBoard's summary.proto has it (the fields ltrain writes).
struct SummaryValue {
  std::string tag;
  std::optional<float> simple_value;
  std::string plugin_name;  // SummaryMetadata.plugin_data.plugin_name
  uint64_t data_class = 0;  // SummaryMetadata.data_class
  bool has_tensor = false;
  uint64_t dtype = 0;       // TensorProto.dtype
  bool has_shape = false;
  size_t dimensions = 0;
  std::vector<std::string> strings;  // TensorProto.string_val
};

/// An Event as TensorBoard's event.proto has it.
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::optional<std::string> file_version;
  bool has_summary = false;
  std::vector<SummaryValue> values;
};

SummaryValue parse_value(std::string_view message) {
  SummaryValue value;
  for (const Field& field : fields_of(message)) {
    if (field.number == 1 && field.wire_type == 2) value.tag = field.bytes;
    if (field.number == 2 && field.wire_type == 5) value.simple_value = as_float(field.value);
    if (field.number == 9 && field.wire_type == 2) {
      for (const Field& meta : fields_of(field.bytes)) {
        if (meta.number == 1 && meta.wire_type == 2)
          for (const Field& plugin : fields_of(meta.bytes))
            if (plugin.number == 1 && plugin.wire_type == 2) value.plugin_name = plugin.bytes;
        if (meta.number == 4 && meta.wire_type == 0) value.data_class = meta.value;
      }
    }
    if (field.number == 8 && field.wire_type == 2) {
      value.has_tensor = true;
      for (const Field& tensor : fields_of(field.bytes)) {
        if (tensor.number == 1 && tensor.wire_type == 0) value.dtype = tensor.value;
        if (tensor.number == 2 && tensor.wire_type == 2) {
          value.has_shape = true;
          for (const Field& dim : fields_of(tensor.bytes)) value.dimensions += dim.number == 2 ? 1 : 0;
        }
        if (tensor.number == 8 && tensor.wire_type == 2) value.strings.push_back(tensor.bytes);
      }
    }
  }
  return value;
}

Event parse_event(std::string_view message) {
  Event event;
  for (const Field& field : fields_of(message)) {
    if (field.number == 1 && field.wire_type == 1) event.wall_time = as_double(field.value);
    if (field.number == 2 && field.wire_type == 0) event.step = static_cast<int64_t>(field.value);
    if (field.number == 3 && field.wire_type == 2) event.file_version = field.bytes;
    if (field.number == 5 && field.wire_type == 2) {
      event.has_summary = true;
      for (const Field& value : fields_of(field.bytes))
        if (value.number == 1 && value.wire_type == 2) event.values.push_back(parse_value(value.bytes));
    }
  }
  return event;
}

/// The events of `file`, each record's framing and both CRCs checked: std::runtime_error otherwise.
std::vector<Event> read_event_file(const fs::path& file) {
  const std::string bytes = read_file(file);
  const std::string_view all(bytes);
  std::vector<Event> events;
  for (size_t at = 0; at < all.size();) {
    if (all.size() - at < 16) throw std::runtime_error(file.string() + ": a torn record at byte " + std::to_string(at));
    const uint64_t length = little_endian(all, at, 8);
    if (reference_mask(reference_crc32c(all.substr(at, 8))) != little_endian(all, at + 8, 4))
      throw std::runtime_error(file.string() + ": the length's CRC fails at byte " + std::to_string(at));
    if (length > all.size() - at - 16) throw std::runtime_error(file.string() + ": a record runs past the end");
    const std::string_view payload = all.substr(at + 12, length);
    if (reference_mask(reference_crc32c(payload)) != little_endian(all, at + 12 + length, 4))
      throw std::runtime_error(file.string() + ": the data's CRC fails at byte " + std::to_string(at));
    events.push_back(parse_event(payload));
    at += 16 + length;
  }
  return events;
}

/// The ltrain event files of `run_dir`, sorted by name (time).
std::vector<fs::path> event_files(const fs::path& run_dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(run_dir))
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found;
}

// ---- What a run's event files hold, against its metrics.jsonl --------------------------------------

/// Scalars and texts by (tag, step), each with every value seen (more than one: a duplicate step).
struct TensorBoardData {
  std::map<std::pair<std::string, int64_t>, std::vector<double>> scalars;
  std::map<std::pair<std::string, int64_t>, std::vector<std::string>> texts;
};

TensorBoardData collect(const std::vector<Event>& events) {
  TensorBoardData data;
  for (const Event& event : events)
    for (const SummaryValue& value : event.values) {
      if (value.simple_value) data.scalars[{value.tag, event.step}].push_back(*value.simple_value);
      for (const std::string& text : value.strings) data.texts[{value.tag, event.step}].push_back(text);
    }
  return data;
}

/// The documented tags: (row kind, metrics column) -> TensorBoard tag.
const std::map<std::pair<std::string, std::string>, std::string>& documented_tags() {
  static const std::map<std::pair<std::string, std::string>, std::string> tags{
      {{"step", "train_loss"}, "train/loss"},
      {{"step", "train_acc"}, "train/accuracy"},
      {{"step", "lr"}, "train/lr"},
      {{"step", "img_per_s"}, "train/images_per_second"},
      {{"step", "loss_scale"}, "train/loss_scale"},
      {{"step", "skipped_steps"}, "train/skipped_steps"},
      {{"step", "gpu_memory_gib"}, "gpu/memory_gib"},
      {{"step", "gpu_peak_memory_gib"}, "gpu/peak_memory_gib"},
      {{"epoch", "train_loss"}, "epoch/train_loss"},
      {{"epoch", "train_acc"}, "epoch/train_accuracy"},
      {{"epoch", "img_per_s"}, "epoch/images_per_second"},
      {{"epoch", "test_loss"}, "test/loss"},
      {{"epoch", "test_acc"}, "test/accuracy"},
  };
  return tags;
}

std::vector<nlohmann::json> jsonl_rows(const fs::path& file) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

/// The JSON inside a Markdown code block (four spaces before each line).
nlohmann::json code_block_json(const std::string& markdown) {
  std::string text;
  size_t start = 0;
  while (start <= markdown.size()) {
    const size_t end = std::min(markdown.find('\n', start), markdown.size());
    const std::string line = markdown.substr(start, end - start);
    EXPECT_EQ(line.substr(0, 4), "    ") << line;
    text += line.substr(std::min<size_t>(4, line.size())) + "\n";
    start = end + 1;
  }
  return nlohmann::json::parse(text);
}

/// Every value of metrics.jsonl's step and epoch rows under its documented tag at the row's step
/// (float32, as TensorBoard keeps scalars), and no other scalar; each (tag, step) once; each "run"
/// row's provenance and a config as texts at its step, the last config that of config.json.
void expect_matches_metrics(const TensorBoardData& data, const fs::path& run_dir) {
  size_t expected_scalars = 0;
  nlohmann::json last_config;
  for (const nlohmann::json& row : jsonl_rows(run_dir / "metrics.jsonl")) {
    const std::string kind = row.at("kind");
    const int64_t step = row.at("step");
    if (kind == "run") {
      const auto provenance = data.texts.find({"provenance", step});
      const auto config = data.texts.find({"config", step});
      ASSERT_NE(provenance, data.texts.end()) << "no provenance text at step " << step;
      ASSERT_NE(config, data.texts.end()) << "no config text at step " << step;
      ASSERT_EQ(provenance->second.size(), 1u);
      ASSERT_EQ(config->second.size(), 1u);
      EXPECT_EQ(code_block_json(provenance->second[0]), row.at("provenance"));
      last_config = code_block_json(config->second[0]);
      continue;
    }
    for (const auto& [key, tag] : documented_tags()) {
      if (key.first != kind || !row.contains(key.second) || row.at(key.second).is_null()) continue;
      ++expected_scalars;
      const auto found = data.scalars.find({tag, step});
      ASSERT_NE(found, data.scalars.end()) << tag << " at step " << step;
      ASSERT_EQ(found->second.size(), 1u) << tag << " at step " << step << " more than once";
      EXPECT_EQ(found->second[0], static_cast<float>(row.at(key.second).get<double>())) << tag << " at step " << step;
    }
  }
  EXPECT_EQ(data.scalars.size(), expected_scalars) << "scalars that no metrics row holds";
  EXPECT_EQ(last_config, nlohmann::json::parse(read_file(run_dir / "config.json")));
  for (const auto& [key, texts] : data.texts) EXPECT_EQ(texts.size(), 1u) << key.first << " at step " << key.second;
}

/// A tiny model on a small synthetic set: 4 steps per epoch, a log point every 2.
config::LoadedConfig tiny_run(const fs::path& out_dir, const std::vector<std::string>& extra = {}) {
  return testing::config_from({"run.out_dir=" + out_dir.string(), "run.name=tb", "run.epochs=2",
                               "run.log_every_steps=2", "run.device=cpu", "run.threads=2", "model.arch=resnet18",
                               "model.stem=cifar", "model.width=4", "data.source=synthetic",
                               "data.synthetic_train_size=64", "data.synthetic_test_size=32", "data.batch_size=16"},
                              extra);
}

// ---- Tests -------------------------------------------------------------------------------------------

TEST(Crc32c, KnownAnswerAndTheTfRecordMask) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(reference_crc32c(check), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string longer(1000, '\xA5');
  EXPECT_EQ(crc32c(longer.data(), longer.size()), reference_crc32c(longer));
  EXPECT_EQ(masked_crc32c(0), 0xA282EAD8u);
  EXPECT_EQ(masked_crc32c(0xE3069283u), reference_mask(0xE3069283u));
}

TEST(TfRecord, LengthItsCrcDataAndTheDataCrc) {
  const std::string record = tfrecord("abc");
  ASSERT_EQ(record.size(), 3u + 16u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(little_endian(record, 8, 4), reference_mask(reference_crc32c(record.substr(0, 8))));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(little_endian(record, 15, 4), reference_mask(reference_crc32c("abc")));
}

TEST(EventFile, ItsRecordsReadBackAsTensorBoardsMessages) {
  TempDir dir;
  const fs::path file = dir.path() / "events.out.tfevents.0000000001.host.ltrain";
  const double before = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  {
    EventFile events(file);
    events.write_scalars(5, {{"train/loss", 1.5}, {"train/lr", -0.25}});
    events.write_texts(0, {{"config", "    {}"}});
    events.write_scalars(6, {});  // nothing to write: no record
  }
  EventFile(file).write_scalars(7, {{"x", 3.0}});  // continued: no second file_version
  const std::vector<Event> events = read_event_file(file);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_FALSE(events[0].has_summary);
  EXPECT_GE(events[0].wall_time, before - 1);
  EXPECT_LE(events[0].wall_time, events[1].wall_time);

  EXPECT_EQ(events[1].step, 5);
  ASSERT_EQ(events[1].values.size(), 2u);
  EXPECT_EQ(events[1].values[0].tag, "train/loss");
  EXPECT_EQ(events[1].values[0].simple_value, 1.5f);
  EXPECT_EQ(events[1].values[1].tag, "train/lr");
  EXPECT_EQ(events[1].values[1].simple_value, -0.25f);
  EXPECT_FALSE(events[1].values[0].has_tensor);

  EXPECT_EQ(events[2].step, 0);
  ASSERT_EQ(events[2].values.size(), 1u);
  const SummaryValue& text = events[2].values[0];
  EXPECT_EQ(text.tag, "config");
  EXPECT_FALSE(text.simple_value.has_value());
  EXPECT_EQ(text.plugin_name, "text");
  EXPECT_EQ(text.data_class, 2u);  // DATA_CLASS_TENSOR
  EXPECT_TRUE(text.has_tensor);
  EXPECT_EQ(text.dtype, 7u);       // DT_STRING
  EXPECT_TRUE(text.has_shape);
  EXPECT_EQ(text.dimensions, 0u);  // a scalar
  EXPECT_EQ(text.strings, std::vector<std::string>{"    {}"});
  EXPECT_EQ(events[3].step, 7);
  EXPECT_FALSE(events[3].file_version.has_value());

  // The library's own reading, which a resumed run uses to drop records.
  bool complete = false;
  const std::vector<EventRecord> records = read_event_records(file, complete);
  EXPECT_TRUE(complete);
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[1].step, 5);
  EXPECT_EQ(records[1].first_tag, "train/loss");
  EXPECT_EQ(records[2].first_tag, "config");
  EXPECT_EQ(records[0].first_tag, "");
  testing::write_file(dir.path() / "torn", read_file(file) + std::string("\x10\0\0", 3));
  EXPECT_EQ(read_event_records(dir.path() / "torn", complete).size(), 4u);
  EXPECT_FALSE(complete);
  // A damaged record in the middle (one byte of its payload changed) loses only itself: the
  // records after it are found again.
  std::string damaged = read_file(file);
  damaged[records[0].framed.size() + 14] ^= 0x5A;
  testing::write_file(dir.path() / "damaged", damaged);
  const std::vector<EventRecord> after_damage = read_event_records(dir.path() / "damaged", complete);
  EXPECT_FALSE(complete);
  ASSERT_EQ(after_damage.size(), 3u);
  EXPECT_EQ(after_damage[0].framed, records[0].framed);
  EXPECT_EQ(after_damage[1].framed, records[2].framed);
  EXPECT_EQ(after_damage[2].framed, records[3].framed);
}

TEST(EventFile, ARefusedWriteNamesTheFile) {
  TempDir dir;
  const fs::path file = dir.path() / "events.out.tfevents.0000000001.host.ltrain";
  fs::create_symlink("/dev/full", file);  // refuses every write, as a full disk does
  try {
    EventFile events(file);
    FAIL() << "no WriteError";
  } catch (const files::WriteError& error) {
    EXPECT_EQ(std::string(error.what()), file.string() + ": cannot write (No space left on device): free some disk "
                                                         "space or write to another disk");
  }
}

TEST(TensorBoard, TruncationKeepsWhatAResumeAtTheStepDoesNotWriteAgain) {
  TempDir dir;
  {
    MetricsLog log(dir.path(), /*tensorboard=*/true);
    log.write_run(1, 0, {{"host", "a"}}, {{"run", {{"name", "x"}}}});
    log.write({"step", 1, 2, {{"train_loss", 2.0}, {"lr", 0.1}}});
    log.write({"step", 1, 4, {{"train_loss", 1.5}, {"lr", 0.1}}});
    log.write({"epoch", 1, 4, {{"train_loss", 1.7}, {"test_acc", 0.5}}});
    log.write_run(2, 4, {{"host", "b"}}, {{"run", {{"name", "x"}}}});  // an earlier resume at step 4
    log.write({"step", 2, 6, {{"train_loss", 1.0}, {"lr", 0.1}}});
  }
  // A resume at step 4 after the epoch's evaluation: the epoch row at 4 stays, the run row at 4 goes.
  truncate_metrics(dir.path(), 4, /*epoch_row_at_step_kept=*/true);
  std::vector<std::pair<std::string, int64_t>> rows;
  for (const nlohmann::json& row : jsonl_rows(dir.path() / "metrics.jsonl"))
    rows.emplace_back(row["kind"], row["step"]);
  EXPECT_EQ(rows, (std::vector<std::pair<std::string, int64_t>>{{"run", 0}, {"step", 2}, {"step", 4}, {"epoch", 4}}));
  const std::vector<fs::path> files = event_files(dir.path());
  ASSERT_EQ(files.size(), 1u);
  const TensorBoardData data = collect(read_event_file(files[0]));
  EXPECT_EQ(data.texts.size(), 2u);  // config and provenance at step 0
  EXPECT_EQ(data.texts.count({"provenance", 0}), 1u);
  EXPECT_EQ(data.scalars.size(), 6u);  // train/loss and train/lr at 2 and 4, epoch/train_loss and test/accuracy at 4
  EXPECT_EQ(data.scalars.count({"test/accuracy", 4}), 1u);
  EXPECT_EQ(data.scalars.count({"train/loss", 6}), 0u);
  testing::write_file(dir.path() / "config.json", R"({"run": {"name": "x"}})");
  expect_matches_metrics(data, dir.path());
  EXPECT_EQ(read_event_file(files[0]).front().file_version, "brain.Event:2");

  // A resume at 4 from a checkpoint taken before the evaluation: the epoch row goes too.
  truncate_metrics(dir.path(), 4, /*epoch_row_at_step_kept=*/false);
  EXPECT_EQ(collect(read_event_file(files[0])).scalars.size(), 4u);

  // Rows ltrain did not write (a step or kind of another type, a hand edit) go as a torn line does.
  std::ofstream(dir.path() / "metrics.jsonl", std::ios::app)
      << R"({"kind": "step", "epoch": 1, "step": "x"})" << "\n" << R"({"kind": 3, "step": 1})" << "\n";
  truncate_metrics(dir.path(), 4, /*epoch_row_at_step_kept=*/false);
  EXPECT_EQ(jsonl_rows(dir.path() / "metrics.jsonl").size(), 3u);
}

TEST(TensorBoard, AShortRunsEventFileHoldsItsMetricsConfigAndProvenance) {
  TempDir dir;
  const auto before = std::chrono::system_clock::now();
  const engine::TrainResult result = engine::train(tiny_run(dir.path()));
  const double after = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::vector<fs::path> files = event_files(result.run_dir);
  ASSERT_EQ(files.size(), 1u);
  const std::string name = files[0].filename().string();
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.[0-9]{10}\..+\.ltrain)"))) << name;
  EXPECT_EQ(name.substr(31, name.size() - 31 - 7), host_name()) << name;

  const std::vector<Event> events = read_event_file(files[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  const double start = std::chrono::duration<double>(before.time_since_epoch()).count();
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_LE(events[i - 1].wall_time, events[i].wall_time);
    EXPECT_GE(events[i].wall_time, start - 1);
    EXPECT_LE(events[i].wall_time, after + 1);
  }
  const TensorBoardData data = collect(events);
  expect_matches_metrics(data, result.run_dir);
  // The documented names, at the steps this run logs (2, 4, 6, 8; epochs end at 4 and 8).
  for (const int64_t step : {2, 4, 6, 8})
    for (const char* tag : {"train/loss", "train/accuracy", "train/lr", "train/images_per_second"})
      EXPECT_EQ(data.scalars.count({tag, step}), 1u) << tag << " at " << step;
  for (const int64_t step : {4, 8})
    for (const char* tag : {"test/loss", "test/accuracy", "epoch/train_loss", "epoch/train_accuracy"})
      EXPECT_EQ(data.scalars.count({tag, step}), 1u) << tag << " at " << step;
  EXPECT_EQ(data.scalars.count({"gpu/memory_gib", 2}), 0u) << "the CPU reports no device memory";
  EXPECT_EQ(data.texts.count({"config", 0}), 1u);
  EXPECT_EQ(data.texts.count({"provenance", 0}), 1u);
}

TEST(TensorBoard, OffWritesNoEventFile) {
  TempDir dir;
  const engine::TrainResult result = engine::train(tiny_run(dir.path(), {"run.epochs=1", "run.tensorboard=false"}));
  EXPECT_TRUE(event_files(result.run_dir).empty());
  EXPECT_TRUE(fs::exists(result.run_dir / "metrics.jsonl"));
}

TEST(TensorBoard, AResumedRunDropsTheEventsAfterItsCheckpointAndATornEnd) {
  TempDir dir;
  const engine::TrainResult first =
      engine::train(tiny_run(dir.path(), {"checkpoint.every_steps=3", "checkpoint.keep_last=20"}));
  const fs::path checkpoint = first.run_dir / "checkpoints" / engine::checkpoint_file_name(3);
  ASSERT_TRUE(fs::exists(checkpoint));
  // The end of a write that a killed process left half done.
  const fs::path old_file = event_files(first.run_dir).at(0);
  std::ofstream(old_file, std::ios::app | std::ios::binary) << std::string("\x40\0\0\0\0", 5);

  const engine::TrainResult resumed = engine::train(tiny_run(
      dir.path(), {"checkpoint.every_steps=3", "checkpoint.keep_last=20", "checkpoint.resume=" + checkpoint.string()}));
  ASSERT_EQ(resumed.run_dir, first.run_dir);
  std::vector<Event> events;
  for (const fs::path& file : event_files(resumed.run_dir)) {
    std::vector<Event> more;
    ASSERT_NO_THROW(more = read_event_file(file)) << file;
    events.insert(events.end(), more.begin(), more.end());
  }
  const TensorBoardData data = collect(events);
  expect_matches_metrics(data, resumed.run_dir);
  // The first process's texts at step 0, the resumed one's at its checkpoint's step; the steps
  // after it (logged twice, before and after the resume) once each.
  EXPECT_EQ(data.texts.count({"config", 0}), 1u);
  EXPECT_EQ(data.texts.count({"config", 3}), 1u);
  for (const int64_t step : {2, 3, 4, 6, 8}) EXPECT_EQ(data.scalars.count({"train/loss", step}), 1u) << step;
}

TEST(TensorBoard, TensorBoardsOwnLoaderReadsTheFiles) {
  LTRAIN_REQUIRE_PYTHON(python, "tensorboard.backend.event_processing.event_accumulator");
  TempDir dir;
  const engine::TrainResult result = engine::train(tiny_run(dir.path()));
  const fs::path out = dir.path() / "loaded.json";
  const std::string command = python + " " LTRAIN_SOURCE_DIR "/tests/tensorboard_loader.py '" +
                              result.run_dir.string() + "' > '" + out.string() + "' 2> '" +
                              (dir.path() / "loader.log").string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(dir.path() / "loader.log");
  const nlohmann::json loaded = nlohmann::json::parse(read_file(out));

  TensorBoardData data;
  for (const auto& [tag, points] : loaded.at("scalars").items())
    for (const nlohmann::json& point : points) data.scalars[{tag, point[0].get<int64_t>()}].push_back(point[1]);
  for (const auto& [tag, points] : loaded.at("texts").items())
    for (const nlohmann::json& point : points) data.texts[{tag, point[0].get<int64_t>()}].push_back(point[1]);
  expect_matches_metrics(data, result.run_dir);
  EXPECT_EQ(loaded.at("plugins").at("config"), "text");
  EXPECT_EQ(loaded.at("plugins").at("provenance"), "text");
  const std::vector<fs::path> files = event_files(result.run_dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(loaded.at("records").at(files[0].filename().string()), read_event_file(files[0]).size());
}

}  // namespace
}  // namespace ltrain::io
