#pragma once
// Tensor files: safetensors (for weights that travel to and from Python) and ltrain's own
// checkpoint container (a magic number, a version, a JSON header, raw tensor bytes and a CRC-32
// over everything, so truncation and bit flips are caught). Both are written to a temporary file
// in the same folder, flushed, and renamed, so a reader never sees a half-written file.
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "ltrain/core/named_tensors.h"

namespace ltrain::io {

/// Writes `tensors` (any device; copied to the CPU, contiguous) as a safetensors file with
/// string `metadata` in its "__metadata__" entry.
void write_safetensors(const std::filesystem::path& file, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads a safetensors file into CPU tensors, in file order. DataError naming the file when it is
/// not a well-formed safetensors file.
NamedTensors read_safetensors(const std::filesystem::path& file, std::map<std::string, std::string>* metadata = nullptr);

/// ltrain's checkpoint container: free-form JSON `info` plus named tensors.
struct TensorArchive {
  nlohmann::json info = nlohmann::json::object();
  NamedTensors tensors;
};

/// Current version of the checkpoint container; readers refuse newer ones.
constexpr uint32_t kArchiveVersion = 1;

/// Writes `archive` atomically (temporary file, fsync, rename). RunError when the disk refuses.
void write_archive(const std::filesystem::path& file, const TensorArchive& archive);

/// Reads and verifies an archive. DataError naming the file when it is not an ltrain checkpoint,
/// is from a newer ltrain, is truncated or fails its checksum.
TensorArchive read_archive(const std::filesystem::path& file);

/// CRC-32 (the zlib polynomial) of `size` bytes, continuing from `crc` (0 to start).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace ltrain::io
