// Retained KV prefixes of a decode worker: sequences that ended stay in the page pool, indexed by
// the chained hashes of their token blocks (kvstore/block_hash.h, one block per page of tokens,
// salted so that requests of different API keys or cache_salt values never share), until
// admission needs their pages (LRU over entries no reservation holds) or a request takes them.
//
// The copy-on-write rule: a retained entry is read-only. A request that reuses one either takes
// it (its tokens are all a prefix of the request's, and no other reservation holds it: the
// sequence's pages and trees become the request's, which appends to them and grows the trees by
// insertion, and the entry leaves the store), or copies the prefix it shares into pages and trees
// of its own (kvstore::SequenceCache::ClonePrefix) while the entry stays for others. So no page
// or tree is ever written while another sequence can read it, and one request's insertions never
// change what another sees. When the request ends, its own sequence is retained in turn.
//
// Not thread-safe: the decode engine guards it with its mutex. Entries handed out by Find stay
// valid while pinned (Pin/Unpin); Take and eviction never remove a pinned entry.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvstore/sequence_cache.h"

namespace icecache::decode {

struct RetainedPrefix {
  std::string salt;
  std::vector<int32_t> tokens;  // the tokens whose KV the cache holds, in order
  std::vector<uint64_t> hashes;  // kvstore::BlockHashes(tokens, page_size, salt)
  std::unique_ptr<kvstore::SequenceCache> cache;
  bool indexed = false;  // the cache has sparse layers (trees): it serves sparse budgets only
  int64_t pages = 0;
  int pins = 0;  // reservations that will reuse it
};

struct PrefixMatch {
  RetainedPrefix* entry = nullptr;  // null: no match
  int64_t tokens = 0;               // tokens of the request whose KV the entry holds
};

struct PrefixCacheStats {
  int64_t entries = 0;
  int64_t pages = 0;      // pages held by retained entries
  int64_t evictions = 0;  // cumulative
};

class PrefixCache {
 public:
  explicit PrefixCache(int block_tokens) : block_tokens_(block_tokens) {}

  // The entry sharing the longest prefix with `tokens` under `salt` (at least one full block),
  // among those whose `indexed` equals `indexed`; ties go to the most recently used. The match
  // is counted in tokens and may end inside a block (tokens are compared one by one after the
  // hashes agree). Marks the entry used.
  PrefixMatch Find(std::string_view salt, std::span<const int32_t> tokens, bool indexed);
  void Pin(RetainedPrefix* e) { ++e->pins; }
  void Unpin(RetainedPrefix* e) { --e->pins; }
  // Removes a pinned entry and returns its cache. REQUIRES e->pins == 1 (the caller's own pin).
  std::unique_ptr<kvstore::SequenceCache> Take(RetainedPrefix* e);
  // Adds a sequence that ended. An unpinned entry of the same salt whose tokens are a prefix of
  // `tokens` is dropped (the new one serves every request it served).
  void Add(std::string salt, std::vector<int32_t> tokens, std::unique_ptr<kvstore::SequenceCache> cache, bool indexed);
  // Evicts least recently used unpinned entries until at least `pages` pages were freed or none
  // is left; returns the pages freed.
  int64_t Evict(int64_t pages);
  PrefixCacheStats stats() const { return {static_cast<int64_t>(lru_.size()), pages_, evictions_}; }

 private:
  using List = std::list<RetainedPrefix>;
  void Index(List::iterator it);
  void Remove(List::iterator it);

  const int block_tokens_;
  List lru_;  // most recently used first
  // Block hash -> the entries that hold that block chain.
  std::unordered_map<uint64_t, std::vector<List::iterator>> by_hash_;
  int64_t pages_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace icecache::decode
