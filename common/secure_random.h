// Unpredictable bytes from the kernel's CSPRNG (getrandom(2)), for identifiers and tokens that a
// peer must not be able to guess (sequence ids, reservation tokens). Not for simulation or
// sampling: those use seeded engines.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace icecache {

// Fills `out[0, bytes)`. INTERNAL when the kernel cannot supply randomness (never on Linux >= 3.17
// once the pool is initialised; the call blocks until then).
[[nodiscard]] Status SecureRandomBytes(void* out, size_t bytes);

// A uniformly random 64-bit value that is never 0 (0 means "no id" on the wire).
StatusOr<uint64_t> SecureRandomId();

// `bytes` random bytes as a string (e.g. a 16-byte reservation token).
StatusOr<std::string> SecureRandomToken(size_t bytes = 16);

// Compares two secrets in time that depends only on their lengths.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace icecache
