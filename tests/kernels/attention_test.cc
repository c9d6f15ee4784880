#include "kernels/attention.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "tests/kernels/test_util.h"

namespace icecache::kernels {
namespace {

using testing::ExpectClose;
using testing::RandomVector;
using testing::ToTyped;

// ---------------------------------------------------------------------------------------------
// Paged decode attention.

struct DecodeCase {
  int batch, num_q_heads, num_kv_heads, head_dim, page_size;
  DType kv_dtype;
  int max_pages;  // pages per (sequence, kv head) drawn in [0, max_pages]
  std::string Name() const {
    return "b=" + std::to_string(batch) + " hq=" + std::to_string(num_q_heads) +
           " hkv=" + std::to_string(num_kv_heads) + " d=" + std::to_string(head_dim) +
           " P=" + std::to_string(page_size) + " " + std::string(DTypeName(kv_dtype)) +
           " maxpages=" + std::to_string(max_pages);
  }
};

struct DecodeInputs {
  std::vector<float> q;
  testing::Typed pages;  // pool of num_pool_pages pages
  std::vector<int32_t> indptr, ids, valid;
};

DecodeInputs MakeDecodeInputs(const DecodeCase& c, uint32_t seed) {
  DecodeInputs in;
  std::mt19937 rng(seed);
  const int pool_pages = std::max(1, c.batch * c.num_kv_heads * c.max_pages + 3);
  in.q = RandomVector(static_cast<size_t>(c.batch) * c.num_q_heads * c.head_dim, seed + 1);
  // Larger keys make the softmax peaky, which exercises the max subtraction.
  in.pages = ToTyped(c.kv_dtype, RandomVector(static_cast<size_t>(pool_pages) * 2 * c.page_size *
                                                  c.head_dim, seed + 2, -2.f, 2.f));
  in.indptr.push_back(0);
  std::vector<int32_t> perm(pool_pages);
  for (int i = 0; i < pool_pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (int l = 0; l < c.batch * c.num_kv_heads; ++l) {
    const int n = std::uniform_int_distribution<int>(0, c.max_pages)(rng);
    for (int i = 0; i < n; ++i) {
      in.ids.push_back(perm[next++ % pool_pages]);
      // Mostly full pages, some partly filled, some empty.
      const int r = std::uniform_int_distribution<int>(0, 9)(rng);
      in.valid.push_back(r < 6 ? c.page_size
                               : (r < 9 ? std::uniform_int_distribution<int>(1, c.page_size)(rng) : 0));
    }
    in.indptr.push_back(static_cast<int32_t>(in.ids.size()));
  }
  return in;
}

// Naive double-precision reference over the fp32 values the pages hold.
void NaiveDecode(const DecodeCase& c, const DecodeInputs& in, float scale, std::vector<float>* out,
                 std::vector<float>* lse) {
  const int group = c.num_q_heads / c.num_kv_heads, d = c.head_dim, P = c.page_size;
  out->assign(static_cast<size_t>(c.batch) * c.num_q_heads * d, 0.f);
  lse->assign(static_cast<size_t>(c.batch) * c.num_q_heads, -std::numeric_limits<float>::infinity());
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.num_q_heads; ++h) {
      const int l = b * c.num_kv_heads + h / group;
      std::vector<double> s;
      std::vector<const float*> vrows;
      const float* q = in.q.data() + (static_cast<size_t>(b) * c.num_q_heads + h) * d;
      for (int i = in.indptr[l]; i < in.indptr[l + 1]; ++i) {
        const float* page = in.pages.values.data() + static_cast<size_t>(in.ids[i]) * 2 * P * d;
        for (int slot = 0; slot < in.valid[i]; ++slot) {
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += static_cast<double>(q[e]) * page[slot * d + e];
          s.push_back(dot * scale);
          vrows.push_back(page + (P + slot) * d);
        }
      }
      if (s.empty()) continue;
      double mx = -1e300, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      float* o = out->data() + (static_cast<size_t>(b) * c.num_q_heads + h) * d;
      for (int e = 0; e < d; ++e) {
        double acc = 0;
        for (size_t j = 0; j < s.size(); ++j) acc += s[j] * vrows[j][e];
        o[e] = static_cast<float>(acc / sum);
      }
      (*lse)[b * c.num_q_heads + h] = static_cast<float>(mx + std::log(sum));
    }
  }
}

void RunDecode(Backend backend, const DecodeCase& c, const DecodeInputs& in, float scale,
               std::vector<float>* out, std::vector<float>* lse) {
  auto dq = testing::Upload(backend, in.q);
  auto dpages = testing::Upload(backend, in.pages.bytes);
  auto dindptr = testing::Upload(backend, in.indptr);
  auto dids = testing::Upload(backend, in.ids);
  auto dvalid = testing::Upload(backend, in.valid);
  const size_t nout = static_cast<size_t>(c.batch) * c.num_q_heads * c.head_dim;
  auto dout = testing::Upload(backend, std::vector<float>(nout, 123.f));
  auto dlse = testing::Upload(backend, std::vector<float>(c.batch * c.num_q_heads, 123.f));
  PagedDecodeAttentionParams p;
  p.q = dq.as<float>();
  p.pages = dpages.data();
  p.kv_dtype = c.kv_dtype;
  p.page_indptr = dindptr.as<int32_t>();
  p.page_ids = dids.as<int32_t>();
  p.page_valid = dvalid.as<int32_t>();
  p.out = dout.as<float>();
  p.lse = dlse.as<float>();
  p.batch = c.batch;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.page_size = c.page_size;
  p.scale = scale;
  const Status s = PagedDecodeAttention(p, backend);
  ASSERT_TRUE(s.ok()) << s.ToString();
  *out = testing::Download<float>(dout, nout);
  *lse = testing::Download<float>(dlse, c.batch * c.num_q_heads);
}

std::vector<DecodeCase> DecodeCases() {
  std::vector<DecodeCase> cases;
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  int i = 0;
  for (int d : {64, 128}) {
    for (int ratio : {1, 4, 8}) {
      for (int P : {8, 16, 32}) {
        const int hkv = (ratio == 8) ? 1 : 2;
        const int batch = 1 + (i * 3) % 8;
        cases.push_back({batch, hkv * ratio, hkv, d, P, dtypes[i % 3], 1 + i % 7});
        ++i;
      }
    }
  }
  cases.push_back({3, 4, 4, 72, 16, DType::kBF16, 0});   // every page list empty
  cases.push_back({1, 32, 8, 128, 16, DType::kBF16, 40});  // Llama-3 8B layout
  cases.push_back({2, 6, 3, 40, 5, DType::kF32, 4});       // odd sizes
  // Vector path remainders: GQA 2; head_dim 80/48/144 (V column passes not a multiple of the
  // register block); page sizes 12/5/7 (last score block of a page partly filled).
  cases.push_back({2, 4, 2, 128, 16, DType::kBF16, 6});
  cases.push_back({1, 8, 2, 80, 12, DType::kBF16, 9});
  cases.push_back({2, 8, 1, 48, 5, DType::kF16, 30});
  cases.push_back({1, 3, 3, 144, 7, DType::kF32, 20});
  // Long lists: pages prefetched ahead, many online-softmax rescalings.
  cases.push_back({1, 32, 8, 128, 16, DType::kBF16, 300});
  // The (GQA group, dtype) pairs not above (GQA 2: f16; GQA 3: every dtype), and head_dim 36 / 52
  // / 44 (a multiple of 4, not of 8: the neon fast path, the generic one on x86; 9 / 13 / 11
  // column chunks of 4, so the neon V pass ends on a partial register block), 56 (GQA 3: 14
  // chunks of 4, a partial block too).
  cases.push_back({2, 4, 2, 64, 16, DType::kF32, 5});
  cases.push_back({1, 6, 3, 36, 9, DType::kF16, 8});
  cases.push_back({2, 9, 3, 64, 16, DType::kBF16, 6});  // SmolLM2's 9 / 3 heads
  cases.push_back({1, 3, 1, 52, 16, DType::kF16, 12});
  cases.push_back({2, 6, 2, 56, 7, DType::kF32, 10});
  cases.push_back({1, 8, 1, 44, 8, DType::kF32, 6});
  // GQA 5, 6, 7 (Qwen2.5: 40 / 8, 12 / 2, 28 / 4 and 14 / 2 heads), each dtype, a partial last page.
  cases.push_back({1, 10, 2, 128, 16, DType::kBF16, 9});
  cases.push_back({2, 12, 2, 64, 12, DType::kF16, 7});
  cases.push_back({1, 28, 4, 128, 16, DType::kBF16, 20});
  cases.push_back({2, 14, 2, 64, 5, DType::kF32, 11});
  return cases;
}

TEST(PagedDecodeAttentionTest, CpuMatchesNaive) {
  uint32_t seed = 7;
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeInputs in = MakeDecodeInputs(c, seed += 10);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want, want_lse, got, got_lse;
    NaiveDecode(c, in, scale, &want, &want_lse);
    RunDecode(Backend::kCpu, c, in, scale, &got, &got_lse);
    // Outputs are convex combinations of values in [-2, 2]; fp32 softmax and dots: 2e-5 abs.
    ExpectClose(got, want, 2e-5, 1e-5, c.Name() + " out");
    ExpectClose(got_lse, want_lse, 1e-5, 1e-5, c.Name() + " lse");
  }
}

// Slots past page_valid hold NaN: no output or lse may depend on them (the vector path repeats
// the last valid row to fill a score block and masks those lanes).
TEST(PagedDecodeAttentionTest, SlotsPastValidAreNeverUsed) {
  const DecodeCase cases[] = {{2, 8, 2, 128, 16, DType::kBF16, 6},
                              {1, 4, 1, 64, 12, DType::kF16, 5},
                              {1, 16, 2, 128, 8, DType::kF32, 7},
                              {2, 4, 4, 64, 5, DType::kBF16, 4},
                              {1, 14, 2, 64, 12, DType::kBF16, 5}};
  uint32_t seed = 501;
  for (const DecodeCase& c : cases) {
    DecodeInputs in = MakeDecodeInputs(c, seed += 10);
    const size_t elem = DTypeSize(c.kv_dtype);
    const uint32_t nan_bits = c.kv_dtype == DType::kF32 ? 0x7fc00000u
                              : c.kv_dtype == DType::kBF16 ? 0x7fc0u : 0x7e00u;
    for (size_t i = 0; i < in.ids.size(); ++i) {
      for (int slot = in.valid[i]; slot < c.page_size; ++slot) {
        for (int half = 0; half < 2; ++half) {  // K row, then V row
          const size_t row = static_cast<size_t>(in.ids[i]) * 2 * c.page_size + half * c.page_size + slot;
          for (int e = 0; e < c.head_dim; ++e) {
            std::memcpy(in.pages.bytes.data() + (row * c.head_dim + e) * elem, &nan_bits, elem);
          }
        }
      }
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want, want_lse, got, got_lse;
    NaiveDecode(c, in, scale, &want, &want_lse);
    RunDecode(Backend::kCpu, c, in, scale, &got, &got_lse);
    // Same bounds as CpuMatchesNaive; a NaN anywhere fails them.
    ExpectClose(got, want, 2e-5, 1e-5, c.Name() + " out");
    ExpectClose(got_lse, want_lse, 1e-5, 1e-5, c.Name() + " lse");
  }
}

// Every SIMD target this CPU supports against the scalar target (the generic two-pass kernel) on
// the same inputs, in one process: the one-pass kernels (avx512, avx2, neon) for every GQA group
// and dtype of DecodeCases.
TEST(PagedDecodeAttentionTest, EveryTargetMatchesScalar) {
  uint32_t seed = 2003;
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeInputs in = MakeDecodeInputs(c, seed += 10);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want, want_lse;
    testing::ForEachSimdTarget([&](SimdTarget t) {
      std::vector<float> got, got_lse;
      RunDecode(Backend::kCpu, c, in, scale, &got, &got_lse);
      if (t == SimdTarget::kScalar) {
        want = got;
        want_lse = got_lse;
      } else {
        // Both within CpuMatchesNaive's bounds of the naive reference: twice those apart.
        ExpectClose(got, want, 4e-5, 2e-5, c.Name() + " out");
        ExpectClose(got_lse, want_lse, 2e-5, 2e-5, c.Name() + " lse");
      }
    });
  }
}

TEST(PagedDecodeAttentionTest, CudaMatchesCpu) {
  ICE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 1007;
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeInputs in = MakeDecodeInputs(c, seed += 10);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> cpu, cpu_lse, gpu, gpu_lse;
    RunDecode(Backend::kCpu, c, in, scale, &cpu, &cpu_lse);
    RunDecode(Backend::kCuda, c, in, scale, &gpu, &gpu_lse);
    // Different summation order and __expf on the GPU: 5e-5 abs on outputs in [-2, 2].
    ExpectClose(gpu, cpu, 5e-5, 1e-5, c.Name() + " out");
    ExpectClose(gpu_lse, cpu_lse, 2e-5, 1e-5, c.Name() + " lse");
  }
}

TEST(PagedDecodeAttentionTest, RejectsBadPageValid) {
  DecodeCase c{1, 2, 1, 8, 4, DType::kF32, 1};
  DecodeInputs in = MakeDecodeInputs(c, 3);
  in.indptr = {0, 1};
  in.ids = {0};
  in.valid = {5};  // > page_size
  std::vector<float> out(16);
  PagedDecodeAttentionParams p;
  p.q = in.q.data();
  p.pages = in.pages.bytes.data();
  p.page_indptr = in.indptr.data();
  p.page_ids = in.ids.data();
  p.page_valid = in.valid.data();
  p.out = out.data();
  p.batch = 1;
  p.num_q_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim = 8;
  p.page_size = 4;
  p.scale = 1.f;
  EXPECT_EQ(PagedDecodeAttention(p).code(), StatusCode::kInvalidArgument);
  p.num_q_heads = 3;  // not a multiple of num_kv_heads... (1 divides 3, so use 2 kv heads)
  p.num_kv_heads = 2;
  EXPECT_EQ(PagedDecodeAttention(p).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Prefill attention.

struct PrefillCase {
  int q_len, kv_len, num_q_heads, num_kv_heads, head_dim;
  std::string Name() const {
    return "q=" + std::to_string(q_len) + " kv=" + std::to_string(kv_len) + " hq=" +
           std::to_string(num_q_heads) + " hkv=" + std::to_string(num_kv_heads) +
           " d=" + std::to_string(head_dim);
  }
};

std::vector<PrefillCase> PrefillCases() {
  return {{1, 1, 1, 1, 64},    {7, 7, 4, 1, 64},     {33, 33, 8, 2, 128}, {5, 40, 4, 4, 64},
          {70, 129, 8, 1, 128}, {16, 16, 32, 8, 128}, {3, 200, 6, 3, 40}};
}

struct PrefillInputs {
  std::vector<float> q, k, v;
};

PrefillInputs MakePrefillInputs(const PrefillCase& c, uint32_t seed) {
  return {RandomVector(static_cast<size_t>(c.q_len) * c.num_q_heads * c.head_dim, seed),
          RandomVector(static_cast<size_t>(c.kv_len) * c.num_kv_heads * c.head_dim, seed + 1, -2, 2),
          RandomVector(static_cast<size_t>(c.kv_len) * c.num_kv_heads * c.head_dim, seed + 2)};
}

std::vector<float> NaivePrefill(const PrefillCase& c, const PrefillInputs& in, float scale) {
  const int d = c.head_dim, group = c.num_q_heads / c.num_kv_heads;
  std::vector<float> out(in.q.size());
  for (int i = 0; i < c.q_len; ++i) {
    for (int h = 0; h < c.num_q_heads; ++h) {
      const float* q = &in.q[(static_cast<size_t>(i) * c.num_q_heads + h) * d];
      const int kvh = h / group;
      std::vector<double> s;
      for (int j = 0; j <= i + c.kv_len - c.q_len; ++j) {
        const float* k = &in.k[(static_cast<size_t>(j) * c.num_kv_heads + kvh) * d];
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += static_cast<double>(q[e]) * k[e];
        s.push_back(dot * scale);
      }
      double mx = -1e300, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int e = 0; e < d; ++e) {
        double acc = 0;
        for (size_t j = 0; j < s.size(); ++j) {
          acc += s[j] * in.v[(j * c.num_kv_heads + kvh) * d + e];
        }
        out[(static_cast<size_t>(i) * c.num_q_heads + h) * d + e] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

std::vector<float> RunPrefill(Backend backend, const PrefillCase& c, const PrefillInputs& in,
                              float scale) {
  auto dq = testing::Upload(backend, in.q);
  auto dk = testing::Upload(backend, in.k);
  auto dv = testing::Upload(backend, in.v);
  auto dout = testing::Upload(backend, std::vector<float>(in.q.size(), 55.f));
  PrefillAttentionParams p;
  p.q = dq.as<float>();
  p.k = dk.as<float>();
  p.v = dv.as<float>();
  p.out = dout.as<float>();
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.scale = scale;
  const Status s = PrefillAttention(p, backend);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return testing::Download<float>(dout, in.q.size());
}

TEST(PrefillAttentionTest, CpuMatchesNaive) {
  uint32_t seed = 11;
  for (const PrefillCase& c : PrefillCases()) {
    const auto in = MakePrefillInputs(c, seed += 5);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    // Convex combinations of values in [-1, 1], fp32: 2e-5 abs.
    ExpectClose(RunPrefill(Backend::kCpu, c, in, scale), NaivePrefill(c, in, scale), 2e-5, 1e-5,
                c.Name());
  }
}

TEST(PrefillAttentionTest, CudaMatchesCpu) {
  ICE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 211;
  for (const PrefillCase& c : PrefillCases()) {
    const auto in = MakePrefillInputs(c, seed += 5);
    const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    // Tiled online softmax (rescaling per tile) vs exact two-pass: 5e-5 abs.
    ExpectClose(RunPrefill(Backend::kCuda, c, in, scale), RunPrefill(Backend::kCpu, c, in, scale),
                5e-5, 1e-5, c.Name());
  }
}

}  // namespace
}  // namespace icecache::kernels
