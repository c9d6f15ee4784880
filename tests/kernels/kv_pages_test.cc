// StoreKv / GatherKv / MergeToken / MergeStates / RepetitionPenalty on every backend against naive references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "kernels/kv_pages.h"
#include "kernels/sampling.h"
#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::RandomVector;
using testing::ToTyped;
using testing::Typed;

constexpr int kPage = 4, kDim = 40, kHeads = 3;

// Distinct slot ids over `pages` pages, shuffled, with a few negative (skipped) entries.
std::vector<int64_t> SlotIds(int n, int pages, uint32_t seed, bool allow_negative) {
  std::vector<int64_t> all(static_cast<size_t>(pages) * kPage);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  if (allow_negative) all[1] = all[n - 2] = -1;
  return all;
}

// PagedDecodeAttention over uploaded buffers of fp32 pages.
struct PagedShape {
  int batch, hq, hkv, hd, ps;
  float scale;
};
PagedDecodeAttentionParams PagedParams(const DeviceBuffer& pool, const DeviceBuffer& q, const DeviceBuffer& indptr,
                                       const DeviceBuffer& ids, const DeviceBuffer& valid, const DeviceBuffer& out,
                                       const DeviceBuffer& lse, const PagedShape& sh) {
  PagedDecodeAttentionParams a;
  a.q = q.as<float>();
  a.pages = pool.data();
  a.kv_dtype = DType::kF32;
  a.page_indptr = indptr.as<int32_t>();
  a.page_ids = ids.as<int32_t>();
  a.page_valid = valid.as<int32_t>();
  a.out = out.as<float>();
  a.lse = lse.as<float>();
  a.batch = sh.batch;
  a.num_q_heads = sh.hq;
  a.num_kv_heads = sh.hkv;
  a.head_dim = sh.hd;
  a.page_size = sh.ps;
  a.scale = sh.scale;
  return a;
}

class KvPagesOnBackend : public testing::BackendTest {};
ICE_INSTANTIATE_ON_BACKENDS(KvPagesOnBackend);

TEST_P(KvPagesOnBackend, StoreThenGatherRoundTripsThroughTheLayout) {
  const Backend b = GetParam();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int rows = 7, pages = 9;
    const size_t page_elems = 2 * kPage * kDim;
    const auto k = RandomVector(static_cast<size_t>(rows) * kHeads * kDim, 1);
    const auto v = RandomVector(k.size(), 2);
    const auto slots = SlotIds(rows * kHeads, pages, 3, /*allow_negative=*/true);
    // Naive: the layout of kernels/attention.h, values rounded to t.
    const Typed kt = ToTyped(t, k), vt = ToTyped(t, v);
    std::vector<float> pool_want(pages * page_elems, 0.f);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0) continue;
      const size_t page = slots[i] / kPage, slot = slots[i] % kPage;
      for (int d = 0; d < kDim; ++d) {
        pool_want[page * page_elems + slot * kDim + d] = kt.values[i * kDim + d];
        pool_want[page * page_elems + (kPage + slot) * kDim + d] = vt.values[i * kDim + d];
      }
    }
    auto dk = testing::Upload(b, k), dv = testing::Upload(b, v), ds = testing::Upload(b, slots);
    auto dpool = testing::Upload(b, ToTyped(t, std::vector<float>(pages * page_elems, 0.f)).bytes);
    StoreKvParams sp;
    sp.k = dk.as<float>();
    sp.v = dv.as<float>();
    sp.pages = dpool.data();
    sp.kv_dtype = t;
    sp.slot_ids = ds.as<int64_t>();
    sp.rows = rows;
    sp.num_heads = kHeads;
    sp.head_dim = kDim;
    sp.page_size = kPage;
    ASSERT_TRUE(StoreKv(sp, b).ok());
    auto bytes = testing::Download<uint8_t>(dpool, pool_want.size() * DTypeSize(t));
    std::vector<float> pool_got(pool_want.size());
    ConvertToF32(t, bytes.data(), pool_got.data(), pool_got.size());
    ExpectClose(pool_got, pool_want, 0, 0, "StoreKv layout");  // exact: the same rounding

    // Gather the stored slots back (negative ids dropped).
    std::vector<int64_t> back;
    std::vector<float> kw, vw;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0) continue;
      back.push_back(slots[i]);
      kw.insert(kw.end(), kt.values.begin() + i * kDim, kt.values.begin() + (i + 1) * kDim);
      vw.insert(vw.end(), vt.values.begin() + i * kDim, vt.values.begin() + (i + 1) * kDim);
    }
    auto db = testing::Upload(b, back);
    auto gk = testing::Upload(b, std::vector<float>(kw.size())), gv = testing::Upload(b, std::vector<float>(vw.size()));
    GatherKvParams gp;
    gp.pages = dpool.data();
    gp.kv_dtype = t;
    gp.slot_ids = db.as<int64_t>();
    gp.k = gk.as<float>();
    gp.v = gv.as<float>();
    gp.rows = static_cast<int>(back.size());
    gp.num_heads = 1;
    gp.head_dim = kDim;
    gp.page_size = kPage;
    ASSERT_TRUE(GatherKv(gp, b).ok());
    ExpectClose(testing::Download<float>(gk, kw.size()), kw, 0, 0, "GatherKv k");
    ExpectClose(testing::Download<float>(gv, vw.size()), vw, 0, 0, "GatherKv v");
  }
}

// Paged attention over the pages, merged with one extra token by MergeToken, equals softmax over
// the pages' slots plus that token (fp64 reference).
TEST_P(KvPagesOnBackend, MergeTokenEqualsAttentionOverPagesPlusTheToken) {
  const Backend b = GetParam();
  const int batch = 3, hq = 6, hkv = 2, hd = 32, ps = 4, pages = 6;
  const int group = hq / hkv;
  const auto pool = RandomVector(static_cast<size_t>(pages) * 2 * ps * hd, 4);
  const auto q = RandomVector(static_cast<size_t>(batch) * hq * hd, 5);
  const auto kn = RandomVector(static_cast<size_t>(batch) * hkv * hd, 6);
  const auto vn = RandomVector(kn.size(), 7);
  // (b, g) lists: sequence 0 none at all (the merge must give v_new), others two pages each.
  const std::vector<int32_t> indptr = {0, 0, 0, 2, 4, 6, 8};
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 1, 3};
  const std::vector<int32_t> valid = {4, 2, 3, 4, 1, 4, 4, 4};
  std::vector<float> want(q.size());
  const float scale = 1.f / std::sqrt(float(hd));
  for (int s = 0; s < batch; ++s) {
    for (int h = 0; h < hq; ++h) {
      const int g = h / group, list = s * hkv + g;
      std::vector<double> sc;
      std::vector<const float*> vs;
      for (int e = indptr[list]; e < indptr[list + 1]; ++e) {
        for (int t = 0; t < valid[e]; ++t) {
          const float* kr = &pool[(static_cast<size_t>(ids[e]) * 2 * ps + t) * hd];
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += double(q[(s * hq + h) * hd + d]) * kr[d];
          sc.push_back(dot * scale);
          vs.push_back(&pool[(static_cast<size_t>(ids[e]) * 2 * ps + ps + t) * hd]);
        }
      }
      double dot = 0;
      for (int d = 0; d < hd; ++d) dot += double(q[(s * hq + h) * hd + d]) * kn[(s * hkv + g) * hd + d];
      sc.push_back(dot * scale);
      vs.push_back(&vn[(s * hkv + g) * hd]);
      const double m = *std::max_element(sc.begin(), sc.end());
      double z = 0;
      for (double& x : sc) z += (x = std::exp(x - m));
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t i = 0; i < sc.size(); ++i) acc += sc[i] / z * vs[i][d];
        want[(s * hq + h) * hd + d] = static_cast<float>(acc);
      }
    }
  }
  auto dpool = testing::Upload(b, pool), dq = testing::Upload(b, q), dk = testing::Upload(b, kn),
       dv = testing::Upload(b, vn), di = testing::Upload(b, indptr), dids = testing::Upload(b, ids),
       dval = testing::Upload(b, valid), dout = testing::Upload(b, std::vector<float>(q.size())),
       dlse = testing::Upload(b, std::vector<float>(batch * hq));
  ASSERT_TRUE(PagedDecodeAttention(PagedParams(dpool, dq, di, dids, dval, dout, dlse, {batch, hq, hkv, hd, ps, scale}), b).ok());
  MergeTokenParams m;
  m.q = dq.as<float>();
  m.k_new = dk.as<float>();
  m.v_new = dv.as<float>();
  m.lse = dlse.as<float>();
  m.out = dout.as<float>();
  m.batch = batch;
  m.num_q_heads = hq;
  m.num_kv_heads = hkv;
  m.head_dim = hd;
  m.scale = scale;
  ASSERT_TRUE(MergeToken(m, b).ok());
  ExpectClose(testing::Download<float>(dout, want.size()), want, 1e-5, 1e-4, "paged + merged token");
}

// Paged attention over two disjoint page sets, the second merged into the first by MergeStates,
// equals paged attention over their union (output and log-sum-exp), including lists that are
// empty on either side (an empty second set leaves the first as it is, an empty first set takes
// the second).
TEST_P(KvPagesOnBackend, MergeStatesOfDisjointPageSetsEqualsAttentionOverTheirUnion) {
  const Backend b = GetParam();
  const int batch = 2, hq = 4, hkv = 2, hd = 32, ps = 4, pages = 8;
  const float scale = 1.f / std::sqrt(float(hd));
  const auto pool = RandomVector(static_cast<size_t>(pages) * 2 * ps * hd, 11, -2.f, 2.f);
  const auto q = RandomVector(static_cast<size_t>(batch) * hq * hd, 12);
  // Per (sequence, kv head): set A, set B, and A ∪ B. Unit 1 has no B, unit 2 no A.
  const std::vector<std::vector<int32_t>> a_ids = {{0, 1}, {2}, {}, {5, 6}};
  const std::vector<std::vector<int32_t>> b_ids = {{2, 3}, {}, {4, 7}, {0}};
  const std::vector<int32_t> valid_of = {4, 3, 4, 1, 4, 2, 4, 4};  // per page id
  auto run = [&](const std::vector<std::vector<int32_t>>& sets, std::vector<float>* out, std::vector<float>* lse) {
    std::vector<int32_t> indptr = {0}, ids, valid;
    for (const auto& l : sets) {
      for (int32_t p : l) {
        ids.push_back(p);
        valid.push_back(valid_of[p]);
      }
      indptr.push_back(static_cast<int32_t>(ids.size()));
    }
    auto dpool = testing::Upload(b, pool), dq = testing::Upload(b, q), di = testing::Upload(b, indptr),
         dids = testing::Upload(b, ids), dval = testing::Upload(b, valid),
         dout = testing::Upload(b, std::vector<float>(q.size())), dlse = testing::Upload(b, std::vector<float>(batch * hq));
    ASSERT_TRUE(PagedDecodeAttention(PagedParams(dpool, dq, di, dids, dval, dout, dlse, {batch, hq, hkv, hd, ps, scale}), b).ok());
    *out = testing::Download<float>(dout, q.size());
    *lse = testing::Download<float>(dlse, batch * hq);
  };
  std::vector<std::vector<int32_t>> both(a_ids.size());
  for (size_t u = 0; u < both.size(); ++u) {
    both[u] = a_ids[u];
    both[u].insert(both[u].end(), b_ids[u].begin(), b_ids[u].end());
  }
  std::vector<float> oa, la, ob, lb, ou, lu;
  run(a_ids, &oa, &la);
  run(b_ids, &ob, &lb);
  run(both, &ou, &lu);
  // The kernel's empty-list rows: zeros and -inf (its contract), which MergeStates relies on.
  EXPECT_TRUE(std::isinf(lb[2]) && lb[2] < 0) << lb[2];  // unit 1 = (sequence 0, kv head 1): rows 2, 3
  EXPECT_TRUE(std::isinf(la[4]) && la[4] < 0) << la[4];  // unit 2 = (1, 0): rows 4, 5
  auto dout = testing::Upload(b, oa), dlse = testing::Upload(b, la), dout2 = testing::Upload(b, ob),
       dlse2 = testing::Upload(b, lb);
  MergeStatesParams m;
  m.out = dout.as<float>();
  m.lse = dlse.as<float>();
  m.out2 = dout2.as<float>();
  m.lse2 = dlse2.as<float>();
  m.rows = batch * hq;
  m.head_dim = hd;
  ASSERT_TRUE(MergeStates(m, b).ok());
  ExpectClose(testing::Download<float>(dout, q.size()), ou, 1e-5, 1e-5, "merged output");
  ExpectClose(testing::Download<float>(dlse, batch * hq), lu, 1e-5, 1e-5, "merged log-sum-exp");
  // Bad arguments are INVALID_ARGUMENT, nothing run.
  MergeStatesParams bad = m;
  bad.head_dim = 0;
  EXPECT_EQ(MergeStates(bad, b).code(), StatusCode::kInvalidArgument);
  bad = m;
  bad.lse2 = nullptr;
  EXPECT_EQ(MergeStates(bad, b).code(), StatusCode::kInvalidArgument);
}

TEST_P(KvPagesOnBackend, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  const Backend b = GetParam();
  std::vector<float> logits = {3.f, -2.f, 0.f, 1.f, -0.5f};
  const std::vector<int32_t> ids = {0, 1, 2, 4};
  auto dl = testing::Upload(b, logits), di = testing::Upload(b, ids);
  RepetitionPenaltyParams p;
  p.logits = dl.as<float>();
  p.ids = di.as<int32_t>();
  p.count = 4;
  p.vocab = 5;
  p.penalty = 2.f;
  ASSERT_TRUE(RepetitionPenalty(p, b).ok());
  ExpectClose(testing::Download<float>(dl, 5), {1.5f, -4.f, 0.f, 1.f, -1.f}, 0, 0, "penalty");
}

TEST(KvPagesArgs, BadArgumentsAreInvalid) {
  StoreKvParams sp;
  sp.rows = 1;
  sp.num_heads = 1;
  sp.head_dim = 8;
  sp.page_size = 0;
  EXPECT_EQ(StoreKv(sp).code(), StatusCode::kInvalidArgument);
  GatherKvParams gp;
  float buf[16];
  const int64_t bad = -3;
  gp.pages = buf;
  gp.slot_ids = &bad;
  gp.k = gp.v = buf;
  gp.rows = gp.num_heads = 1;
  gp.head_dim = 8;
  gp.page_size = 1;
  EXPECT_EQ(GatherKv(gp).code(), StatusCode::kInvalidArgument);
  MergeTokenParams mp;
  mp.batch = 1;
  mp.num_q_heads = 3;
  mp.num_kv_heads = 2;
  mp.head_dim = 8;
  EXPECT_EQ(MergeToken(mp).code(), StatusCode::kInvalidArgument);
  RepetitionPenaltyParams rp;
  int32_t id = 9;
  rp.logits = buf;
  rp.ids = &id;
  rp.count = 1;
  rp.vocab = 4;
  rp.penalty = 1.5f;
  EXPECT_EQ(RepetitionPenalty(rp).code(), StatusCode::kInvalidArgument);
  rp.penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(RepetitionPenalty(rp).code(), StatusCode::kInvalidArgument);
}

TEST(Devices, ParseAndName) {
  EXPECT_EQ(ParseDevice("cpu")->backend, Backend::kCpu);
  EXPECT_EQ(ParseDevice("auto")->backend, Backend::kAuto);
  EXPECT_EQ(ParseDevice("cuda")->index, 0);
  EXPECT_EQ(ParseDevice("cuda:3")->index, 3);
  EXPECT_EQ(DeviceName(*ParseDevice("cuda:3")), "cuda:3");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""}) {
    EXPECT_EQ(ParseDevice(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(UseDevice({Backend::kCpu, 0}).ok());
  EXPECT_EQ(UseDevice({Backend::kCpu, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceCount(Backend::kCpu), 1);
  if (!CudaAvailable()) {
    EXPECT_EQ(DeviceCount(Backend::kCuda), 0);
  }
  EXPECT_EQ(ResolveDevice({Backend::kAuto, 0}).backend, CudaAvailable() ? Backend::kCuda : Backend::kCpu);
}

TEST(DeviceBufferUpload, CpuUploadIsAViewAndCudaACopy) {
  std::vector<float> host = {1.f, 2.f, 3.f};
  auto view = DeviceBuffer::Upload(Backend::kCpu, host.data(), host.size() * sizeof(float));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data(), host.data());  // the CPU reads host memory in place
  if (!CudaAvailable()) GTEST_SKIP() << testing::kNoCudaMessage;
  auto copy = DeviceBuffer::Upload(Backend::kCuda, host.data(), host.size() * sizeof(float));
  ASSERT_TRUE(copy.ok());
  EXPECT_NE(copy->data(), host.data());
  EXPECT_EQ(testing::Download<float>(*copy, 3), host);
}

}  // namespace
}  // namespace icecache::kernels
