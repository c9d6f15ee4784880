#include "kvstore/retriever.h"

#include "kvstore/vector_ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
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

StatusOr<GroupMerge> GroupMergeNamed(const std::string& name) {
  if (name == "rank") return GroupMerge::kRank;
  if (name == "mass") return GroupMerge::kMass;
  return InvalidArgumentError("unknown group merge '" + name + "' (rank or mass)");
}

const char* GroupMergeName(GroupMerge merge) { return merge == GroupMerge::kMass ? "mass" : "rank"; }

std::vector<int32_t> MergeByMass(const std::vector<std::vector<ScoredLeaf>>& lists, int k, float c,
                                 const float* fixed_logz) {
  struct Candidate {
    int32_t leaf;
    int32_t order;  // position in rank-by-rank order of its first occurrence
    float weight;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Head j's exp(c s - m_j) for each listed entry (entry r of list j at w[off[j] + r]), and its
  // Z_j relative to m_j: the fixed tokens plus its listed pages.
  thread_local std::vector<float> w;
  thread_local std::vector<size_t> off;
  w.clear();
  off.assign(lists.size(), 0);
  size_t longest = 0;
  for (size_t j = 0; j < lists.size(); ++j) {
    const auto& l = lists[j];
    longest = std::max(longest, l.size());
    off[j] = w.size();
    const float fixed = fixed_logz == nullptr ? kNegInf : fixed_logz[j];
    float m = fixed;
    for (const ScoredLeaf& e : l) m = std::max(m, c * e.score);
    if (!(m > kNegInf)) {  // nothing finite: the head's entries weigh 0
      w.insert(w.end(), l.size(), 0.f);
      continue;
    }
    float z = fixed > kNegInf ? std::exp(fixed - m) : 0.f;
    for (const ScoredLeaf& e : l) {
      w.push_back(std::exp(c * e.score - m));
      z += w.back();
    }
    const float inv = 1.f / z;
    for (size_t r = off[j]; r < w.size(); ++r) w[r] *= inv;
  }
  // One candidate per leaf in rank-by-rank order of first occurrence, its weights summed.
  thread_local std::vector<Candidate> all;
  all.clear();
  const bool linear = w.size() <= 128;  // budgets are a few dozen pages: a scan beats hashing
  thread_local std::unordered_map<int32_t, int32_t> at;
  at.clear();
  int32_t order = 0;
  for (size_t r = 0; r < longest; ++r) {
    for (size_t j = 0; j < lists.size(); ++j) {
      if (r >= lists[j].size()) continue;
      const int32_t leaf = lists[j][r].leaf;
      const float x = w[off[j] + r];
      int32_t i = -1;
      if (linear) {
        for (size_t t = 0; t < all.size(); ++t) {
          if (all[t].leaf == leaf) {
            i = static_cast<int32_t>(t);
            break;
          }
        }
      } else {
        auto [it, fresh] = at.emplace(leaf, static_cast<int32_t>(all.size()));
        if (!fresh) i = it->second;
      }
      if (i >= 0) {
        all[i].weight += x;
      } else {
        all.push_back({leaf, order, x});
      }
      ++order;
    }
  }
  const size_t take = std::min(all.size(), static_cast<size_t>(std::max(k, 0)));
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.order < b.order);
  };
  std::partial_sort(all.begin(), all.begin() + take, all.end(), better);
  std::vector<int32_t> out(take);
  for (size_t i = 0; i < take; ++i) out[i] = all[i].leaf;
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

float ScaleOf(const RetrievalPolicy& policy, int head_dim) {
  return policy.scale > 0.f ? policy.scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

// Whether a unit of `seq` in `layer` under `policy` gets a rest estimate (a tree layer retrieved
// sparsely; SelectHead's own test of whether every leaf was taken comes after).
bool EstimatesRest(const RetrievalPolicy& policy, const SequenceCache& seq, int layer) {
  return policy.estimate_rest && !seq.IsDense(layer) && !seq.token_order() &&
         (policy.mode == RetrievalMode::kSparse || policy.mode == RetrievalMode::kOracle);
}

// Head j's log sum of exp(c q_j . k) over the sink and window tokens of (layer, kv_head), for
// GroupMerge::kMass: out [group].
void FixedLogZ(const SequenceCache& seq, int layer, int kv_head, const float* q_group, int group, float c,
               std::vector<float>* out) {
  const PagePool& pool = *seq.pool();
  const int d = pool.head_dim();
  const auto& sink = seq.sink_pages(layer, kv_head);
  const auto& window = seq.window_pages(layer, kv_head);
  // Every fixed token's score for every head, head-major per page: [page][head][token].
  thread_local std::vector<float> scores;
  thread_local std::vector<int> counts;
  scores.clear();
  counts.clear();
  auto add = [&](int32_t page, int valid) {
    if (valid <= 0) return;
    const size_t at = scores.size();
    scores.resize(at + static_cast<size_t>(group) * valid);
    ScoreRowsMulti(pool.dtype(), pool.PageK(page), valid, d, q_group, group, scores.data() + at);
    counts.push_back(valid);
  };
  for (size_t i = 0; i < sink.size(); ++i) add(sink[i], seq.sink_valid(i));
  for (size_t i = 0; i < window.size(); ++i) add(window[i], seq.window_valid(i));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  out->assign(group, kNegInf);
  for (int j = 0; j < group; ++j) {
    float m = kNegInf;
    size_t at = 0;
    for (int v : counts) {
      const float* sj = scores.data() + at + static_cast<size_t>(j) * v;
      for (int t = 0; t < v; ++t) m = std::max(m, sj[t]);
      at += static_cast<size_t>(group) * v;
    }
    if (!(m > kNegInf)) continue;
    float z = 0.f;
    at = 0;
    for (int v : counts) {
      const float* sj = scores.data() + at + static_cast<size_t>(j) * v;
      for (int t = 0; t < v; ++t) z += std::exp(c * (sj[t] - m));
      at += static_cast<size_t>(group) * v;
    }
    (*out)[j] = c * m + std::log(z);
  }
}

// The policy's merge of a group's lists into at most k leaves.
std::vector<int32_t> MergeGroup(const RetrievalPolicy& policy, const SequenceCache& seq, int layer, int kv_head,
                                const float* q_group, int group, const std::vector<std::vector<ScoredLeaf>>& lists,
                                int k) {
  if (policy.merge == GroupMerge::kRank || group == 1) return MergeRankByRank(lists, k);
  const float c = ScaleOf(policy, seq.pool()->head_dim());
  thread_local std::vector<float> fixed;
  FixedLogZ(seq, layer, kv_head, q_group, group, c, &fixed);
  return MergeByMass(lists, k, c, fixed.data());
}

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
    std::vector<int32_t> chosen = MergeGroup(policy, seq, layer, kv_head, q_group, group, lists, k);
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
      for (int32_t leaf : MergeGroup(policy, seq, layer, kv_head, q_group, group, lists, k)) push(tree->leaf_page(leaf, payload), tree->leaf_valid(leaf), leaf);
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
  // The rest estimate's output, when any unit may have one.
  bool any_rest = false;
  for (int b = 0; b < batch && q != nullptr; ++b) any_rest = any_rest || EstimatesRest(policies[b], *seqs[b], layer);
  out->has_rest = false;
  out->rest_out.clear();
  out->rest_lse.clear();
  if (any_rest) {
    out->rest_out.assign(static_cast<size_t>(batch) * num_q_heads * head_dim, 0.f);
    out->rest_lse.assign(static_cast<size_t>(batch) * num_q_heads, -std::numeric_limits<float>::infinity());
  }
  std::atomic<bool> estimated{false};
  // The unit's estimate over the leaves it left out (none when it took every leaf).
  auto estimate = [&](int b, int g, const std::vector<int32_t>& unit_leaves) {
    const SequenceCache& seq = *seqs[b];
    if (!any_rest || !EstimatesRest(policies[b], seq, layer)) return;
    const DciTree* tree = seq.tree(layer, g);
    if (tree == nullptr) return;
    int taken = 0;
    for (int32_t leaf : unit_leaves) taken += leaf >= 0;
    if (taken >= tree->num_leaves()) return;
    const size_t row = static_cast<size_t>(b) * num_q_heads + static_cast<size_t>(g) * group;
    tree->EstimateRest(q + row * head_dim, group, ScaleOf(policies[b], head_dim), seq.PayloadOf(layer),
                       unit_leaves.data(), static_cast<int>(unit_leaves.size()), policies[b].rest_cells,
                       out->rest_out.data() + row * head_dim,
                       out->rest_lse.data() + row);
    estimated.store(true, std::memory_order_relaxed);
  };
  auto task = [&](size_t u) {
    const int b = static_cast<int>(u / nkv), g = static_cast<int>(u % nkv);
    const SequenceCache& seq = *seqs[b];
    if (!is_follower(seq)) {
      const auto t0 = std::chrono::steady_clock::now();
      const float* qg = q == nullptr ? nullptr : q + (static_cast<size_t>(b) * num_q_heads + static_cast<size_t>(g) * group) * head_dim;
      Status s = SelectHead(policies[b], seq, layer, g, qg, group, &ids[u], &valid[u], &leaves[u]);
      if (!s.ok()) fail(s);
      if (s.ok()) estimate(b, g, leaves[u]);
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
    estimate(b, g, leaves[u]);
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
    // Serial selections stay outside any parallel construct: libgomp reshapes its thread team
    // even for an `if (false)` region (a wake of sleeping threads: `icecache-bench omp-regions`).
    if (units > 1 && tree_tokens >= kParallelSelectTokens) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int u = 0; u < units; ++u) task(u);
    } else {
      for (int u = 0; u < units; ++u) task(u);
    }
  }
  ICE_RETURN_IF_ERROR(first);
  out->has_rest = estimated.load();
  if (!out->has_rest) {
    out->rest_out.clear();
    out->rest_lse.clear();
  }
  for (int u = 0; u < units; ++u) {
    out->page_ids.insert(out->page_ids.end(), ids[u].begin(), ids[u].end());
    out->page_valid.insert(out->page_valid.end(), valid[u].begin(), valid[u].end());
    out->tree_leaf.insert(out->tree_leaf.end(), leaves[u].begin(), leaves[u].end());
    out->page_indptr.push_back(static_cast<int32_t>(out->page_ids.size()));
  }
  return Status::Ok();
}

}  // namespace icecache::kvstore
