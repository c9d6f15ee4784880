// The router's index of which decode worker holds which prefix blocks (KV-aware routing, as
// Dynamo's KV router scores workers by cached-prefix overlap): the chained block hashes
// (kvstore/block_hash.h) of every sequence that ended on a worker, which that worker keeps as a
// retained prefix until it needs the pages. The index is a hint the worker confirms: Reserve
// answers how many tokens it really reuses, and a worker that no longer holds a prefix (evicted,
// restarted) has those blocks forgotten here. Bounded: the least recently used blocks go first.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace icecache::router {

struct PrefixHolder {
  std::string worker;  // "" when no worker holds a block of the prompt
  int64_t tokens = 0;  // leading tokens (whole blocks) it holds
};

class PrefixIndex {
 public:
  PrefixIndex(int block_tokens, size_t max_blocks) : block_tokens_(block_tokens), max_blocks_(max_blocks) {}

  // `worker` holds the KV of `tokens` under `salt` now.
  void Record(const std::string& worker, std::string_view salt, std::span<const int32_t> tokens);
  // The worker holding the most leading blocks of `tokens` (the deepest block recorded; a later
  // record of a block moves it to the worker that recorded it).
  PrefixHolder Lookup(std::string_view salt, std::span<const int32_t> tokens) const;
  // `worker` does not hold these blocks of `tokens` (its Reserve reused fewer).
  void Forget(const std::string& worker, std::string_view salt, std::span<const int32_t> tokens);
  size_t size() const;

 private:
  struct Block {
    std::string worker;
    std::list<uint64_t>::iterator lru;
  };
  const int block_tokens_;
  const size_t max_blocks_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Block> blocks_;  // guarded by mu_
  std::list<uint64_t> lru_;                     // guarded by mu_: most recent first
};

// The isolation salt of a request: a SHA-256 digest (hex) of its API key and cache_salt, so that
// requests of different keys or salts never share a prefix and no key leaves the router.
std::string PrefixSalt(std::string_view api_key, std::string_view cache_salt);

}  // namespace icecache::router
