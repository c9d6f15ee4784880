#include "router/prefix_index.h"

#include <openssl/evp.h>

#include "kvstore/block_hash.h"

namespace icecache::router {

void PrefixIndex::Record(const std::string& worker, std::string_view salt, std::span<const int32_t> tokens) {
  const std::vector<uint64_t> hashes = kvstore::BlockHashes(tokens, block_tokens_, salt);
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t h : hashes) {
    auto it = blocks_.find(h);
    if (it != blocks_.end()) {
      it->second.worker = worker;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    lru_.push_front(h);
    blocks_[h] = Block{worker, lru_.begin()};
  }
  while (blocks_.size() > max_blocks_) {
    blocks_.erase(lru_.back());
    lru_.pop_back();
  }
}

PrefixHolder PrefixIndex::Lookup(std::string_view salt, std::span<const int32_t> tokens) const {
  const std::vector<uint64_t> hashes = kvstore::BlockHashes(tokens, block_tokens_, salt);
  PrefixHolder best;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t b = 0; b < hashes.size(); ++b) {
    auto it = blocks_.find(hashes[b]);
    if (it == blocks_.end()) break;
    best = {it->second.worker, static_cast<int64_t>(b + 1) * block_tokens_};
  }
  return best;
}

void PrefixIndex::Forget(const std::string& worker, std::string_view salt, std::span<const int32_t> tokens) {
  const std::vector<uint64_t> hashes = kvstore::BlockHashes(tokens, block_tokens_, salt);
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t h : hashes) {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || it->second.worker != worker) continue;
    lru_.erase(it->second.lru);
    blocks_.erase(it);
  }
}

size_t PrefixIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocks_.size();
}

std::string PrefixSalt(std::string_view api_key, std::string_view cache_salt) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const unsigned char zero = 0;
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, api_key.data(), api_key.size());
  EVP_DigestUpdate(ctx, &zero, 1);  // ("a", "bc") and ("ab", "c") differ
  EVP_DigestUpdate(ctx, cache_salt.data(), cache_salt.size());
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace icecache::router
