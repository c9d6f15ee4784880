#include "kvstore/block_hash.h"

namespace icecache::kvstore {
namespace {

// splitmix64's finaliser: every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

std::vector<uint64_t> BlockHashes(std::span<const int32_t> tokens, int block_tokens, std::string_view salt) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (unsigned char c : salt) h = Mix(h ^ c);
  h = Mix(h ^ salt.size());
  std::vector<uint64_t> out;
  const size_t block = static_cast<size_t>(block_tokens);
  out.reserve(tokens.size() / block);
  for (size_t b = 0; (b + 1) * block <= tokens.size(); ++b) {
    for (size_t i = b * block; i < (b + 1) * block; ++i) h = Mix(h ^ static_cast<uint32_t>(tokens[i]));
    out.push_back(h);
  }
  return out;
}

}  // namespace icecache::kvstore
