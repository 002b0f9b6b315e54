#include "ltrain/io/tensor_file.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "ltrain/core/errors.h"
#include "ltrain/core/files.h"

namespace ltrain::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::array<std::pair<torch::ScalarType, const char*>, 10> kDtypeNames{{{torch::kFloat32, "F32"},
                                                                                 {torch::kFloat16, "F16"},
                                                                                 {torch::kBFloat16, "BF16"},
                                                                                 {torch::kFloat64, "F64"},
                                                                                 {torch::kInt64, "I64"},
                                                                                 {torch::kInt32, "I32"},
                                                                                 {torch::kInt16, "I16"},
                                                                                 {torch::kInt8, "I8"},
                                                                                 {torch::kUInt8, "U8"},
                                                                                 {torch::kBool, "BOOL"}}};

const char* dtype_name(torch::ScalarType type) {
  for (const auto& [t, name] : kDtypeNames)
    if (t == type) return name;
  throw std::invalid_argument(fmt::format("tensor files: unsupported dtype {}", c10::toString(type)));
}

bool dtype_from_name(const std::string& name, torch::ScalarType* type) {
  for (const auto& [t, n] : kDtypeNames) {
    if (name == n) {
      *type = t;
      return true;
    }
  }
  return false;
}

/// A CPU, contiguous copy (or the tensor itself when it already is one).
torch::Tensor host_contiguous(const torch::Tensor& tensor) { return tensor.detach().to(torch::kCPU).contiguous(); }

size_t byte_size(const torch::Tensor& tensor) { return static_cast<size_t>(tensor.numel()) * tensor.element_size(); }

std::vector<char> read_all(const fs::path& file, const char* what) {
  if (const std::string problem = files::not_a_readable_file(file); !problem.empty())
    throw DataError(fmt::format("{}: {} (expected a {} file)", file.string(), problem, what));
  std::ifstream in(file, std::ios::binary | std::ios::ate);
  if (!in) throw DataError(fmt::format("{}: cannot be opened (expected a {} file)", file.string(), what));
  const std::streamsize size = in.tellg();
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(bytes.data(), size)) throw DataError(fmt::format("{}: cannot read this {} file", file.string(), what));
  return bytes;
}

template <class T>
void append_le(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xFF));
}

template <class T>
T read_le(const char* bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return static_cast<T>(value);
}

/// Builds a tensor from `bytes` described by dtype name, shape and byte range; false if inconsistent.
bool tensor_from_bytes(const char* bytes, size_t available, const std::string& dtype, const json& shape, uint64_t begin,
                       uint64_t end, torch::Tensor* out) {
  torch::ScalarType type;
  if (!dtype_from_name(dtype, &type) || !shape.is_array() || end < begin || end > available) return false;
  // The shape must fit the byte range before anything is allocated: a header may claim any size.
  std::vector<int64_t> sizes;
  uint64_t bytes_claimed = c10::elementSize(type);
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned()) return false;
    const auto size = dim.get<uint64_t>();
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(bytes_claimed, size, &bytes_claimed))
      return false;
    sizes.push_back(static_cast<int64_t>(size));
  }
  if (bytes_claimed != end - begin) return false;
  torch::Tensor tensor = torch::empty(sizes, torch::TensorOptions().dtype(type));
  if (end > begin) std::memcpy(tensor.data_ptr(), bytes + begin, end - begin);
  *out = tensor;
  return true;
}

constexpr char kArchiveMagic[8] = {'L', 'T', 'R', 'A', 'I', 'N', 'C', 'K'};
constexpr char kArchiveEnd[8] = {'L', 'T', 'C', 'K', '-', 'E', 'N', 'D'};
constexpr size_t kAlignment = 64;        // tensor data offsets in an archive
constexpr size_t kArchivePrefix = 24;    // magic, version, reserved, header length
constexpr size_t kArchiveTrailer = 12;   // crc32, end marker

size_t align_up(size_t value, size_t alignment) { return (value + alignment - 1) / alignment * alignment; }

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  // Slicing-by-8 tables for the reflected polynomial 0xEDB88320, built once.
  static const auto tables = [] {
    std::array<std::array<uint32_t, 256>, 8> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size >= 8) {
    const uint32_t low = crc ^ (static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                                static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
    crc = tables[7][low & 0xFF] ^ tables[6][(low >> 8) & 0xFF] ^ tables[5][(low >> 16) & 0xFF] ^ tables[4][low >> 24] ^
          tables[3][p[4]] ^ tables[2][p[5]] ^ tables[1][p[6]] ^ tables[0][p[7]];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) crc = tables[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// ---- safetensors -------------------------------------------------------------------------------

void write_safetensors(const fs::path& file, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    host.push_back(host_contiguous(tensor));
    const uint64_t size = byte_size(host.back());
    header[name] = {{"dtype", dtype_name(tensor.scalar_type())},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string header_text = header.dump();
  header_text.append(align_up(header_text.size(), 8) - header_text.size(), ' ');  // readers accept trailing spaces
  std::string prefix;
  append_le<uint64_t>(prefix, header_text.size());
  files::Pieces pieces{{prefix.data(), prefix.size()}, {header_text.data(), header_text.size()}};
  for (const auto& tensor : host) pieces.emplace_back(tensor.data_ptr(), byte_size(tensor));
  files::write_atomically(file, pieces);
}

NamedTensors read_safetensors(const fs::path& file, std::map<std::string, std::string>* metadata) {
  const std::vector<char> bytes = read_all(file, "safetensors");
  auto bad = [&](const std::string& why) {
    return DataError(fmt::format("{}: not a valid safetensors file ({})", file.string(), why));
  };
  if (bytes.size() < 8) throw bad("shorter than its 8-byte header length");
  const auto header_size = read_le<uint64_t>(bytes.data());
  if (header_size > bytes.size() - 8) throw bad("header length beyond the end of the file");
  const json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size),
                                  nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) throw bad("the header is not a JSON object");
  const char* data = bytes.data() + 8 + header_size;
  const size_t data_size = bytes.size() - 8 - header_size;

  std::vector<std::tuple<uint64_t, std::string, torch::Tensor>> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (metadata && entry.is_object())
        for (const auto& [key, value] : entry.items())
          if (value.is_string()) (*metadata)[key] = value.get<std::string>();
      continue;
    }
    torch::Tensor tensor;
    const bool ok = entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                    entry.contains("data_offsets") && entry["data_offsets"].is_array() &&
                    entry["data_offsets"].size() == 2 && entry["data_offsets"][0].is_number_unsigned() &&
                    entry["data_offsets"][1].is_number_unsigned() &&
                    tensor_from_bytes(data, data_size, entry["dtype"].get<std::string>(), entry.value("shape", json()),
                                      entry["data_offsets"][0].get<uint64_t>(), entry["data_offsets"][1].get<uint64_t>(),
                                      &tensor);
    if (!ok) throw bad(fmt::format("entry \"{}\" is malformed or points outside the file", name));
    entries.emplace_back(entry["data_offsets"][0].get<uint64_t>(), name, tensor);
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  NamedTensors out;
  for (auto& [offset, name, tensor] : entries) out.emplace_back(std::move(name), std::move(tensor));
  return out;
}

// ---- ltrain archive ----------------------------------------------------------------------------

void write_archive(const fs::path& file, const TensorArchive& archive) {
  std::vector<torch::Tensor> host;
  json table = json::array();
  size_t offset = 0;
  for (const auto& [name, tensor] : archive.tensors) {
    host.push_back(host_contiguous(tensor));
    offset = align_up(offset, kAlignment);
    const size_t size = byte_size(host.back());
    table.push_back({{"name", name},
                     {"dtype", dtype_name(tensor.scalar_type())},
                     {"shape", tensor.sizes().vec()},
                     {"offset", offset},
                     {"nbytes", size}});
    offset += size;
  }
  const std::string header_text = json{{"info", archive.info}, {"tensors", table}}.dump();
  std::string prefix(kArchiveMagic, sizeof kArchiveMagic);
  append_le<uint32_t>(prefix, kArchiveVersion);
  append_le<uint32_t>(prefix, 0);
  append_le<uint64_t>(prefix, header_text.size());

  // The file in pieces: prefix, header, zero padding up to each 64-byte aligned tensor, tensors.
  static const std::array<char, kAlignment> zeros{};
  files::Pieces pieces{{prefix.data(), prefix.size()}, {header_text.data(), header_text.size()}};
  size_t position = kArchivePrefix + header_text.size();
  const size_t data_start = align_up(position, kAlignment);
  for (size_t i = 0; i < host.size(); ++i) {
    const size_t target = data_start + table[i]["offset"].get<size_t>();
    if (target > position) pieces.emplace_back(zeros.data(), target - position);
    pieces.emplace_back(host[i].data_ptr(), byte_size(host[i]));
    position = target + byte_size(host[i]);
  }
  if (data_start > position) pieces.emplace_back(zeros.data(), data_start - position);  // no tensors at all

  uint32_t checksum = 0;
  for (const auto& [data, size] : pieces) checksum = crc32(data, size, checksum);
  std::string trailer;
  append_le<uint32_t>(trailer, checksum);
  trailer.append(kArchiveEnd, sizeof kArchiveEnd);
  pieces.emplace_back(trailer.data(), trailer.size());
  files::write_atomically(file, pieces);
}

TensorArchive read_archive(const fs::path& file) {
  const std::vector<char> bytes = read_all(file, "checkpoint");
  const std::string name = file.string();
  if (bytes.size() < sizeof kArchiveMagic || std::memcmp(bytes.data(), kArchiveMagic, sizeof kArchiveMagic) != 0)
    throw DataError(fmt::format("{}: not an ltrain checkpoint (wrong magic number)", name));
  if (bytes.size() < kArchivePrefix + kArchiveTrailer ||
      std::memcmp(bytes.data() + bytes.size() - sizeof kArchiveEnd, kArchiveEnd, sizeof kArchiveEnd) != 0)
    throw DataError(fmt::format("{}: checkpoint is truncated (its end marker is missing): it was not completely "
                                "written; use an earlier checkpoint",
                                name));
  const auto version = read_le<uint32_t>(bytes.data() + 8);
  if (version == 0 || version > kArchiveVersion)
    throw DataError(fmt::format("{}: checkpoint format version {} is not supported by this ltrain (it reads up to {}); "
                                "use the ltrain that wrote it",
                                name, version, kArchiveVersion));
  const size_t body = bytes.size() - kArchiveTrailer;
  if (read_le<uint32_t>(bytes.data() + body) != crc32(bytes.data(), body))
    throw DataError(fmt::format("{}: checkpoint is damaged (checksum mismatch); use an earlier checkpoint", name));

  const auto header_size = read_le<uint64_t>(bytes.data() + 16);
  const size_t data_start = align_up(kArchivePrefix + header_size, kAlignment);
  const json header =
      header_size <= body - kArchivePrefix
          ? json::parse(bytes.begin() + kArchivePrefix, bytes.begin() + static_cast<std::ptrdiff_t>(kArchivePrefix + header_size),
                        nullptr, false)
          : json();
  if (!header.is_object() || !header.contains("tensors") || !header["tensors"].is_array() || data_start > body)
    throw DataError(fmt::format("{}: checkpoint header is malformed", name));

  TensorArchive archive;
  archive.info = header.value("info", json::object());
  for (const auto& entry : header["tensors"]) {
    torch::Tensor tensor;
    const bool ok = entry.is_object() && entry.contains("name") && entry["name"].is_string() && entry.contains("offset") &&
                    entry["offset"].is_number_unsigned() && entry.contains("nbytes") &&
                    entry["nbytes"].is_number_unsigned() && entry.contains("dtype") && entry["dtype"].is_string() &&
                    tensor_from_bytes(bytes.data() + data_start, body - data_start, entry["dtype"].get<std::string>(),
                                      entry.value("shape", json()), entry["offset"].get<uint64_t>(),
                                      entry["offset"].get<uint64_t>() + entry["nbytes"].get<uint64_t>(), &tensor);
    if (!ok) throw DataError(fmt::format("{}: checkpoint tensor table is malformed", name));
    archive.tensors.emplace_back(entry["name"].get<std::string>(), tensor);
  }
  return archive;
}

}  // namespace ltrain::io
