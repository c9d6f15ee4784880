#include "decode_worker/prefix_cache.h"

#include <algorithm>

#include "kvstore/block_hash.h"

namespace icecache::decode {

PrefixMatch PrefixCache::Find(std::string_view salt, std::span<const int32_t> tokens, bool indexed) {
  const std::vector<uint64_t> hashes = kvstore::BlockHashes(tokens, block_tokens_, salt);
  PrefixMatch best;
  List::iterator best_it = lru_.end();
  // Deepest block first: the first hash present names the longest shared chain.
  for (size_t b = hashes.size(); b-- > 0 && best.entry == nullptr;) {
    auto found = by_hash_.find(hashes[b]);
    if (found == by_hash_.end()) continue;
    for (List::iterator it : found->second) {
      RetainedPrefix& e = *it;
      if (e.indexed != indexed || e.salt != salt) continue;
      // Compare the tokens themselves (a hash collision shares nothing), then go on past the
      // shared blocks inside the next one.
      const size_t limit = std::min(e.tokens.size(), tokens.size());
      size_t n = 0;
      while (n < limit && e.tokens[n] == tokens[n]) ++n;
      if (n < (b + 1) * static_cast<size_t>(block_tokens_)) continue;
      // Ties: the list order (most recently used first) decides.
      if (best.entry == nullptr || static_cast<int64_t>(n) > best.tokens ||
          (static_cast<int64_t>(n) == best.tokens &&
           std::distance(lru_.begin(), it) < std::distance(lru_.begin(), best_it))) {
        best = {&e, static_cast<int64_t>(n)};
        best_it = it;
      }
    }
  }
  if (best.entry != nullptr) lru_.splice(lru_.begin(), lru_, best_it);  // iterators stay valid
  return best;
}

std::unique_ptr<kvstore::SequenceCache> PrefixCache::Take(RetainedPrefix* e) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (&*it != e) continue;
    std::unique_ptr<kvstore::SequenceCache> cache = std::move(it->cache);
    Remove(it);
    return cache;
  }
  return nullptr;
}

void PrefixCache::Add(std::string salt, std::vector<int32_t> tokens, std::unique_ptr<kvstore::SequenceCache> cache,
                      bool indexed) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    const bool subsumed = it->pins == 0 && it->salt == salt && it->indexed == indexed &&
                          it->tokens.size() <= tokens.size() &&
                          std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin());
    if (subsumed) {
      auto next = std::next(it);
      Remove(it);
      it = next;
    } else {
      ++it;
    }
  }
  RetainedPrefix e;
  e.hashes = kvstore::BlockHashes(tokens, block_tokens_, salt);
  e.salt = std::move(salt);
  e.tokens = std::move(tokens);
  e.pages = cache->pages_held();
  e.cache = std::move(cache);
  e.indexed = indexed;
  pages_ += e.pages;
  lru_.push_front(std::move(e));
  Index(lru_.begin());
}

int64_t PrefixCache::Evict(int64_t pages) {
  int64_t freed = 0;
  for (auto it = lru_.end(); freed < pages && it != lru_.begin();) {
    --it;
    if (it->pins > 0) continue;
    freed += it->pages;
    ++evictions_;
    auto victim = it;
    it = std::next(it);
    Remove(victim);
  }
  return freed;
}

void PrefixCache::Index(List::iterator it) {
  for (uint64_t h : it->hashes) by_hash_[h].push_back(it);
}

void PrefixCache::Remove(List::iterator it) {
  for (uint64_t h : it->hashes) {
    auto found = by_hash_.find(h);
    if (found == by_hash_.end()) continue;
    std::erase(found->second, it);
    if (found->second.empty()) by_hash_.erase(found);
  }
  pages_ -= it->pages;
  lru_.erase(it);  // the cache (if still there) frees its pages
}

}  // namespace icecache::decode
