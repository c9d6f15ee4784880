#include "bench/kv_methods.h"

#include <cstdio>
#include <sstream>

#include "kvstore/sequence_cache.h"
#include "model/dense_kv_cache.h"

namespace icecache::bench {

Status ValidateKvMethod(const KvMethod& m, const KvLayout& layout) {
  if (m.name == "full") return Status::Ok();
  int min_pages;
  if (m.name == "window") {
    min_pages = layout.sink_pages + 1;
  } else if (m.name == "icecache" || m.name == "oracle" || m.name == "quest") {
    min_pages = layout.sink_pages + layout.window_pages + 1;
  } else {
    return InvalidArgumentError("unknown method '" + m.name + "' (known: " + kKvMethodNames + ")");
  }
  if (m.budget_pages < min_pages) {
    return InvalidArgumentError("budget of " + std::to_string(m.budget_pages) + " pages for " + m.name + " must be >= " +
                                std::to_string(min_pages) + " (sink " + std::to_string(layout.sink_pages) +
                                (m.name == "window" ? "" : " + window " + std::to_string(layout.window_pages)) +
                                " + at least one more page)");
  }
  if (m.name == "quest" && m.ice_group != 1) return InvalidArgumentError("quest has no ICE(r) groups (--ice-group 1)");
  return Status::Ok();
}

StatusOr<PrefillKv> PrefillDense(model::Model& m, std::span<const int32_t> ids, std::vector<float>* logits) {
  const auto shape = m.attention_shape();
  PrefillKv out;
  out.n = static_cast<int64_t>(ids.size());
  out.k.resize(shape.num_layers);
  out.v.resize(shape.num_layers);
  model::DenseKvCache dense(shape);
  std::vector<float> scratch;
  model::SequenceInput in{0, ids};
  ICE_RETURN_IF_ERROR(dense.AddSequence(0));
  ICE_RETURN_IF_ERROR(m.Forward({&in, 1}, dense, model::LogitsMode::kLastToken, logits ? logits : &scratch));
  const size_t row = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
  for (int l = 0; l < shape.num_layers; ++l) {
    out.k[l].resize(out.n * row);
    out.v[l].resize(out.n * row);
    ICE_RETURN_IF_ERROR(dense.ReadLayerKv(0, l, out.k[l].data(), out.v[l].data()));
  }
  return out;
}

StatusOr<std::unique_ptr<kvstore::PagePool>> MakeMethodPool(const model::AttentionShape& shape, const KvLayout& layout,
                                                           int64_t tokens) {
  kvstore::PagePoolOptions po;
  po.page_size = layout.page_size;
  po.head_dim = shape.head_dim;
  po.dtype = layout.dtype;
  // Tree leaves are not all full pages: room for 3x the dense page count.
  po.num_pages = 3 * (tokens / layout.page_size + 4) * shape.num_layers * shape.num_kv_heads + 256;
  return kvstore::PagePool::Create(po);
}

StatusOr<std::unique_ptr<decode::IceCacheBackend>> ImportMethod(model::Model& m, kvstore::PagePool* pool,
                                                                const PrefillKv& kv, const KvMethod& method,
                                                                const KvLayout& layout, int64_t* fov) {
  ICE_RETURN_IF_ERROR(ValidateKvMethod(method, layout));
  const auto shape = m.attention_shape();
  kvstore::SequenceCacheOptions o;
  o.num_layers = shape.num_layers;
  o.num_kv_heads = shape.num_kv_heads;
  o.dense_layers = layout.dense_layers;
  o.sink_pages = layout.sink_pages;
  o.window_pages = method.name == "window" ? method.budget_pages - layout.sink_pages : layout.window_pages;
  o.dci = method.dci;
  const bool quest = method.name == "quest";
  o.ice_group = quest ? 1 : method.ice_group;
  o.layout = quest ? kvstore::SparseLayout::kTokenOrder : kvstore::SparseLayout::kDciTree;
  ICE_ASSIGN_OR_RETURN(auto cache, kvstore::SequenceCache::Create(o, pool));
  std::vector<const float*> kp, vp;
  for (int l = 0; l < shape.num_layers; ++l) {
    kp.push_back(kv.k[l].data());
    vp.push_back(kv.v[l].data());
  }
  ICE_RETURN_IF_ERROR(cache->Build(kp.data(), vp.data(), kv.n));
  if (fov != nullptr) {
    const kvstore::DciTree* t = o.dense_layers < o.num_layers ? cache->tree(o.dense_layers, 0) : nullptr;
    *fov = t != nullptr ? t->FieldOfView() : 0;
  }
  const kvstore::RetrievalMode mode = method.name == "full"     ? kvstore::RetrievalMode::kFull
                                     : method.name == "oracle" ? kvstore::RetrievalMode::kOracle
                                     : quest                   ? kvstore::RetrievalMode::kQuest
                                                               : kvstore::RetrievalMode::kSparse;  // window: K = 0
  decode::IceCacheBackendOptions bo;
  bo.device = m.device();
  ICE_ASSIGN_OR_RETURN(auto be, decode::IceCacheBackend::Create(shape, pool, bo));
  // full: any budget above sink + window (kFull takes every page).
  const int budget = method.name == "full" ? o.sink_pages + o.window_pages + 1 : method.budget_pages;
  kvstore::RetrievalPolicy policy;
  policy.budget_pages = budget;
  policy.mode = mode;
  policy.merge = method.merge;
  policy.estimate_rest = TreeMethod(method.name) && method.estimate_rest;
  policy.rest_cells = method.rest_cells;
  ICE_RETURN_IF_ERROR(be->Import(0, std::move(cache), policy));
  return be;
}

Status DecodeStep(model::Model& m, model::AttentionBackend& be, int32_t tok, std::vector<float>* logits) {
  model::SequenceInput in{0, std::span<const int32_t>(&tok, 1)};
  return m.Forward({&in, 1}, be, model::LogitsMode::kLastToken, logits);
}

std::string MethodLabel(const KvMethod& m) {
  char buf[112];
  if (m.name == "full") {
    std::snprintf(buf, sizeof(buf), "full");
  } else if (m.fov_swept) {
    std::snprintf(buf, sizeof(buf), "%s b%d fov_min %d frac %g", m.name.c_str(), m.budget_pages, m.dci.fov_min,
                  m.dci.fov_fraction);
  } else {
    std::snprintf(buf, sizeof(buf), "%s b%d", m.name.c_str(), m.budget_pages);
  }
  std::string label = buf;
  // A merge other than the serving one is named (window selects nothing to merge).
  if (m.name != "full" && m.name != "window" && m.merge != kvstore::RetrievalPolicy{}.merge)
    label += std::string(" merge ") + kvstore::GroupMergeName(m.merge);
  // Likewise a rest estimate other than the serving one (tree methods only).
  if (TreeMethod(m.name) && m.estimate_rest != kvstore::RetrievalPolicy{}.estimate_rest)
    label += m.estimate_rest ? " rest on" : " rest off";
  if (TreeMethod(m.name) && m.estimate_rest && m.rest_cells != kvstore::RetrievalPolicy{}.rest_cells)
    label += " rest_cells " + std::to_string(m.rest_cells);
  return label;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) if (!t.empty()) out.push_back(t);
  return out;
}

StatusOr<std::vector<kvstore::GroupMerge>> ParseGroupMerges(const std::string& list) {
  std::vector<kvstore::GroupMerge> out;
  for (const std::string& name : Split(list)) {
    ICE_ASSIGN_OR_RETURN(kvstore::GroupMerge g, kvstore::GroupMergeNamed(name));
    out.push_back(g);
  }
  if (out.empty()) out.push_back(kvstore::RetrievalPolicy{}.merge);
  return out;
}

StatusOr<std::vector<bool>> ParseRestEstimates(const std::string& list) {
  std::vector<bool> out;
  for (const std::string& name : Split(list)) {
    if (name != "on" && name != "off") return InvalidArgumentError("'" + name + "' (known: on, off)");
    out.push_back(name == "on");
  }
  if (out.empty()) out.push_back(kvstore::RetrievalPolicy{}.estimate_rest);
  return out;
}

StatusOr<std::vector<std::pair<bool, int>>> ParseRestVariants(const std::string& estimates, const std::string& cells) {
  ICE_ASSIGN_OR_RETURN(std::vector<bool> on, ParseRestEstimates(estimates));
  std::vector<int> counts;
  for (const std::string& c : Split(cells)) {
    char* end = nullptr;
    const long v = std::strtol(c.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > (1 << 20)) return InvalidArgumentError("--rest-cells: '" + c + "' (integers >= 0)");
    counts.push_back(static_cast<int>(v));
  }
  if (counts.empty()) counts.push_back(kvstore::RetrievalPolicy{}.rest_cells);
  std::vector<std::pair<bool, int>> out;
  for (bool e : on) {
    if (!e) {
      out.push_back({false, kvstore::RetrievalPolicy{}.rest_cells});
      continue;
    }
    for (int c : counts) out.push_back({true, c});
  }
  return out;
}

StatusOr<kernels::DType> ParseKvDtype(const std::string& s) {
  if (s == "f32") return kernels::DType::kF32;
  if (s == "bf16") return kernels::DType::kBF16;
  if (s == "f16") return kernels::DType::kF16;
  return InvalidArgumentError("--kv-dtype: '" + s + "' (known: f32, bf16, f16)");
}

}  // namespace icecache::bench
