// The KV shipping protocol (transport/kv_shipping.h) over real UCX on loopback, and the layered
// SequenceCache build the prefill worker overlaps with its forward pass. References: the
// one-call SequenceCache::Build (layered build) and the source pool's page bytes (shipping).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "kvstore/sequence_cache.h"
#include "tests/kvstore/kv_test_util.h"
#include "transport/kv_shipping.h"

namespace icecache::transport {
namespace {

using namespace std::chrono_literals;
const std::string kToken = "0123456789abcdef";  // a reservation token (16 bytes)
using kvstore::PagePool;
using kvstore::SequenceCache;
using kvstore::SequenceCacheOptions;

SequenceCacheOptions Opts(int layers, int nkv, int ice_group) {
  SequenceCacheOptions o;
  o.num_layers = layers;
  o.num_kv_heads = nkv;
  o.dense_layers = 1;
  o.sink_pages = 1;
  o.window_pages = 2;
  o.ice_group = ice_group;
  return o;
}

// Zero-filled, so that unused slots of partly filled pages compare equal too.
std::unique_ptr<PagePool> ZeroPool(int dim, int64_t pages, kernels::DType dtype) {
  kvstore::PagePoolOptions o;
  o.page_size = 16;
  o.head_dim = dim;
  o.dtype = dtype;
  o.num_pages = pages;
  o.zero_fill = true;
  return PagePool::Create(o).value();
}

// Page contents in wire order.
std::vector<uint8_t> WireBytes(const PagePool& pool, const std::vector<int32_t>& pages) {
  std::vector<uint8_t> out;
  for (int32_t p : pages) {
    const auto* b = static_cast<const uint8_t*>(pool.PageK(p));
    out.insert(out.end(), b, b + pool.page_bytes());
  }
  return out;
}

TEST(LayeredBuild, EqualsOneCallBuild) {
  const int layers = 6, nkv = 2, dim = 16;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 700, 3);
  for (int ice : {1, 2}) {
    for (auto dt : {kernels::DType::kF32, kernels::DType::kBF16}) {
      auto pool_a = ZeroPool(dim, 4000, dt);
      auto pool_b = ZeroPool(dim, 4000, dt);
      auto a = SequenceCache::Create(Opts(layers, nkv, ice), pool_a.get()).value();
      auto b = SequenceCache::Create(Opts(layers, nkv, ice), pool_b.get()).value();
      ASSERT_TRUE(a->Build(m.kp.data(), m.vp.data(), m.n).ok());
      ASSERT_TRUE(b->BeginBuild(m.n).ok());
      // As the prefill engine does: build up to each ICE group boundary as layers complete.
      for (int l = 0; l < layers; ++l) {
        if (!b->EndsGroup(l)) continue;
        const int first = b->built_layers();
        ASSERT_TRUE(b->BuildLayers(first, l + 1 - first, m.kp.data() + first, m.vp.data() + first).ok());
        EXPECT_EQ(b->num_tokens(), 0);  // not visible before FinishBuild
      }
      ASSERT_TRUE(b->FinishBuild().ok());
      EXPECT_EQ(b->num_tokens(), m.n);
      auto wa = a->Serialize().value(), wb = b->Serialize().value();
      EXPECT_EQ(wa.metadata, wb.metadata) << "ice " << ice;
      EXPECT_EQ(WireBytes(*pool_a, wa.pages), WireBytes(*pool_b, wb.pages)) << "ice " << ice;
    }
  }
}

TEST(LayeredBuild, RangesMustContinueAndEndOnAGroup) {
  const int layers = 5, nkv = 1, dim = 8;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 300, 4);
  auto pool = kvstore::testing::MakePool(dim, 2000);
  auto c = SequenceCache::Create(Opts(layers, nkv, 2), pool.get()).value();  // layers 1-2, 3-4 grouped
  ASSERT_TRUE(c->BeginBuild(m.n).ok());
  EXPECT_EQ(c->FinishBuild().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c->BuildLayers(0, 1, m.kp.data(), m.vp.data()).ok());
  // Layer 1 leads a group with layer 2: building it alone is refused, and the cache is emptied.
  Status s = c->BuildLayers(1, 1, m.kp.data() + 1, m.vp.data() + 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_EQ(pool->used_pages(), 0);
  // After the failure the cache can be built again from scratch.
  ASSERT_TRUE(c->Build(m.kp.data(), m.vp.data(), m.n).ok());
  EXPECT_EQ(c->num_tokens(), m.n);
}

class KvShippingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UcxOptions o{"tcp,sm,self", "lo", false};
    receiver_ = CreateUcxTransport(o).value();
    sender_ = CreateUcxTransport(o).value();
  }
  std::unique_ptr<Transport> receiver_, sender_;
};

TEST_F(KvShippingTest, RunsArriveInAFragmentedPool) {
  const int layers = 4, nkv = 2, dim = 32;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 1000, 5);
  auto src_pool = ZeroPool(dim, 3000, kernels::DType::kBF16);
  auto src = SequenceCache::Create(Opts(layers, nkv, 1), src_pool.get()).value();
  ASSERT_TRUE(src->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = src->Serialize().value();
  const size_t page_bytes = src_pool->page_bytes();

  // The receiving pool's free list is shuffled: allocate everything, free in a random order.
  auto dst_pool = kvstore::testing::MakePool(dim, 3000, kernels::DType::kBF16);
  std::vector<int32_t> all;
  ASSERT_TRUE(dst_pool->AllocateMany(dst_pool->capacity_pages(), &all).ok());
  std::shuffle(all.begin(), all.end(), std::mt19937(9));
  ASSERT_TRUE(dst_pool->FreeMany(all).ok());

  for (size_t max_segment : {size_t{1}, 5 * page_bytes, size_t{4} << 20}) {
    const uint64_t id = 100 + max_segment;
    KvReceiver rx(dst_pool.get(), kToken);
    ASSERT_TRUE(receiver_->ExpectScatter(id, kToken, rx.Sink()).ok());
    auto st = ShipSequence(*sender_, receiver_->address(), id, kToken, wire, *src_pool, max_segment, Clock::now() + 30s);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    ASSERT_TRUE(receiver_->Wait(id, Clock::now() + 30s).ok());
    EXPECT_EQ(st->pages, static_cast<int64_t>(wire.pages.size()));
    // Source pages are allocated in wire order here, so runs are only cut by the size cap.
    const int64_t run = std::max<int64_t>(1, static_cast<int64_t>(max_segment / page_bytes));
    EXPECT_EQ(st->segments, 1 + (st->pages + run - 1) / run) << "max_segment " << max_segment;
    auto cache = rx.Import();
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    auto got = (*cache)->Serialize().value();
    EXPECT_EQ(got.metadata, wire.metadata);
    EXPECT_EQ(WireBytes(*dst_pool, got.pages), WireBytes(*src_pool, wire.pages)) << "max_segment " << max_segment;
    EXPECT_EQ((*cache)->num_tokens(), m.n);
  }
  EXPECT_EQ(dst_pool->used_pages(), 0);  // the imported caches freed their pages
}

TEST_F(KvShippingTest, PagesOfAnotherDtypeAreRefused) {
  const int layers = 3, nkv = 1, dim = 16;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 200, 6);
  auto src_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  auto src = SequenceCache::Create(Opts(layers, nkv, 1), src_pool.get()).value();
  ASSERT_TRUE(src->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = src->Serialize().value();
  const size_t bf16_page = src_pool->page_bytes();
  auto dst_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kF32);  // pages twice as large
  // Runs of an odd number of bf16 pages are not whole f32 pages: refused as they arrive.
  {
    KvReceiver rx(dst_pool.get(), kToken);
    ASSERT_TRUE(receiver_->ExpectScatter(1, kToken, rx.Sink()).ok());
    (void)ShipSequence(*sender_, receiver_->address(), 1, kToken, wire, *src_pool, 3 * bf16_page, Clock::now() + 30s);
    Status w = receiver_->Wait(1, Clock::now() + 30s);
    EXPECT_EQ(w.code(), StatusCode::kAborted) << w.ToString();
    EXPECT_NE(w.message().find("kv_dtype/page_size differ"), std::string::npos) << w.message();
    rx.Release();
  }
  // Runs of 2 bf16 pages fill f32 pages exactly: the header check refuses them on import.
  {
    KvReceiver rx(dst_pool.get(), kToken);
    ASSERT_TRUE(receiver_->ExpectScatter(2, kToken, rx.Sink()).ok());
    auto st = ShipSequence(*sender_, receiver_->address(), 2, kToken, wire, *src_pool, 2 * bf16_page, Clock::now() + 30s);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    if (wire.pages.size() % 2 == 0) {
      ASSERT_TRUE(receiver_->Wait(2, Clock::now() + 30s).ok());
      auto cache = rx.Import();
      ASSERT_FALSE(cache.ok());
      EXPECT_EQ(cache.status().code(), StatusCode::kFailedPrecondition) << cache.status().ToString();
      EXPECT_NE(cache.status().message().find("bf16"), std::string::npos) << cache.status().message();
      EXPECT_NE(cache.status().message().find("f32"), std::string::npos) << cache.status().message();
    } else {
      EXPECT_FALSE(receiver_->Wait(2, Clock::now() + 30s).ok());  // the last, odd run is refused
    }
    rx.Release();
  }
  EXPECT_EQ(dst_pool->used_pages(), 0);
}

TEST_F(KvShippingTest, SameSizePagesOfAnotherDtypeAreRefusedOnImport) {
  // bf16 and f16 pages have the same size: only the header tells them apart.
  const int layers = 3, nkv = 1, dim = 16;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 200, 7);
  auto src_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  auto src = SequenceCache::Create(Opts(layers, nkv, 1), src_pool.get()).value();
  ASSERT_TRUE(src->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = src->Serialize().value();
  auto dst_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kF16);
  KvReceiver rx(dst_pool.get(), kToken);
  ASSERT_TRUE(receiver_->ExpectScatter(3, kToken, rx.Sink()).ok());
  ASSERT_TRUE(ShipSequence(*sender_, receiver_->address(), 3, kToken, wire, *src_pool, 4 << 20, Clock::now() + 30s).ok());
  ASSERT_TRUE(receiver_->Wait(3, Clock::now() + 30s).ok());
  auto cache = rx.Import();
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cache.status().message().find("bytes of bf16, this pool holds"), std::string::npos) << cache.status().message();
  EXPECT_NE(cache.status().message().find("pages of f16"), std::string::npos) << cache.status().message();
  rx.Release();
  EXPECT_EQ(dst_pool->used_pages(), 0);
}

// A shipment with another reservation's token never reaches the pool: the transport drops its
// segments and its Finish before the receiver's sink allocates anything, so the transfer stalls
// (DEADLINE_EXCEEDED at the receiver's deadline) with no page taken.
TEST_F(KvShippingTest, WrongTokenNeverReachesThePool) {
  const int layers = 3, nkv = 1, dim = 16;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 100, 8);
  auto src_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  auto src = SequenceCache::Create(Opts(layers, nkv, 1), src_pool.get()).value();
  ASSERT_TRUE(src->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = src->Serialize().value();
  auto dst_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  KvReceiver rx(dst_pool.get(), kToken);
  ASSERT_TRUE(receiver_->ExpectScatter(4, kToken, rx.Sink()).ok());
  auto shipped = ShipSequence(*sender_, receiver_->address(), 4, "fedcba9876543210", wire, *src_pool, 4 << 20,
                              Clock::now() + 30s);
  // Small segments are dropped silently; a refused rendezvous segment fails the sender.
  EXPECT_TRUE(shipped.ok() || shipped.status().code() == StatusCode::kFailedPrecondition) << shipped.status().ToString();
  const uint64_t messages = shipped.ok() ? static_cast<uint64_t>(shipped->segments) + 1 : 1;  // + the Finish
  const auto until = Clock::now() + 30s;
  while (receiver_->stats().segments_refused < messages && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_GE(receiver_->stats().segments_refused, messages);
  EXPECT_EQ(dst_pool->used_pages(), 0) << "the sink allocated pages for a stranger's segments";
  Status w = receiver_->Wait(4, Clock::now() + 200ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded) << w.ToString();
  EXPECT_NE(w.message().find("0 segments arrived, end not announced"), std::string::npos) << w.message();
  EXPECT_EQ(receiver_->stats().bytes_received, 0u);
  rx.Release();
  EXPECT_EQ(dst_pool->used_pages(), 0);
  // A token of the wrong size is refused by the sender before anything is sent.
  auto bad = ShipSequence(*sender_, receiver_->address(), 5, "short", wire, *src_pool, 4 << 20, Clock::now() + 30s);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

// Behind the transport's check, the header's token is checked again on import: a receiver that
// expects another token than the transfer's refuses the KV (PERMISSION_DENIED) and its pages go
// back to the pool.
TEST_F(KvShippingTest, HeaderWithAnotherTokenIsRefusedOnImport) {
  const int layers = 3, nkv = 1, dim = 16;
  auto m = kvstore::testing::RandomKv(layers, nkv, dim, 100, 8);
  auto src_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  auto src = SequenceCache::Create(Opts(layers, nkv, 1), src_pool.get()).value();
  ASSERT_TRUE(src->Build(m.kp.data(), m.vp.data(), m.n).ok());
  auto wire = src->Serialize().value();
  auto dst_pool = kvstore::testing::MakePool(dim, 500, kernels::DType::kBF16);
  const std::string other = "fedcba9876543210";
  KvReceiver rx(dst_pool.get(), kToken);
  ASSERT_TRUE(receiver_->ExpectScatter(6, other, rx.Sink()).ok());
  ASSERT_TRUE(ShipSequence(*sender_, receiver_->address(), 6, other, wire, *src_pool, 4 << 20, Clock::now() + 30s).ok());
  ASSERT_TRUE(receiver_->Wait(6, Clock::now() + 30s).ok());
  EXPECT_GT(dst_pool->used_pages(), 0);
  auto cache = rx.Import();
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.status().code(), StatusCode::kPermissionDenied) << cache.status().ToString();
  rx.Release();
  EXPECT_EQ(dst_pool->used_pages(), 0);
}

TEST(KvDtype, Parses) {
  EXPECT_EQ(kernels::ParseDType("bf16").value(), kernels::DType::kBF16);
  EXPECT_EQ(kernels::ParseDType("f16").value(), kernels::DType::kF16);
  EXPECT_EQ(kernels::ParseDType("f32").value(), kernels::DType::kF32);
  EXPECT_EQ(kernels::ParseDType("fp8").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace icecache::transport
