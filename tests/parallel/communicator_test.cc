// Collectives against references computed here: the all-reduce against the sum of the rank
// buffers in double (f32: |err| <= 1e-6 * (sum of |x|); bf16/f16: the reference rounded to the
// type, within one ulp of it), all-gather and broadcast exactly; every rank bit-identical. CPU
// ranks are threads; the NCCL cases run on the GPUs present and skip otherwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "kernels/device_buffer.h"
#include "parallel/communicator.h"
#include "tests/sanitizers.h"

namespace icecache::parallel {
namespace {

using kernels::DType;

// Runs fn(rank) on one thread per rank and returns each rank's status.
template <typename Fn>
std::vector<Status> OnRanks(int n, Fn fn) {
  std::vector<Status> st(n);
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) th.emplace_back([&, r] { st[r] = fn(r); });
  for (auto& t : th) t.join();
  return st;
}

void FillRandom(DType t, size_t count, uint32_t seed, std::vector<unsigned char>* out) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  std::vector<float> f(count);
  for (float& v : f) v = dist(rng);
  out->resize(count * kernels::DTypeSize(t));
  kernels::ConvertFromF32(t, f.data(), out->data(), count);
}

std::vector<float> ToF32(DType t, const std::vector<unsigned char>& b) {
  std::vector<float> f(b.size() / kernels::DTypeSize(t));
  kernels::ConvertToF32(t, b.data(), f.data(), f.size());
  return f;
}

// Checks an all-reduce result against the double-precision sum of the inputs.
void ExpectSum(DType t, const std::vector<std::vector<unsigned char>>& in, const std::vector<unsigned char>& got) {
  const std::vector<float> g = ToF32(t, got);
  std::vector<std::vector<float>> x;
  for (const auto& b : in) x.push_back(ToF32(t, b));
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double sum = 0, mag = 0;
    for (const auto& xi : x) {
      sum += xi[i];
      mag += std::fabs(xi[i]);
    }
    double tol = 1e-6 * mag + 1e-30;
    if (t != DType::kF32) {
      // One rounding to the type: half an ulp of the result, bounded by 2^-8 (bf16) / 2^-11 (f16) relative.
      tol += std::fabs(sum) * (t == DType::kBF16 ? 1.0 / 256 : 1.0 / 2048) + (t == DType::kF16 ? 6e-8 : 1e-38);
    }
    if (std::fabs(g[i] - sum) > tol && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": got " << g[i] << ", want " << sum << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0u);
}

struct Case {
  int ranks;
  DType dtype;
};

class CpuCollectives : public ::testing::TestWithParam<Case> {};

// Byte sizes from one element to 64 MiB. Under ThreadSanitizer up to 3 MB: 64 MiB took ~4 minutes
// a case there and adds no interleaving the others lack (each rank's chunk is cut in blocks of
// 4096 elements, which 3 MB already spans many times over).
std::vector<size_t> ByteSizes() {
  std::vector<size_t> sizes = {1, 2, 3, 4, 6, 7, 64, 1000, 4099, 65536, 1 << 20, 3'000'001};
  if (!icecache::sanitizer::kThread) sizes.push_back(64u << 20);
  return sizes;
}

TEST_P(CpuCollectives, AllReduceSumMatchesReference) {
  const auto [n, t] = GetParam();
  auto comms = CreateCpuCommunicators(n);
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  const size_t es = kernels::DTypeSize(t);
  for (size_t bytes : ByteSizes()) {
    const size_t count = std::max<size_t>(1, bytes / es);
    std::vector<std::vector<unsigned char>> in(n), buf(n);
    for (int r = 0; r < n; ++r) {
      FillRandom(t, count, 1000 * r + static_cast<uint32_t>(count), &in[r]);
      buf[r] = in[r];
    }
    auto st = OnRanks(n, [&](int r) { return (*comms)[r]->AllReduceSum(buf[r].data(), count, t); });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    SCOPED_TRACE(std::to_string(count) + " elements");
    ExpectSum(t, in, buf[0]);
    for (int r = 1; r < n; ++r) ASSERT_EQ(buf[r], buf[0]) << "rank " << r << " differs from rank 0";
  }
}

TEST_P(CpuCollectives, AllGatherAndBroadcastCopyExactly) {
  const auto [n, t] = GetParam();
  auto comms = CreateCpuCommunicators(n);
  ASSERT_TRUE(comms.ok());
  const size_t es = kernels::DTypeSize(t);
  for (size_t bytes : ByteSizes()) {
    if (bytes > (16u << 20)) continue;  // the gather writes n x the size on each of n ranks
    const size_t count = std::max<size_t>(1, bytes / es);
    std::vector<std::vector<unsigned char>> in(n), recv(n), bc(n);
    for (int r = 0; r < n; ++r) {
      FillRandom(t, count, 77 + r, &in[r]);
      recv[r].assign(n * count * es, 0xee);
      FillRandom(t, count, 99 + r, &bc[r]);
    }
    const int root = n - 1;
    const std::vector<unsigned char> want_bc = bc[root];
    auto st = OnRanks(n, [&](int r) {
      ICE_RETURN_IF_ERROR((*comms)[r]->AllGather(in[r].data(), recv[r].data(), count, t));
      return (*comms)[r]->Broadcast(bc[r].data(), count, t, root);
    });
    std::vector<unsigned char> want;
    for (int r = 0; r < n; ++r) want.insert(want.end(), in[r].begin(), in[r].end());
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      ASSERT_EQ(recv[r], want) << "rank " << r << ", " << count << " elements";
      ASSERT_EQ(bc[r], want_bc) << "rank " << r << ", " << count << " elements";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CpuCollectives,
                         ::testing::Values(Case{1, DType::kF32}, Case{2, DType::kF32}, Case{4, DType::kF32},
                                           Case{2, DType::kBF16}, Case{4, DType::kBF16}, Case{2, DType::kF16},
                                           Case{3, DType::kF16}),
                         [](const auto& info) {
                           return std::to_string(info.param.ranks) + "ranks_" +
                                  std::string(kernels::DTypeName(info.param.dtype));
                         });

TEST(CpuCommunicator, InPlaceAllGatherAndManyBarriers) {
  const int n = 3;
  auto comms = CreateCpuCommunicators(n);
  ASSERT_TRUE(comms.ok());
  std::vector<std::vector<float>> buf(n, std::vector<float>(n * 5, -1.f));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 5; ++i) buf[r][r * 5 + i] = 10.f * r + i;
  auto st = OnRanks(n, [&](int r) {
    for (int i = 0; i < 1000; ++i) ICE_RETURN_IF_ERROR((*comms)[r]->Barrier());
    return (*comms)[r]->AllGather(buf[r].data() + r * 5, buf[r].data(), 5, DType::kF32);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[r].ok()) << st[r].ToString();
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < 5; ++i) EXPECT_EQ(buf[r][j * 5 + i], 10.f * j + i);
  }
}

TEST(CpuCommunicator, MismatchedCallsFailOnEveryRank) {
  auto comms = CreateCpuCommunicators(2);
  ASSERT_TRUE(comms.ok());
  std::vector<float> a(8, 1.f), b(8, 1.f);
  auto st = OnRanks(2, [&](int r) { return (*comms)[r]->AllReduceSum(r == 0 ? a.data() : b.data(), r == 0 ? 8 : 4, DType::kF32); });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].ToString();
    EXPECT_NE(st[r].message().find("different collectives"), std::string::npos) << st[r].message();
  }
  st = OnRanks(2, [&](int r) { return (*comms)[r]->Broadcast(a.data(), 8, DType::kF32, 5); });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(st[r].code(), StatusCode::kInvalidArgument) << st[r].ToString();
  // The group still works afterwards.
  st = OnRanks(2, [&](int r) { return (*comms)[r]->AllReduceSum(r == 0 ? a.data() : b.data(), 8, DType::kF32); });
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
  EXPECT_EQ(a[0], 2.f);
  EXPECT_EQ(b[7], 2.f);
}

TEST(CpuCommunicator, AbortReleasesWaitingRanks) {
  auto comms = CreateCpuCommunicators(3);
  ASSERT_TRUE(comms.ok());
  std::vector<float> x(16, 1.f);
  // Ranks 0 and 1 wait in an all-reduce that rank 2 never joins; rank 2 aborts instead.
  auto st = OnRanks(3, [&](int r) -> Status {
    if (r == 2) {
      (*comms)[2]->Abort();
      return AbortedError("rank 2 failed");
    }
    std::vector<float> mine = x;
    return (*comms)[r]->AllReduceSum(mine.data(), mine.size(), DType::kF32);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(st[r].code(), StatusCode::kAborted) << r << ": " << st[r].ToString();
  EXPECT_EQ((*comms)[0]->Barrier().code(), StatusCode::kAborted);
}

TEST(Communicators, BadGroupsAreRefused) {
  EXPECT_EQ(CreateCpuCommunicators(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCommunicators({}).status().code(), StatusCode::kInvalidArgument);
  const kernels::Device mixed[] = {{kernels::Backend::kCpu, 0}, {kernels::Backend::kCuda, 0}};
  EXPECT_EQ(CreateCommunicators(mixed).status().code(), StatusCode::kInvalidArgument);
  const kernels::Device twice[] = {{kernels::Backend::kCuda, 0}, {kernels::Backend::kCuda, 0}};
  EXPECT_EQ(CreateCommunicators(twice).status().code(), StatusCode::kInvalidArgument);
  const kernels::Device cpus[] = {{kernels::Backend::kCpu, 0}, {kernels::Backend::kCpu, 0}};
  auto c = CreateCommunicators(cpus);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[1]->rank(), 1);
  EXPECT_EQ((*c)[1]->size(), 2);
  EXPECT_EQ((*c)[1]->name(), "cpu");
}

// NCCL on every visible GPU (and TP = 1 over NCCL with one GPU): the all-reduce of device
// buffers against the host reference, f32 and bf16, up to 64 MiB.
TEST(NcclCommunicator, AllReduceOnDevices) {
  const int gpus = kernels::DeviceCount(kernels::Backend::kCuda);
  if (!NcclCompiled() || gpus == 0) {
    GTEST_SKIP() << (NcclCompiled() ? "no CUDA device: the NCCL collectives are not run here"
                                    : "built without NCCL (configure with -DICECACHE_CUDA=ON and NCCL in the CUDA toolkit)");
  }
  std::vector<kernels::Device> devices;
  for (int i = 0; i < gpus; ++i) devices.push_back({kernels::Backend::kCuda, i});
  auto comms = CreateCommunicators(devices);
  ASSERT_TRUE(comms.ok()) << comms.status().ToString();
  const int n = gpus;
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (size_t bytes : ByteSizes()) {
      const size_t count = std::max<size_t>(1, bytes / kernels::DTypeSize(t));
      std::vector<std::vector<unsigned char>> in(n), out(n);
      for (int r = 0; r < n; ++r) FillRandom(t, count, 5 + r, &in[r]);
      auto st = OnRanks(n, [&](int r) -> Status {
        ICE_RETURN_IF_ERROR(kernels::UseDevice(devices[r]));
        ICE_ASSIGN_OR_RETURN(kernels::DeviceBuffer b, kernels::DeviceBuffer::Allocate(kernels::Backend::kCuda, in[r].size()));
        ICE_RETURN_IF_ERROR(b.CopyFromHost(in[r].data(), in[r].size()));
        ICE_RETURN_IF_ERROR((*comms)[r]->AllReduceSum(b.data(), count, t));
        out[r].resize(in[r].size());
        return b.CopyToHost(out[r].data(), out[r].size());  // ordered after the collective (same stream)
      });
      for (int r = 0; r < n; ++r) ASSERT_TRUE(st[r].ok()) << st[r].ToString();
      SCOPED_TRACE(std::string(kernels::DTypeName(t)) + " " + std::to_string(count) + " elements");
      ExpectSum(t, in, out[0]);
    }
  }
}

}  // namespace
}  // namespace icecache::parallel
