// The engines under transport faults: a real prefill engine ships real KV over real UCX on
// loopback into a real decode engine, through FaultInjectionTransport wrappers that fail sends,
// lose the end-of-transfer announcement or fail the receive. Whatever fails, the decode engine
// holds nothing afterwards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "decode_worker/decode_engine.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "prefill_worker/prefill_engine.h"
#include "transport/fault_injection.h"

namespace icecache::transport {
namespace {

using namespace std::chrono_literals;

class TransportFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = ::testing::TempDir() + "/icecache_fault_model_" + std::to_string(getpid());
    if (!std::filesystem::exists(dir + "/config.json")) {
      model::RandomModelSpec spec;
      spec.hidden = 64;
      spec.layers = 2;
      spec.heads = 4;
      spec.kv_heads = 2;
      spec.vocab = 300;
      spec.max_position = 1024;
      ASSERT_TRUE(model::WriteRandomCheckpoint(dir, spec).ok());
    }
    model_ = model::Model::Load(dir).value();
    UcxOptions o{"tcp,sm,self", "lo", false};
    decode_ucx_ = CreateUcxTransport(o).value();
    prefill_ucx_ = CreateUcxTransport(o).value();
    decode_faults_ = std::make_unique<FaultInjectionTransport>(decode_ucx_.get());
    prefill_faults_ = std::make_unique<FaultInjectionTransport>(prefill_ucx_.get());
    decode::DecodeEngineOptions d;
    d.pool_pages = 2000;
    decode_ = decode::DecodeEngine::Create(model_.get(), decode_faults_.get(), d).value();
    prefill::PrefillEngineOptions p;
    p.transfer_timeout_seconds = 10;
    prefill_ = std::make_unique<prefill::PrefillEngine>(model_.get(), prefill_faults_.get(), p);
  }
  void TearDown() override {
    prefill_.reset();
    decode_.reset();
  }

  StatusOr<prefill::PrefillResult> Prefill(const decode::Admission& a, int n) {
    prefill::PrefillJob job;
    for (int i = 0; i < n; ++i) job.tokens.push_back(1 + (i * 7) % 250);
    job.build_index = false;
    job.peer = decode_->transport_address();
    job.transfer_id = a.id;
    job.token = a.token;
    return prefill_->Run(std::move(job));
  }
  StatusOr<std::shared_ptr<decode::TokenStream>> Start(const decode::Admission& a, Clock::duration wait) {
    decode::DecodeParams params;
    params.first_token = 3;
    params.sampling.max_tokens = 4;
    return decode_->Start(a.id, a.token, params, Clock::now() + wait);
  }
  void ExpectIdle() {
    auto s = decode_->stats();
    EXPECT_EQ(s.used_pages, 0);
    EXPECT_EQ(s.committed_pages, 0);
    EXPECT_EQ(s.active_sequences, 0);
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<Transport> decode_ucx_, prefill_ucx_;
  std::unique_ptr<FaultInjectionTransport> decode_faults_, prefill_faults_;
  std::unique_ptr<decode::DecodeEngine> decode_;
  std::unique_ptr<prefill::PrefillEngine> prefill_;
};

TEST_F(TransportFaultTest, CleanPathDecodes) {
  auto a = decode_->Reserve(40, 4, 0).value();
  ASSERT_TRUE(Prefill(a, 40).ok());
  auto stream = Start(a, 10s);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  decode::DecodeUpdate u;
  std::vector<int32_t> tokens;
  while ((*stream)->Next(&u, 10s)) {
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.done) break;
  }
  EXPECT_TRUE(u.done && u.status.ok()) << u.status.ToString();
  EXPECT_EQ(tokens.size(), 3u);  // max_tokens 4, the first came from prefill
  ExpectIdle();
}

TEST_F(TransportFaultTest, FailedSendLeavesNothingAfterRelease) {
  auto a = decode_->Reserve(40, 4, 0).value();
  prefill_faults_->set_plan(FaultPlan{UnavailableError("injected: peer unreachable"), {}, {}, {}});
  auto r = Prefill(a, 40);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_TRUE(decode_->Release(a.id, a.token).ok());  // what the router does on a failed prefill
  ExpectIdle();
}

TEST_F(TransportFaultTest, LostEndOfTransferTimesOutAndFreesTheLandedPages) {
  auto a = decode_->Reserve(40, 4, 0).value();
  prefill_faults_->set_plan(FaultPlan{{}, UnavailableError("injected: Finish lost"), {}, {}});
  EXPECT_FALSE(Prefill(a, 40).ok());
  EXPECT_GT(decode_->stats().used_pages, 0) << "the pages should have landed";
  auto stream = Start(a, 300ms);
  EXPECT_EQ(stream.status().code(), StatusCode::kDeadlineExceeded) << stream.status().ToString();
  ExpectIdle();
}

TEST_F(TransportFaultTest, FailedReceiveAfterTheKvLandedFreesIt) {
  auto a = decode_->Reserve(40, 4, 0).value();
  ASSERT_TRUE(Prefill(a, 40).ok());
  decode_faults_->set_plan(FaultPlan{{}, {}, DataLossError("injected: receive failed"), {}});
  auto stream = Start(a, 10s);
  EXPECT_EQ(stream.status().code(), StatusCode::kDataLoss) << stream.status().ToString();
  ExpectIdle();
}

TEST_F(TransportFaultTest, SlowPeerStillDelivers) {
  auto a = decode_->Reserve(40, 4, 0).value();
  prefill_faults_->set_plan(FaultPlan{{}, {}, {}, 200ms});
  ASSERT_TRUE(Prefill(a, 40).ok());
  auto stream = Start(a, 30s);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  decode::DecodeUpdate u;
  while ((*stream)->Next(&u, 10s) && !u.done) {
  }
  EXPECT_TRUE(u.done && u.status.ok()) << u.status.ToString();
  ExpectIdle();
}

// Polls `done` every 20 ms for up to `seconds`.
bool WaitFor(const std::function<bool()>& done, double seconds) {
  const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

// The reservation clock starts when its prefill starts: a reservation whose prefill has not
// begun outlives the 1 s reservation timeout (it waits up to its prefill_wait); once the prefill
// worker's start notice has arrived, the timeout runs, and a reservation nobody decodes is
// dropped with all its pages.
TEST_F(TransportFaultTest, ReservationClockStartsWhenItsPrefillStarts) {
  decode_.reset();
  decode::DecodeEngineOptions d;
  d.pool_pages = 2000;
  d.reservation_timeout_seconds = 1;
  decode_ = decode::DecodeEngine::Create(model_.get(), decode_faults_.get(), d).value();
  auto a = decode_->Reserve(40, 4, 0, /*prefill_wait_seconds=*/120).value();
  std::this_thread::sleep_for(2500ms);  // the reaper runs every second
  EXPECT_EQ(decode_->stats().active_sequences, 1) << "expired before its prefill started";
  ASSERT_TRUE(Prefill(a, 40).ok());  // sends the start notice, then the KV; no Decode follows
  EXPECT_TRUE(WaitFor([&] { return decode_->stats().active_sequences == 0; }, 30))
      << "a prefilled reservation nobody decodes must expire reservation_timeout_seconds after its prefill started";
  ExpectIdle();
}

// Without a start notice the reservation waits its prefill_wait, then goes.
TEST_F(TransportFaultTest, ReservationWithoutPrefillExpiresAfterItsPrefillWait) {
  auto a = decode_->Reserve(40, 4, 0, /*prefill_wait_seconds=*/0.3);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(WaitFor([&] { return decode_->stats().active_sequences == 0; }, 30));
  ExpectIdle();
  EXPECT_EQ(decode_->Release(a->id, a->token).code(), StatusCode::kNotFound);
}

// A prefill worker stuck mid-shipment (the plan forwards the start notice, the metadata and two
// one-page runs, then the sender stalls and fails UNAVAILABLE) leaves the half shipment's pages
// in the reservation. What the router does then: Release (the pages go back to the pool at
// once), and a fresh reservation that a working prefill fills, which decodes.
TEST_F(TransportFaultTest, HalfShipmentIsFreedAndAFreshReservationDecodes) {
  prefill_.reset();
  prefill::PrefillEngineOptions p;
  p.transfer_timeout_seconds = 10;
  p.max_segment_bytes = 1;  // one page per segment
  prefill_ = std::make_unique<prefill::PrefillEngine>(model_.get(), prefill_faults_.get(), p);
  auto a = decode_->Reserve(40, 4, 0).value();
  FaultPlan stall;
  stall.stall_after_segments = 4;
  prefill_faults_->set_plan(stall);
  auto r = Prefill(a, 40);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("stalled after 4 segments"), std::string::npos) << r.status().ToString();
  // Small segments may still be on their way when Send returns.
  EXPECT_TRUE(WaitFor([&] { return decode_->stats().used_pages == 2; }, 30)) << decode_->stats().used_pages;
  EXPECT_TRUE(decode_->Release(a.id, a.token).ok());
  ExpectIdle();

  prefill_faults_->set_plan(FaultPlan{});
  auto b = decode_->Reserve(40, 4, 0).value();
  ASSERT_TRUE(Prefill(b, 40).ok());
  auto stream = Start(b, 10s);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  decode::DecodeUpdate u;
  std::vector<int32_t> tokens;
  while ((*stream)->Next(&u, 10s)) {
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.done) break;
  }
  EXPECT_TRUE(u.done && u.status.ok()) << u.status.ToString();
  EXPECT_EQ(tokens.size(), 3u);
  ExpectIdle();
}

// Draining: prompts after StopAdmitting are refused with UNAVAILABLE (the router tries another
// prefill worker) and nothing is shipped.
TEST_F(TransportFaultTest, DrainingPrefillEngineRefusesPromptsWithUnavailable) {
  auto a = decode_->Reserve(40, 4, 0).value();
  prefill_->StopAdmitting();
  auto r = Prefill(a, 40);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_NE(r.status().message().find("draining"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(decode_->stats().used_pages, 0);
  EXPECT_TRUE(decode_->Release(a.id, a.token).ok());
  ExpectIdle();
}

}  // namespace
}  // namespace icecache::transport
