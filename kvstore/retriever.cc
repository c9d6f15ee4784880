#include "kvstore/retriever.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_set>

namespace icecache::kvstore {

std::vector<int32_t> MergeRankByRank(const std::vector<std::vector<ScoredLeaf>>& lists, int k) {
  std::vector<int32_t> out;
  out.reserve(std::max(k, 0));
  std::unordered_set<int32_t> seen;
  // Budgets are a few dozen pages: a linear scan of `out` beats hashing until k is large.
  const bool linear = k <= 64;
  auto first_time = [&](int32_t leaf) {
    if (linear) return std::find(out.begin(), out.end(), leaf) == out.end();
    return seen.insert(leaf).second;
  };
  size_t longest = 0;
  for (const auto& l : lists) longest = std::max(longest, l.size());
  for (size_t r = 0; r < longest && static_cast<int>(out.size()) < k; ++r) {
    for (const auto& l : lists) {
      if (r < l.size() && first_time(l[r].leaf)) {
        out.push_back(l[r].leaf);
        if (static_cast<int>(out.size()) == k) break;
      }
    }
  }
  return out;
}

float QuestBound(const float* q, const float* bounds, int head_dim) {
  const float* lo = bounds;
  const float* hi = bounds + head_dim;
  float s = 0.f;
  for (int c = 0; c < head_dim; ++c) s += std::max(q[c] * lo[c], q[c] * hi[c]);
  return s;
}

namespace {

// Token-order (Quest) layout: sink, then the middle pages, then window.
Status SelectTokenOrder(const RetrievalPolicy& policy, const SequenceCache& seq, int layer, int kv_head,
                        const float* q_group, int group, std::vector<int32_t>* ids, std::vector<int32_t>* valid,
                        std::vector<int32_t>* leaves) {
  auto push = [&](int32_t id, int v) {
    ids->push_back(id);
    valid->push_back(v);
    leaves->push_back(-1);
  };
  const auto& sink = seq.sink_pages(layer, kv_head);
  const auto& window = seq.window_pages(layer, kv_head);
  const auto& middle = seq.middle_pages(layer, kv_head);
  for (size_t i = 0; i < sink.size(); ++i) push(sink[i], seq.sink_valid(i));
  const int np = static_cast<int>(middle.size());
  const int k = std::max(0, policy.budget_pages - static_cast<int>(sink.size()) - static_cast<int>(window.size()));
  if (policy.mode == RetrievalMode::kFull || k >= np) {
    for (int i = 0; i < np; ++i) push(middle[i], seq.middle_valid(i));
  } else if (k > 0) {
    if (q_group == nullptr) return InvalidArgumentError("Retriever: query is required for sparse retrieval");
    const int d = seq.pool()->head_dim();
    const float* bounds = seq.middle_bounds(layer, kv_head).data();
    thread_local std::vector<std::vector<ScoredLeaf>> lists;
    lists.resize(group);
    for (int j = 0; j < group; ++j) {
      std::vector<ScoredLeaf>& l = lists[j];
      l.resize(np);
      for (int i = 0; i < np; ++i) l[i] = {i, QuestBound(q_group + static_cast<size_t>(j) * d, bounds + static_cast<size_t>(i) * 2 * d, d)};
      auto better = [](const ScoredLeaf& a, const ScoredLeaf& b) { return a.score > b.score || (a.score == b.score && a.leaf < b.leaf); };
      std::partial_sort(l.begin(), l.begin() + k, l.end(), better);
      l.resize(k);
    }
    std::vector<int32_t> chosen = MergeRankByRank(lists, k);
    std::sort(chosen.begin(), chosen.end());  // position order, as the pages lie
    for (int32_t i : chosen) push(middle[i], seq.middle_valid(i));
  }
  for (size_t i = 0; i < window.size(); ++i) push(window[i], seq.window_valid(i));
  return Status::Ok();
}

}  // namespace

Status Retriever::SelectHead(const RetrievalPolicy& policy, const SequenceCache& seq, int layer, int kv_head,
                             const float* q_group, int group, std::vector<int32_t>* ids, std::vector<int32_t>* valid,
                             std::vector<int32_t>* leaves) {
  auto push = [&](int32_t id, int v, int32_t leaf) {
    ids->push_back(id);
    valid->push_back(v);
    leaves->push_back(leaf);
  };
  if (seq.IsDense(layer)) {
    const auto& d = seq.dense_pages(layer, kv_head);
    for (size_t i = 0; i < d.size(); ++i) push(d[i], seq.dense_valid(i), -1);
    return Status::Ok();
  }
  if (seq.token_order() != (policy.mode == RetrievalMode::kQuest) && policy.mode != RetrievalMode::kFull) {
    return InvalidArgumentError(seq.token_order()
                                    ? "Retriever: a token-order (Quest layout) cache serves modes full and quest only"
                                    : "Retriever: mode quest needs a token-order cache (SparseLayout::kTokenOrder)");
  }
  if (seq.token_order()) return SelectTokenOrder(policy, seq, layer, kv_head, q_group, group, ids, valid, leaves);
  const auto& sink = seq.sink_pages(layer, kv_head);
  const auto& window = seq.window_pages(layer, kv_head);
  for (size_t i = 0; i < sink.size(); ++i) push(sink[i], seq.sink_valid(i), -1);
  const DciTree* tree = seq.tree(layer, kv_head);
  const int payload = seq.PayloadOf(layer);
  if (tree != nullptr && tree->num_leaves() > 0) {
    const int k = std::max(0, policy.budget_pages - static_cast<int>(sink.size()) - static_cast<int>(window.size()));
    if (policy.mode == RetrievalMode::kFull || k >= tree->num_leaves()) {
      for (int32_t leaf = 0; leaf < tree->num_leaves(); ++leaf) push(tree->leaf_page(leaf, payload), tree->leaf_valid(leaf), leaf);
    } else if (k > 0) {
      if (q_group == nullptr) return InvalidArgumentError("Retriever: query is required for sparse retrieval");
      thread_local std::vector<std::vector<ScoredLeaf>> lists;
      lists.resize(group);
      if (policy.mode == RetrievalMode::kOracle) {
        for (int j = 0; j < group; ++j) tree->Oracle(q_group + static_cast<size_t>(j) * seq.pool()->head_dim(), k, &lists[j]);
      } else {
        tree->QueryGroup(q_group, group, k, &lists);
      }
      for (int32_t leaf : MergeRankByRank(lists, k)) push(tree->leaf_page(leaf, payload), tree->leaf_valid(leaf), leaf);
    }
  }
  for (size_t i = 0; i < window.size(); ++i) push(window[i], seq.window_valid(i), -1);
  return Status::Ok();
}

Status Retriever::Select(const std::vector<const SequenceCache*>& seqs, int layer, const float* q, int num_q_heads,
                         PageSelection* out, const PageSelection* leader) const {
  return SelectBatch(seqs, std::vector<RetrievalPolicy>(seqs.size(), policy_), layer, q, num_q_heads, out, leader);
}

Status Retriever::SelectBatch(const std::vector<const SequenceCache*>& seqs, const std::vector<RetrievalPolicy>& policies,
                              int layer, const float* q, int num_q_heads, PageSelection* out,
                              const PageSelection* leader) const {
  if (policies.size() != seqs.size()) return InvalidArgumentError("Retriever: one policy per sequence required");
  for (const RetrievalPolicy& p : policies) {
    if (p.budget_pages < 1) return InvalidArgumentError("Retriever: budget_pages must be >= 1");
  }
  const int batch = static_cast<int>(seqs.size());
  out->batch = batch;
  out->page_indptr.assign(1, 0);
  out->page_ids.clear();
  out->page_valid.clear();
  out->tree_leaf.clear();
  out->unit_seconds.assign(static_cast<size_t>(batch) * (batch > 0 ? seqs[0]->options().num_kv_heads : 0), 0.0);
  if (batch == 0) {
    out->num_kv_heads = 0;
    return Status::Ok();
  }
  const SequenceCache& s0 = *seqs[0];
  const int nkv = s0.options().num_kv_heads, head_dim = s0.pool()->head_dim();
  out->num_kv_heads = nkv;
  for (const SequenceCache* s : seqs) {
    if (s == nullptr) return InvalidArgumentError("Retriever: null sequence in batch");
    if (s->options().num_kv_heads != nkv || s->options().num_layers != s0.options().num_layers ||
        s->pool()->head_dim() != head_dim)
      return InvalidArgumentError("Retriever: sequences in a batch must share the model shape");
  }
  if (layer < 0 || layer >= s0.options().num_layers)
    return InvalidArgumentError("Retriever: layer " + std::to_string(layer) + " out of range");
  if (num_q_heads < nkv || num_q_heads % nkv != 0)
    return InvalidArgumentError("Retriever: num_q_heads (" + std::to_string(num_q_heads) + ") must be a multiple of num_kv_heads (" +
                                std::to_string(nkv) + ")");
  const int group = num_q_heads / nkv;
  const int units = batch * nkv;
  std::vector<std::vector<int32_t>> ids(units), valid(units), leaves(units);
  std::mutex mu;
  Status first;
  auto fail = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first.ok()) first = s;
  };
  // ICE(r) followers (per sequence: a batch may mix dense-only and sparse sequences) reuse the
  // leader layer's selection, which must be the same for all of them.
  auto is_follower = [layer](const SequenceCache& c) { return !c.IsDense(layer) && c.LeaderOf(layer) != layer; };
  int leader_layer = -1;
  for (const SequenceCache* s : seqs) {
    if (!is_follower(*s)) continue;
    if (leader_layer >= 0 && s->LeaderOf(layer) != leader_layer)
      return InvalidArgumentError("Retriever: the batch's sequences have different ICE(r) leaders for layer " +
                                  std::to_string(layer));
    leader_layer = s->LeaderOf(layer);
  }
  if (leader_layer >= 0) {
    if (leader == nullptr)
      return FailedPreconditionError("Retriever: layer " + std::to_string(layer) + " is an ICE(r) follower of layer " +
                                     std::to_string(leader_layer) + "; pass the leader's selection");
    if (leader->batch != batch || leader->num_kv_heads != nkv ||
        leader->page_indptr.size() != static_cast<size_t>(units) + 1)
      return InvalidArgumentError("Retriever: leader selection shape does not match the batch");
  }
  auto task = [&](size_t u) {
    const int b = static_cast<int>(u / nkv), g = static_cast<int>(u % nkv);
    const SequenceCache& seq = *seqs[b];
    if (!is_follower(seq)) {
      const auto t0 = std::chrono::steady_clock::now();
      const float* qg = q == nullptr ? nullptr : q + (static_cast<size_t>(b) * num_q_heads + static_cast<size_t>(g) * group) * head_dim;
      Status s = SelectHead(policies[b], seq, layer, g, qg, group, &ids[u], &valid[u], &leaves[u]);
      if (!s.ok()) fail(s);
      out->unit_seconds[u] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
    // Follower: own sink pages, the leader's leaves in this layer's payload, own window pages.
    const int payload = seq.PayloadOf(layer);
    const DciTree* tree = seq.tree(layer, g);
    const auto& sink = seq.sink_pages(layer, g);
    const auto& window = seq.window_pages(layer, g);
    for (size_t i = 0; i < sink.size(); ++i) {
      ids[u].push_back(sink[i]);
      valid[u].push_back(seq.sink_valid(i));
      leaves[u].push_back(-1);
    }
    for (int32_t e = leader->page_indptr[u]; e < leader->page_indptr[u + 1]; ++e) {
      const int32_t leaf = leader->tree_leaf[e];
      if (leaf < 0) continue;
      if (tree == nullptr || leaf >= tree->num_leaves()) {
        fail(InvalidArgumentError("Retriever: leader selection names a leaf the tree does not have"));
        return;
      }
      ids[u].push_back(tree->leaf_page(leaf, payload));
      valid[u].push_back(tree->leaf_valid(leaf));
      leaves[u].push_back(leaf);
    }
    for (size_t i = 0; i < window.size(); ++i) {
      ids[u].push_back(window[i]);
      valid[u].push_back(seq.window_valid(i));
      leaves[u].push_back(-1);
    }
  };
  int64_t tree_tokens = 0;
  for (int u = 0; u < units; ++u) {
    const SequenceCache& seq = *seqs[u / nkv];
    const DciTree* t = seq.IsDense(layer) || is_follower(seq) ? nullptr : seq.tree(layer, u % nkv);
    if (t != nullptr) tree_tokens += t->size();
  }
  if (threads_ != nullptr && units > 1) {
    threads_->ParallelFor(0, units, task);
  } else {
    const bool parallel = units > 1 && tree_tokens >= kParallelSelectTokens;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int u = 0; u < units; ++u) task(u);
  }
  ICE_RETURN_IF_ERROR(first);
  for (int u = 0; u < units; ++u) {
    out->page_ids.insert(out->page_ids.end(), ids[u].begin(), ids[u].end());
    out->page_valid.insert(out->page_valid.end(), valid[u].begin(), valid[u].end());
    out->tree_leaf.insert(out->tree_leaf.end(), leaves[u].begin(), leaves[u].end());
    out->page_indptr.push_back(static_cast<int32_t>(out->page_ids.size()));
  }
  return Status::Ok();
}

}  // namespace icecache::kvstore
