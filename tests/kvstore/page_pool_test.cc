#include "kvstore/page_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace icecache::kvstore {
namespace {

PagePoolOptions Opts(int64_t pages, kernels::DType dt = kernels::DType::kBF16) {
  PagePoolOptions o;
  o.page_size = 16;
  o.head_dim = 64;
  o.dtype = dt;
  o.num_pages = pages;
  return o;
}

TEST(PagePoolTest, LayoutAndAccounting) {
  auto pool = PagePool::Create(Opts(10)).value();
  EXPECT_EQ(pool->page_bytes(), 2u * 16 * 64 * 2);
  EXPECT_EQ(pool->capacity_bytes(), 10 * pool->page_bytes());
  EXPECT_EQ(pool->used_pages(), 0);
  EXPECT_EQ(pool->free_bytes(), pool->capacity_bytes());
  // Page p starts at element p * 2 * page_size * head_dim of the base.
  const char* base = static_cast<const char*>(pool->base());
  EXPECT_EQ(static_cast<char*>(pool->PageK(3)) - base, 3 * 2 * 16 * 64 * 2);
  EXPECT_EQ(static_cast<char*>(pool->PageV(3)) - base, 3 * 2 * 16 * 64 * 2 + 16 * 64 * 2);
  EXPECT_EQ(static_cast<char*>(pool->KRow(3, 5)) - static_cast<char*>(pool->PageK(3)), 5 * 64 * 2);
  std::set<int32_t> got;
  for (int i = 0; i < 10; ++i) got.insert(pool->Allocate().value());
  EXPECT_EQ(got.size(), 10u);
  EXPECT_EQ(pool->used_pages(), 10);
  EXPECT_EQ(pool->used_bytes(), pool->capacity_bytes());
  auto full = pool->Allocate();
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("page pool full"), std::string::npos);
  for (int32_t p : got) ASSERT_TRUE(pool->Free(p).ok());
  EXPECT_EQ(pool->used_pages(), 0);
}

TEST(PagePoolTest, AllocateManyIsAllOrNothing) {
  auto pool = PagePool::Create(Opts(8)).value();
  std::vector<int32_t> a;
  ASSERT_TRUE(pool->AllocateMany(5, &a).ok());
  EXPECT_EQ(a.size(), 5u);
  std::vector<int32_t> b;
  Status s = pool->AllocateMany(4, &b);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool->used_pages(), 5);
  ASSERT_TRUE(pool->FreeMany(a).ok());
  EXPECT_EQ(pool->used_pages(), 0);
}

TEST(PagePoolTest, BadFreeAndBadOptions) {
  auto pool = PagePool::Create(Opts(4)).value();
  EXPECT_EQ(pool->Free(7).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Free(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Free(0).code(), StatusCode::kInvalidArgument);  // not allocated
  int32_t p = pool->Allocate().value();
  ASSERT_TRUE(pool->Free(p).ok());
  EXPECT_EQ(pool->Free(p).code(), StatusCode::kInvalidArgument);  // double free
  EXPECT_EQ(pool->used_pages(), 0);
  EXPECT_EQ(PagePool::Create(Opts(0)).status().code(), StatusCode::kInvalidArgument);
  PagePoolOptions o = Opts(4);
  o.page_size = 0;
  EXPECT_EQ(PagePool::Create(o).status().code(), StatusCode::kInvalidArgument);
}

struct HookCounts {
  int allocs = 0, frees = 0;
  size_t bytes = 0;
};

TEST(PagePoolTest, AllocatorHookIsUsedOnce) {
  HookCounts counts;
  PagePoolOptions o = Opts(6, kernels::DType::kF32);
  o.alloc = [](size_t bytes, void* ctx) -> void* {
    auto* c = static_cast<HookCounts*>(ctx);
    ++c->allocs;
    c->bytes = bytes;
    return ::operator new(bytes, std::align_val_t(64));
  };
  o.free = [](void* p, size_t, void* ctx) {
    ++static_cast<HookCounts*>(ctx)->frees;
    ::operator delete(p, std::align_val_t(64));
  };
  o.alloc_ctx = &counts;
  {
    auto pool = PagePool::Create(o).value();
    EXPECT_EQ(counts.allocs, 1);
    EXPECT_EQ(counts.bytes, pool->capacity_bytes());
  }
  EXPECT_EQ(counts.frees, 1);
  PagePoolOptions failing = Opts(6);
  failing.alloc = [](size_t, void*) -> void* { return nullptr; };
  failing.free = [](void*, size_t, void*) {};
  EXPECT_EQ(PagePool::Create(failing).status().code(), StatusCode::kResourceExhausted);
}

TEST(PagePoolTest, ConcurrentAllocateAndFree) {
  auto pool = PagePool::Create(Opts(64)).value();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 2000; ++round) {
        std::vector<int32_t> mine;
        for (int i = 0; i < 8; ++i) {
          auto p = pool->Allocate();
          if (!p.ok()) { ++failures; continue; }
          mine.push_back(*p);
        }
        for (int32_t p : mine) if (!pool->Free(p).ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);  // 4 threads x 8 pages never exceed 64
  EXPECT_EQ(pool->used_pages(), 0);
}

}  // namespace
}  // namespace icecache::kvstore
