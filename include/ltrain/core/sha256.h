#pragma once
// SHA-256 (FIPS 180-4), to check data files against their published sums.
#include <cstddef>
#include <string>

namespace ltrain {

/// The SHA-256 digest of `size` bytes at `data`, as 64 lowercase hex digits (sha256sum's form).
std::string sha256_hex(const void* data, size_t size);

}  // namespace ltrain
