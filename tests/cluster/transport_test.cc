// Real UCX on loopback: two transports (each with its own ucp worker and progress thread) ship
// pages to each other; bytes are compared with what was sent.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"

namespace icecache::transport {
namespace {

using namespace std::chrono_literals;

// The token of transfer `id` in these tests (kTransferTokenBytes bytes).
std::string Tok(uint64_t id) {
  std::string t(kTransferTokenBytes, 'k');
  std::memcpy(t.data(), &id, sizeof(id));
  return t;
}

struct Case {
  const char* tls;
  bool peer_failure_detection;
};

class TransportTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    UcxOptions o{GetParam().tls, "lo", GetParam().peer_failure_detection};
    auto r = CreateUcxTransport(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    receiver_ = std::move(*r);
    auto s = CreateUcxTransport(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    sender_ = std::move(*s);
  }

  static std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  std::unique_ptr<Transport> receiver_;
  std::unique_ptr<Transport> sender_;
};

// Ships `pages` pages of `page_bytes` into one receiver-owned pool buffer, in a shuffled order
// and in two Send calls, and checks every byte landed where the sink put it.
void ShipAndVerify(Transport& sender, Transport& receiver, uint64_t id, size_t pages, size_t page_bytes) {
  std::vector<uint8_t> src(pages * page_bytes);
  std::mt19937 rng(static_cast<uint32_t>(id));
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  // The receiver places page i at slot (i * 7) % pages of its pool: a non-identity mapping.
  std::vector<uint8_t> pool(pages * page_bytes, 0);
  ASSERT_EQ(pages % 7 == 0, false);
  ASSERT_TRUE(receiver
                  .Expect(id, Tok(id),
                          [&](uint32_t index, size_t bytes) -> StatusOr<void*> {
                            if (index >= pages || bytes != page_bytes) return InvalidArgumentError("bad segment");
                            return static_cast<void*>(pool.data() + ((index * 7) % pages) * page_bytes);
                          })
                  .ok());
  std::vector<Segment> segs;
  for (uint32_t i = 0; i < pages; ++i) segs.push_back({i, src.data() + i * page_bytes, page_bytes});
  std::shuffle(segs.begin(), segs.end(), rng);
  auto deadline = Clock::now() + 30s;
  size_t half = segs.size() / 2;
  Status s1 = sender.Send(receiver.address(), id, Tok(id), std::span(segs).subspan(0, half), deadline);
  ASSERT_TRUE(s1.ok()) << s1.ToString();
  Status s2 = sender.Send(receiver.address(), id, Tok(id), std::span(segs).subspan(half), deadline);
  ASSERT_TRUE(s2.ok()) << s2.ToString();
  Status f = sender.Finish(receiver.address(), id, Tok(id), static_cast<uint32_t>(pages), deadline);
  ASSERT_TRUE(f.ok()) << f.ToString();
  Status w = receiver.Wait(id, deadline);
  ASSERT_TRUE(w.ok()) << w.ToString();
  for (size_t i = 0; i < pages; ++i) {
    ASSERT_EQ(0, std::memcmp(pool.data() + ((i * 7) % pages) * page_bytes, src.data() + i * page_bytes, page_bytes))
        << "page " << i;
  }
}

TEST_P(TransportTest, ShipsSmallPages) {
  // 4 KiB pages go eagerly (copied out of UCX buffers).
  ShipAndVerify(*sender_, *receiver_, 1, 100, 4096);
  EXPECT_EQ(receiver_->stats().bytes_received, 100u * 4096);
  EXPECT_EQ(sender_->stats().bytes_sent, 100u * 4096);
}

TEST_P(TransportTest, ShipsLargePagesZeroCopy) {
  // 1 MiB segments are above every rendezvous threshold: received directly into the pool.
  ShipAndVerify(*sender_, *receiver_, 2, 20, 1 << 20);
}

TEST_P(TransportTest, ConcurrentTransfersFromTwoSenders) {
  auto other = CreateUcxTransport(UcxOptions{GetParam().tls, "lo", GetParam().peer_failure_detection});
  ASSERT_TRUE(other.ok());
  std::thread a([&] { ShipAndVerify(*sender_, *receiver_, 10, 30, 256 << 10); });
  std::thread b([&] { ShipAndVerify(**other, *receiver_, 11, 50, 8192); });
  a.join();
  b.join();
  EXPECT_EQ(receiver_->stats().transfers_completed, 2u);
}

// Ships `segments` segments of `pages_per_segment` pages each; the receiver scatters every
// segment over pool pages in reverse order (page j of segment i -> pool page total-1-(i*pps+j)),
// so no two pieces of a segment are adjacent and UCX has to scatter (iov). Independent check: the
// byte-wise memcmp of every page against its source.
void ScatterAndVerify(Transport& sender, Transport& receiver, uint64_t id, size_t segments, size_t pages_per_segment,
                      size_t page_bytes) {
  const size_t total = segments * pages_per_segment;
  std::vector<uint8_t> src(total * page_bytes);
  std::mt19937 rng(static_cast<uint32_t>(id));
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> pool(total * page_bytes, 0);
  ASSERT_TRUE(receiver
                  .ExpectScatter(id, Tok(id),
                                 [&](uint32_t index, size_t bytes) -> StatusOr<std::vector<Destination>> {
                                   if (index >= segments || bytes != pages_per_segment * page_bytes) {
                                     return InvalidArgumentError("bad segment");
                                   }
                                   std::vector<Destination> d;
                                   for (size_t j = 0; j < pages_per_segment; ++j) {
                                     size_t page = total - 1 - (index * pages_per_segment + j);
                                     d.push_back({pool.data() + page * page_bytes, page_bytes});
                                   }
                                   return d;
                                 })
                  .ok());
  std::vector<Segment> segs;
  const size_t seg_bytes = pages_per_segment * page_bytes;
  for (uint32_t i = 0; i < segments; ++i) segs.push_back({i, src.data() + i * seg_bytes, seg_bytes});
  auto deadline = Clock::now() + 30s;
  Status s = sender.Send(receiver.address(), id, Tok(id), segs, deadline);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(sender.Finish(receiver.address(), id, Tok(id), static_cast<uint32_t>(segments), deadline).ok());
  Status w = receiver.Wait(id, deadline);
  ASSERT_TRUE(w.ok()) << w.ToString();
  for (size_t p = 0; p < total; ++p) {
    ASSERT_EQ(0, std::memcmp(pool.data() + (total - 1 - p) * page_bytes, src.data() + p * page_bytes, page_bytes))
        << "page " << p;
  }
}

TEST_P(TransportTest, ScattersSmallSegments) {
  // 3 pages of 1 KiB: eager, copied piece by piece.
  ScatterAndVerify(*sender_, *receiver_, 20, 40, 3, 1024);
}

TEST_P(TransportTest, ScattersLargeSegments) {
  // 64 pages of 16 KiB = 1 MiB per segment: rendezvous into an iov of 64 pieces.
  ScatterAndVerify(*sender_, *receiver_, 21, 6, 64, 16384);
}

TEST_P(TransportTest, AdjacentPiecesAreOneDestination) {
  // A sink that splits a segment into pieces that happen to be adjacent: merged, one receive.
  std::vector<uint8_t> pool(1 << 20, 0);
  ASSERT_TRUE(receiver_
                  ->ExpectScatter(22, Tok(22),
                                  [&](uint32_t, size_t bytes) -> StatusOr<std::vector<Destination>> {
                                    std::vector<Destination> d;
                                    for (size_t off = 0; off < bytes; off += 4096) d.push_back({pool.data() + off, 4096});
                                    return d;
                                  })
                  .ok());
  auto src = RandomBytes(1 << 20, 22);
  Segment seg{0, src.data(), src.size()};
  ASSERT_TRUE(sender_->Send(receiver_->address(), 22, Tok(22), std::span(&seg, 1), Clock::now() + 10s).ok());
  ASSERT_TRUE(sender_->Finish(receiver_->address(), 22, Tok(22), 1, Clock::now() + 10s).ok());
  ASSERT_TRUE(receiver_->Wait(22, Clock::now() + 10s).ok());
  EXPECT_EQ(pool, src);
}

TEST_P(TransportTest, ScatterOfTheWrongSizeIsRefused) {
  std::vector<uint8_t> pool(1 << 20);
  ASSERT_TRUE(receiver_
                  ->ExpectScatter(23, Tok(23),
                                  [&](uint32_t, size_t bytes) -> StatusOr<std::vector<Destination>> {
                                    return std::vector<Destination>{{pool.data(), bytes / 2}};
                                  })
                  .ok());
  auto src = RandomBytes(1 << 20, 23);
  Segment seg{0, src.data(), src.size()};
  Status s = sender_->Send(receiver_->address(), 23, Tok(23), std::span(&seg, 1), Clock::now() + 10s);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  Status w = receiver_->Wait(23, Clock::now() + 10s);
  EXPECT_EQ(w.code(), StatusCode::kAborted) << w.ToString();
  EXPECT_NE(w.message().find("sink gave 524288 bytes for a segment of 1048576"), std::string::npos) << w.message();
}

TEST_P(TransportTest, StalledTransferTimesOut) {
  std::vector<uint8_t> pool(8 * 65536);
  ASSERT_TRUE(receiver_->Expect(3, Tok(3), [&](uint32_t i, size_t bytes) -> StatusOr<void*> {
    return static_cast<void*>(pool.data() + i * 65536);
  }).ok());
  auto src = RandomBytes(4 * 65536, 3);
  std::vector<Segment> segs;
  for (uint32_t i = 0; i < 4; ++i) segs.push_back({i, src.data() + i * 65536, 65536});
  ASSERT_TRUE(sender_->Send(receiver_->address(), 3, Tok(3), segs, Clock::now() + 10s).ok());
  // The sender announces 8 segments but only 4 arrive.
  ASSERT_TRUE(sender_->Finish(receiver_->address(), 3, Tok(3), 8, Clock::now() + 10s).ok());
  Status w = receiver_->Wait(3, Clock::now() + 300ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded) << w.ToString();
  EXPECT_NE(w.message().find("4 segments arrived of 8"), std::string::npos) << w.message();
  EXPECT_EQ(receiver_->stats().transfers_failed, 1u);
  // The transfer is forgotten: late large segments are refused, the sender hears of it.
  Status late = sender_->Send(receiver_->address(), 3, Tok(3), std::span(segs).subspan(0, 1), Clock::now() + 10s);
  EXPECT_FALSE(late.ok());
}

TEST_P(TransportTest, NoFinishTimesOut) {
  std::vector<uint8_t> pool(4096);
  ASSERT_TRUE(receiver_->Expect(4, Tok(4), [&](uint32_t, size_t) -> StatusOr<void*> { return (void*)pool.data(); }).ok());
  Status w = receiver_->Wait(4, Clock::now() + 100ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("end not announced"), std::string::npos) << w.message();
}

TEST_P(TransportTest, RefusedSegmentFailsBothSides) {
  std::vector<uint8_t> pool(65536);
  ASSERT_TRUE(receiver_->Expect(5, Tok(5), [&](uint32_t i, size_t bytes) -> StatusOr<void*> {
    if (bytes > pool.size()) return ResourceExhaustedError("segment larger than a page");
    return static_cast<void*>(pool.data());
  }).ok());
  auto src = RandomBytes(1 << 20, 5);
  Segment seg{0, src.data(), src.size()};
  Status s = sender_->Send(receiver_->address(), 5, Tok(5), std::span(&seg, 1), Clock::now() + 10s);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  Status w = receiver_->Wait(5, Clock::now() + 10s);
  EXPECT_EQ(w.code(), StatusCode::kAborted) << w.ToString();
  EXPECT_NE(w.message().find("segment larger than a page"), std::string::npos);
}

TEST_P(TransportTest, CancelEndsWait) {
  ASSERT_TRUE(receiver_->Expect(6, Tok(6), [](uint32_t, size_t) -> StatusOr<void*> { return nullptr; }).ok());
  std::thread canceller([&] {
    std::this_thread::sleep_for(50ms);
    receiver_->Cancel(6);
  });
  Status w = receiver_->Wait(6, Clock::now() + 60s);
  canceller.join();
  EXPECT_EQ(w.code(), StatusCode::kCancelled) << w.ToString();
  EXPECT_EQ(receiver_->Wait(6, Clock::now()).code(), StatusCode::kNotFound);
}

TEST_P(TransportTest, DuplicateExpectIsRejected) {
  ASSERT_TRUE(receiver_->Expect(7, Tok(7), [](uint32_t, size_t) -> StatusOr<void*> { return nullptr; }).ok());
  EXPECT_EQ(receiver_->Expect(7, Tok(7), [](uint32_t, size_t) -> StatusOr<void*> { return nullptr; }).code(),
            StatusCode::kAlreadyExists);
  receiver_->Cancel(7);
  EXPECT_EQ(receiver_->Wait(7, Clock::now()).code(), StatusCode::kCancelled);
}

TEST_P(TransportTest, DeadPeerIsAnError) {
  std::string address = receiver_->address();
  receiver_.reset();
  auto src = RandomBytes(1 << 20, 8);
  Segment seg{0, src.data(), src.size()};
  // With failure detection the error is immediate; without, the deadline ends the send.
  Status s = sender_->Send(address, 8, Tok(8), std::span(&seg, 1), Clock::now() + 2s);
  EXPECT_FALSE(s.ok());
  if (!s.ok() && !GetParam().peer_failure_detection) {
    // The stale endpoint was dropped (force-closed) at the deadline, or failed on connect.
    EXPECT_TRUE(s.code() == StatusCode::kDeadlineExceeded || s.code() == StatusCode::kUnavailable) << s.ToString();
  }
  // Whatever the failure mode, the sender is usable afterwards for a live peer.
  auto fresh = CreateUcxTransport(UcxOptions{GetParam().tls, "lo", GetParam().peer_failure_detection});
  ASSERT_TRUE(fresh.ok());
  ShipAndVerify(*sender_, **fresh, 9, 10, 65536);
}

// The sender check: a third endpoint that knows the transfer id but not its token sends
// segments (same indices as the owner's, other bytes) and Finish messages. Nothing of it reaches
// the sink or the memory, every message is counted, the stranger cannot end or fail the transfer,
// and the owner's transfer completes byte for byte. Small (eager) and large (rendezvous) segments.
void StrangerIsRefused(Transport& owner, Transport& stranger, Transport& receiver, uint64_t id, size_t pages,
                       size_t page_bytes) {
  const uint64_t refused_before = receiver.stats().segments_refused;
  std::vector<uint8_t> pool(pages * page_bytes, 0);
  std::atomic<int> sink_calls{0};
  ASSERT_TRUE(receiver
                  .Expect(id, Tok(id),
                          [&](uint32_t index, size_t bytes) -> StatusOr<void*> {
                            ++sink_calls;
                            if (index >= pages || bytes != page_bytes) return InvalidArgumentError("bad segment");
                            return static_cast<void*>(pool.data() + index * page_bytes);
                          })
                  .ok());
  std::string wrong = Tok(id);
  wrong[15] ^= 0x5a;  // one byte off: the same id, another token
  const std::vector<uint8_t> junk(pages * page_bytes, 0xEE);
  std::vector<Segment> bad;
  for (uint32_t i = 0; i < pages; ++i) bad.push_back({i, junk.data() + i * page_bytes, page_bytes});
  auto deadline = Clock::now() + 30s;
  // A stranger's Finish(0) would end the transfer at once with nothing received if it counted.
  EXPECT_TRUE(stranger.Finish(receiver.address(), id, wrong, 0, deadline).ok());
  Status sb = stranger.Send(receiver.address(), id, wrong, bad, deadline);
  // Small segments are dropped without a word to the sender; a rendezvous one is refused.
  if (page_bytes >= (1u << 20)) {
    EXPECT_EQ(sb.code(), StatusCode::kFailedPrecondition) << sb.ToString();
  } else {
    EXPECT_TRUE(sb.ok()) << sb.ToString();
  }
  EXPECT_TRUE(stranger.Finish(receiver.address(), id, wrong, static_cast<uint32_t>(pages), deadline).ok());
  // The receiver handles messages on its progress thread: wait (bounded) until it has seen all.
  const uint64_t expected = refused_before + pages + 2;
  while (receiver.stats().segments_refused < expected && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(receiver.stats().segments_refused, expected);
  EXPECT_EQ(sink_calls.load(), 0) << "a stranger's segment reached the sink";
  EXPECT_TRUE(std::all_of(pool.begin(), pool.end(), [](uint8_t b) { return b == 0; })) << "a stranger's bytes landed";

  // The owner ships the real pages; the transfer completes with exactly them.
  std::vector<uint8_t> src(pages * page_bytes);
  std::mt19937 rng(static_cast<uint32_t>(id));
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<Segment> good;
  for (uint32_t i = 0; i < pages; ++i) good.push_back({i, src.data() + i * page_bytes, page_bytes});
  Status s = owner.Send(receiver.address(), id, Tok(id), good, deadline);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(owner.Finish(receiver.address(), id, Tok(id), static_cast<uint32_t>(pages), deadline).ok());
  Status w = receiver.Wait(id, deadline);
  ASSERT_TRUE(w.ok()) << w.ToString();
  EXPECT_EQ(pool, src);
  EXPECT_EQ(sink_calls.load(), static_cast<int>(pages));
}

TEST_P(TransportTest, StrangerWithTheIdButNotTheTokenIsRefusedSmallSegments) {
  auto stranger = CreateUcxTransport(UcxOptions{GetParam().tls, "lo", GetParam().peer_failure_detection});
  ASSERT_TRUE(stranger.ok());
  StrangerIsRefused(*sender_, **stranger, *receiver_, 40, 16, 4096);
  EXPECT_EQ(receiver_->stats().transfers_failed, 0u);
  EXPECT_EQ(receiver_->stats().bytes_received, 16u * 4096);
}

TEST_P(TransportTest, StrangerWithTheIdButNotTheTokenIsRefusedLargeSegments) {
  auto stranger = CreateUcxTransport(UcxOptions{GetParam().tls, "lo", GetParam().peer_failure_detection});
  ASSERT_TRUE(stranger.ok());
  StrangerIsRefused(*sender_, **stranger, *receiver_, 41, 6, 1 << 20);
  EXPECT_EQ(receiver_->stats().transfers_failed, 0u);
  EXPECT_EQ(receiver_->stats().bytes_received, 6u << 20);
}

// A stranger's Finish neither ends nor fails a transfer: with no owner message the transfer
// stalls to its deadline ("end not announced", nothing received) although Finish(0) was sent.
TEST_P(TransportTest, StrangerFinishIsIgnored) {
  auto stranger = CreateUcxTransport(UcxOptions{GetParam().tls, "lo", GetParam().peer_failure_detection});
  ASSERT_TRUE(stranger.ok());
  ASSERT_TRUE(receiver_->Expect(42, Tok(42), [](uint32_t, size_t) -> StatusOr<void*> { return nullptr; }).ok());
  ASSERT_TRUE((*stranger)->Finish(receiver_->address(), 42, Tok(43), 0, Clock::now() + 10s).ok());
  const auto until = Clock::now() + 30s;
  while (receiver_->stats().segments_refused < 1 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(receiver_->stats().segments_refused, 1u);
  Status w = receiver_->Wait(42, Clock::now() + 200ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded) << w.ToString();
  EXPECT_NE(w.message().find("0 segments arrived, end not announced"), std::string::npos) << w.message();
}

// Tokens are always required, of exactly kTransferTokenBytes bytes.
TEST_P(TransportTest, TokenOfTheWrongLengthIsInvalidArgument) {
  auto none = [](uint32_t, size_t) -> StatusOr<void*> { return nullptr; };
  EXPECT_EQ(receiver_->Expect(43, "", none).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Expect(43, std::string(17, 'x'), none).code(), StatusCode::kInvalidArgument);
  uint8_t byte = 1;
  Segment seg{0, &byte, 1};
  EXPECT_EQ(sender_->Send(receiver_->address(), 43, "short", std::span(&seg, 1), Clock::now() + 10s).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->Finish(receiver_->address(), 43, "", 1, Clock::now() + 10s).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(receiver_->Wait(43, Clock::now()).code(), StatusCode::kNotFound);  // never registered
}

INSTANTIATE_TEST_SUITE_P(Loopback, TransportTest,
                         ::testing::Values(Case{"tcp,sm,self", false}, Case{"tcp", false},
                                           Case{"sm,self", false}, Case{"tcp", true}),
                         [](const auto& info) {
                           std::string n = info.param.tls;
                           if (info.param.peer_failure_detection) n += "_peer_failure_detection";
                           for (auto& c : n) if (c == ',') c = '_';
                           return n;
                         });

TEST(TransportOptions, UnknownTransportIsAnError) {
  auto t = CreateUcxTransport(UcxOptions{"no_such_transport", ""});
  EXPECT_FALSE(t.ok());
}

}  // namespace
}  // namespace icecache::transport
