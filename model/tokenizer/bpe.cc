#include "model/tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include <nlohmann/json.hpp>

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Build(const nlohmann::json& model, BpeData data) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return InvalidArgumentError("model: missing object \"vocab\"");
  }
  int64_t max_id = -1;
  m->vocab_.reserve(data.vocab.size() * 2);
  for (auto& [token, id] : data.vocab) {
    if (id < 0 || id > (1 << 30)) {
      return InvalidArgumentError("model.vocab: id " + std::to_string(id) + " of token \"" + token +
                                  "\" out of range");
    }
    max_id = std::max(max_id, id);
    m->vocab_[std::move(token)] = static_cast<int32_t>(id);
  }
  if (max_id + 1 > static_cast<int64_t>(m->vocab_.size()) * 4 + 1024) {
    return InvalidArgumentError("model.vocab: ids are too sparse (max id " + std::to_string(max_id) +
                                " for " + std::to_string(m->vocab_.size()) + " tokens)");
  }
  m->id_to_token_.resize(max_id + 1);
  m->has_id_.assign(max_id + 1, false);
  for (const auto& [tok, id] : m->vocab_) {
    m->id_to_token_[id] = tok;
    m->has_id_[id] = true;
  }

  auto str_opt = [&](const char* key) -> std::optional<std::string> {
    if (model.contains(key) && model[key].is_string()) return model[key].get<std::string>();
    return std::nullopt;
  };
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0) {
    return InvalidArgumentError("model: BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto v = str_opt(key);
    if (v && !v->empty()) return InvalidArgumentError(std::string("model: non-empty ") + key + " is not supported");
  }
  if (auto unk = str_opt("unk_token")) {
    auto it = m->vocab_.find(*unk);
    if (it == m->vocab_.end()) return InvalidArgumentError("model: unk_token \"" + *unk + "\" is not in the vocab");
    m->unk_id_ = it->second;
  }
  auto flag = [&](const char* key) { return model.contains(key) && model[key].is_boolean() && model[key].get<bool>(); };
  m->byte_fallback_ = flag("byte_fallback");
  m->fuse_unk_ = flag("fuse_unk");
  m->ignore_merges_ = flag("ignore_merges");
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->vocab_.find(name);
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
  }

  if (!model.contains("merges") || !model["merges"].is_array()) {
    return InvalidArgumentError("model: missing array \"merges\"");
  }
  m->merges_.reserve(data.merges.size() * 2);
  std::string joined;
  for (size_t rank = 0; rank < data.merges.size(); ++rank) {
    const auto& [left, right] = data.merges[rank];
    auto l = m->vocab_.find(left);
    auto r = m->vocab_.find(right);
    if (l == m->vocab_.end() || r == m->vocab_.end()) {
      return InvalidArgumentError("model.merges[" + std::to_string(rank) + "]: token \"" +
                                  (l == m->vocab_.end() ? left : right) + "\" is not in the vocab");
    }
    joined.assign(left).append(right);
    auto merged = m->vocab_.find(joined);
    if (merged == m->vocab_.end()) {
      return InvalidArgumentError("model.merges[" + std::to_string(rank) + "]: merged token \"" + left + right +
                                  "\" is not in the vocab");
    }
    // The first (lowest-rank) occurrence of a pair wins, as in Hugging Face tokenizers.
    m->merges_.emplace(PairKey(l->second, r->second), std::make_pair(static_cast<int32_t>(rank), merged->second));
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()) || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> out;
  MergeWord(word, &out);
  ids->insert(ids->end(), out.begin(), out.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(out));
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* ids) const {
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  auto add = [&](int32_t id) {
    int idx = static_cast<int>(syms.size());
    syms.push_back({id, idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
  };
  // Pending unknown run: HF adds the unk token lazily so that fuse_unk can merge runs.
  bool pending_unk = false;
  std::string ch;
  for (size_t pos = 0; pos < word.size();) {
    size_t len;
    DecodeUtf8(word, pos, &len);
    ch.assign(word.substr(pos, len));
    pos += len;
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      if (pending_unk) {
        add(*unk_id_);
        pending_unk = false;
      }
      add(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        if (pending_unk) {
          add(*unk_id_);
          pending_unk = false;
        }
        for (char c : ch) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) add(*unk_id_);
      pending_unk = true;
    }
  }
  if (pending_unk) add(*unk_id_);
  if (syms.empty()) return;

  using Entry = std::pair<int32_t, int>;  // (rank, left position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  auto push_pair = [&](int left) {
    if (left < 0 || syms[left].next < 0) return;
    auto it = merges_.find(PairKey(syms[left].id, syms[syms[left].next].id));
    if (it != merges_.end()) queue.push({it->second.first, left});
  };
  for (int i = 0; i + 1 < static_cast<int>(syms.size()); ++i) push_pair(i);
  while (!queue.empty()) {
    auto [rank, left] = queue.top();
    queue.pop();
    Symbol& l = syms[left];
    if (l.id < 0 || l.next < 0) continue;
    auto it = merges_.find(PairKey(l.id, syms[l.next].id));
    if (it == merges_.end() || it->second.first != rank) continue;
    int right = l.next;
    l.id = it->second.second;
    l.next = syms[right].next;
    if (l.next >= 0) syms[l.next].prev = left;
    syms[right].id = -1;
    push_pair(l.prev);
    push_pair(left);
  }
  for (int i = 0; i >= 0; i = syms[i].next) ids->push_back(syms[i].id);
}

}  // namespace icecache::tokenizer
