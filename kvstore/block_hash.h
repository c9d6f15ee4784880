// Chained hashes of token blocks, the keys of retained KV prefixes (as vLLM keys its prefix
// cache): hash i covers the salt and tokens [0, (i + 1) * block_tokens), so two sequences share
// hash i exactly when (up to 64-bit collisions, which callers rule out by comparing tokens)
// they share the salt and their first i + 1 blocks. Only full blocks are hashed. The router and
// the decode workers compute the same hashes from the same function.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace icecache::kvstore {

// One hash per full block of `tokens` (tokens.size() / block_tokens of them). REQUIRES
// block_tokens >= 1.
std::vector<uint64_t> BlockHashes(std::span<const int32_t> tokens, int block_tokens, std::string_view salt);

}  // namespace icecache::kvstore
