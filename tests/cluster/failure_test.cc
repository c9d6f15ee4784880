// Failure paths of a live loopback cluster (real router, prefill and decode servers, real gRPC
// and UCX): nothing a failed or hostile request did stays held, and one bad sequence fails alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "icecache/v1/generation.grpc.pb.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "serving/grpc_util.h"
#include "client/client.h"
#include "router/request_checks.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/cluster/free_ports.h"
#include "tests/cluster/process_util.h"
#include "transport/kv_shipping.h"

namespace icecache::testing {
namespace {

using router::RemoteChunk;
using router::RemoteGenerateOptions;

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 300);
  return ids;
}

struct Result {
  Status status;
  std::vector<int32_t> tokens;
};

Result Generate(const std::string& router, RemoteGenerateOptions o, std::atomic<int>* streamed = nullptr) {
  o.router = router;
  Result r;
  r.status = router::RunRemoteGenerate(o, [&](const RemoteChunk& c) {
    r.tokens.insert(r.tokens.end(), c.token_ids.begin(), c.token_ids.end());
    if (streamed) *streamed = static_cast<int>(r.tokens.size());
    return true;
  });
  return r;
}

// Nothing held: no KV pages, no admission estimate, no live sequence.
void ExpectDecodeIdle(const decode::DecodeServer& d) {
  auto s = d.stats();
  EXPECT_EQ(s.used_pages, 0);
  EXPECT_EQ(s.committed_pages, 0);
  EXPECT_EQ(s.active_sequences, 0);
}

// A hostile internal client: Reserve on the decode worker, Prefill (ships real KV into it),
// then Decode with `first_token` and `temperature`. Returns the Decode status.
grpc::Status ReservePrefillDecode(LoopbackCluster& c, int32_t first_token, float temperature,
                                  int64_t* used_pages_before_decode) {
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(c.decode[0]->address()));
  auto pre = v1::PrefillWorker::NewStub(cluster::MakeChannel(c.prefill[0]->address()));
  const std::vector<int32_t> prompt = Prompt(40, 3);
  v1::ReserveRequest rr;
  rr.set_prompt_tokens(static_cast<int32_t>(prompt.size()));
  rr.set_max_tokens(8);
  rr.mutable_cache()->set_full(true);
  v1::ReserveResponse reserved;
  {
    grpc::ClientContext ctx;
    grpc::Status s = dec->Reserve(&ctx, rr, &reserved);
    if (!s.ok()) return s;
  }
  {
    grpc::ClientContext ctx;
    v1::PrefillRequest pr;
    pr.mutable_token_ids()->Add(prompt.begin(), prompt.end());
    pr.set_sequence_id(reserved.sequence_id());
    pr.set_decode_transport_address(reserved.transport_address());
    pr.set_reservation_token(reserved.reservation_token());
    pr.set_build_index(false);
    v1::PrefillResponse presp;
    grpc::Status s = pre->Prefill(&ctx, pr, &presp);
    if (!s.ok()) return s;
  }
  *used_pages_before_decode = c.decode[0]->stats().used_pages;
  grpc::ClientContext ctx;
  v1::DecodeRequest dr;
  dr.set_sequence_id(reserved.sequence_id());
  dr.set_reservation_token(reserved.reservation_token());
  dr.set_first_token(first_token);
  dr.set_max_tokens(8);
  dr.mutable_sampling()->set_temperature(temperature);
  auto reader = dec->Decode(&ctx, dr);
  v1::DecodeResponse resp;
  while (reader->Read(&resp)) {
  }
  return reader->Finish();
}

class ClusterFailureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/icecache_cluster_model_failure");
    // /metrics: router on metrics_base_, the prefill worker on +1, the decode worker on +2.
    metrics_base_ = FreePortRange(3, 0xfa11);
    ASSERT_GT(metrics_base_, 0);
    cluster_ = LoopbackCluster::Start(*dir_, 1, 1, "tcp,sm,self", true, metrics_base_).release();
    ASSERT_NE(cluster_, nullptr);
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static double DecodeMetric(const std::string& name) { return MetricValue(Scrape(metrics_base_ + 2), name); }
  static std::string* dir_;
  static LoopbackCluster* cluster_;
  static int metrics_base_;
};
std::string* ClusterFailureTest::dir_ = nullptr;
LoopbackCluster* ClusterFailureTest::cluster_ = nullptr;
int ClusterFailureTest::metrics_base_ = 0;

// temperature = +inf or top_p = NaN used to pass the router, prefill, ship, fail in Decode and
// leave the reservation held for 120 s. Now the router refuses them before any Reserve.
TEST_F(ClusterFailureTest, NonFiniteSamplingIsRefusedBeforeAnyReserve) {
  const int64_t reservations = cluster_->decode[0]->stats().reservations;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float temperature, top_p;
    int top_k;
    const char* needle;
  };
  for (const Case& k : {Case{inf, 1.f, 0, "temperature"}, Case{-inf, 1.f, 0, "temperature"},
                        Case{nan, 1.f, 0, "temperature"}, Case{1.f, nan, 0, "top_p"}, Case{1.f, 1.5f, 0, "top_p"},
                        Case{1.f, -0.1f, 0, "top_p"}, Case{1.f, inf, 0, "top_p"}, Case{1.f, 1.f, -3, "top_k"}}) {
    RemoteGenerateOptions o;
    o.prompt_ids = Prompt(20, 1);
    o.max_tokens = 4;
    o.temperature = k.temperature;
    o.top_p = k.top_p;
    o.top_k = k.top_k;
    Result r = Generate(cluster_->router->address(), o);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << k.temperature << " " << k.top_p << ": "
                                                             << r.status.ToString();
    EXPECT_NE(r.status.message().find(k.needle), std::string::npos) << r.status.message();
  }
  EXPECT_EQ(cluster_->decode[0]->stats().reservations, reservations) << "a refused request reached Reserve";
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// Decode refusing its arguments after the KV has landed frees the pages before the call returns
// (no polling: the stats are read right after the call).
TEST_F(ClusterFailureTest, DecodeThatRefusesItsArgumentsFreesTheReservationAtOnce) {
  int64_t used_before = 0;
  grpc::Status s = ReservePrefillDecode(*cluster_, /*first_token=*/999999, 0.f, &used_before);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("first_token"), std::string::npos) << s.error_message();
  EXPECT_GT(used_before, 0) << "the prefilled KV should have landed before Decode";
  ExpectDecodeIdle(*cluster_->decode[0]);

  s = ReservePrefillDecode(*cluster_, 1, std::numeric_limits<float>::quiet_NaN(), &used_before);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_GT(used_before, 0);
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// The probe: Reserve + Prefill + Decode(first_token = 999999) on the worker that decodes
// another client's stream. The probe fails alone; the other stream completes with exactly the
// tokens of a single-process greedy run.
TEST_F(ClusterFailureTest, PoisonedSequenceFailsAloneAndTheBatchContinues) {
  const std::vector<int32_t> prompt = Prompt(30, 11);
  constexpr int kTokens = 120;
  std::atomic<int> streamed{0};
  Result good;
  std::thread t([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = prompt;
    o.max_tokens = kTokens;
    o.ignore_eos = true;
    o.budget_pages = 0;
    good = Generate(cluster_->router->address(), o, &streamed);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (streamed < 3 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(streamed.load(), 3) << "the good stream never started";
  int64_t used_before = 0;
  grpc::Status s = ReservePrefillDecode(*cluster_, 999999, 0.f, &used_before);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_LT(streamed.load(), kTokens) << "the good stream ended before the probe: the test proves nothing";
  t.join();
  ASSERT_TRUE(good.status.ok()) << good.status.ToString();
  EXPECT_EQ(good.tokens, SingleProcessGreedy(*dir_, prompt, kTokens));
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// A prefill that fails after Reserve (the prefill worker is gone, and does not come back within
// router.retry_wait_seconds) releases the reservation on the decode worker before the client
// hears the error.
TEST(ClusterPrefillDown, PrefillFailureReleasesTheReservationAtOnce) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self",
                                  true, 0, 60000, "reference", "f32",
                                  [](cluster::ClusterConfig& cfg) { cfg.router.retry_wait_seconds = 0.5; });
  ASSERT_NE(c, nullptr);
  c->prefill[0]->Shutdown();
  const int64_t reservations = c->decode[0]->stats().reservations;
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(20, 5);
  o.max_tokens = 4;
  Result r = Generate(c->router->address(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kUnavailable) << r.status.ToString();
  EXPECT_NE(r.status.message().find("prefill"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("no prefill worker became ready within 0.5 s (router.retry_wait_seconds)"),
            std::string::npos)
      << r.status.message();
  EXPECT_EQ(c->decode[0]->stats().reservations, reservations + 1) << "the request should have reserved";
  ExpectDecodeIdle(*c->decode[0]);
}

TEST(RequestChecks, FirstInvalidUtf8) {
  using router::FirstInvalidUtf8;
  EXPECT_EQ(FirstInvalidUtf8(""), -1);
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), -1);
  EXPECT_EQ(FirstInvalidUtf8("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"), -1);  // é € 😀
  EXPECT_EQ(FirstInvalidUtf8("ab\xff"), 2);
  EXPECT_EQ(FirstInvalidUtf8("ab\xc3"), 2);              // truncated
  EXPECT_EQ(FirstInvalidUtf8("\xc0\xaf"), 0);            // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xe0\x80\xaf"), 1);        // overlong, 3 bytes
  EXPECT_EQ(FirstInvalidUtf8("\xed\xa0\x80"), 1);        // surrogate U+D800
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 1);    // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("x\xe2\x82y"), 3);          // bad continuation
  EXPECT_EQ(FirstInvalidUtf8("\x80"), 0);                // lone continuation
}

// Text fields are checked at the router, not by the protobuf parser: invalid UTF-8 used to come
// back as INTERNAL with an empty message.
TEST_F(ClusterFailureTest, InvalidUtf8IsInvalidArgumentNamingTheByte) {
  RemoteGenerateOptions o;
  o.prompt = std::string("hello \xff world");
  o.max_tokens = 2;
  Result r = Generate(cluster_->router->address(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
  EXPECT_NE(r.status.message().find("prompt text is not valid UTF-8: byte 6 (0xff)"), std::string::npos)
      << r.status.message();
  o.prompt = "hello";
  o.stop = {"ok", std::string("\xc3(")};
  r = Generate(cluster_->router->address(), o);
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
  EXPECT_NE(r.status.message().find("stop[1] is not valid UTF-8"), std::string::npos) << r.status.message();
}

TEST_F(ClusterFailureTest, StopStringsPromptBytesAndMessagesAreBounded) {
  const auto& limits = cluster_->config.limits;
  auto expect = [&](RemoteGenerateOptions o, StatusCode code, const std::string& needle) {
    o.max_tokens = 2;
    Result r = Generate(cluster_->router->address(), o);
    EXPECT_EQ(r.status.code(), code) << r.status.ToString();
    EXPECT_NE(r.status.message().find(needle), std::string::npos) << r.status.message();
  };
  RemoteGenerateOptions o;
  o.prompt = "hello";
  o.stop.assign(limits.max_stop_strings + 1, "x");
  expect(o, StatusCode::kInvalidArgument, "limits.max_stop_strings");
  o.stop = {std::string(limits.max_stop_string_bytes + 1, 'x')};
  expect(o, StatusCode::kInvalidArgument, "limits.max_stop_string_bytes");
  o.stop = {"a", ""};
  expect(o, StatusCode::kInvalidArgument, "stop[1] is empty");
  o.stop.clear();
  o.stop_ids.assign(limits.max_stop_token_ids + 1, 5);
  expect(o, StatusCode::kInvalidArgument, "limits.max_stop_token_ids");
  o.stop_ids.clear();
  // One byte over the prompt limit: refused by size, before the tokenizer sees it (the text is
  // not even valid UTF-8 at its end, and the size error comes first).
  o.prompt = std::string(limits.max_prompt_bytes, 'a') + "\xff";
  expect(o, StatusCode::kInvalidArgument, "limits.max_prompt_bytes");
  // A message over limits.max_message_bytes is refused by gRPC itself, on the router ...
  o.prompt = std::string(limits.max_message_bytes + 1, 'a');
  expect(o, StatusCode::kResourceExhausted, "");
  // ... and on the internal plane.
  auto pre = v1::PrefillWorker::NewStub(cluster::MakeChannel(cluster_->prefill[0]->address()));
  v1::PrefillRequest pr;
  pr.set_request_id(std::string(limits.max_message_bytes + 1, 'r'));
  pr.add_token_ids(1);
  v1::PrefillResponse presp;
  grpc::ClientContext ctx;
  grpc::Status s = pre->Prefill(&ctx, pr, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// ---- Trust on the internal plane: unguessable ids and per-reservation tokens ----------------

v1::ReserveResponse ReserveOn(v1::DecodeWorker::Stub& dec, int prompt_tokens, int max_tokens) {
  v1::ReserveRequest rr;
  rr.set_prompt_tokens(prompt_tokens);
  rr.set_max_tokens(max_tokens);
  rr.mutable_cache()->set_full(true);
  v1::ReserveResponse reserved;
  grpc::ClientContext ctx;
  grpc::Status s = dec.Reserve(&ctx, rr, &reserved);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return reserved;
}

grpc::Status ReleaseOn(v1::DecodeWorker::Stub& dec, uint64_t id, const std::string& token) {
  v1::ReleaseRequest rel;
  rel.set_sequence_id(id);
  rel.set_reservation_token(token);
  v1::ReleaseResponse ignored;
  grpc::ClientContext ctx;
  return dec.Release(&ctx, rel, &ignored);
}

grpc::Status DecodeOn(v1::DecodeWorker::Stub& dec, uint64_t id, const std::string& token, double kv_wait = 5) {
  v1::DecodeRequest dr;
  dr.set_sequence_id(id);
  dr.set_reservation_token(token);
  dr.set_first_token(1);
  dr.set_max_tokens(4);
  dr.set_kv_wait_seconds(kv_wait);
  grpc::ClientContext ctx;
  auto reader = dec.Decode(&ctx, dr);
  v1::DecodeResponse resp;
  while (reader->Read(&resp)) {
  }
  return reader->Finish();
}

// The probe: Release(1..2000) without a token, sent to the decode worker of another
// client's stream, used to cancel it. Ids are now random and Release needs the token.
TEST_F(ClusterFailureTest, ReleaseProbeOfSmallIdsCancelsNothing) {
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(cluster_->decode[0]->address()));
  const std::vector<int32_t> prompt = Prompt(25, 21);
  constexpr int kTokens = 1000;  // long enough to outlast the probe
  std::atomic<int> streamed{0};
  Result good;
  std::thread t([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = prompt;
    o.max_tokens = kTokens;
    o.ignore_eos = true;
    o.budget_pages = 0;
    good = Generate(cluster_->router->address(), o, &streamed);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (streamed < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::atomic<int> not_found{0};
  std::vector<std::thread> probes;
  for (int p = 0; p < 4; ++p) {
    probes.emplace_back([&, p] {
      for (uint64_t id = 1 + p; id <= 2000; id += 4) {
        grpc::Status s = ReleaseOn(*dec, id, "");
        not_found += s.error_code() == grpc::StatusCode::NOT_FOUND;
      }
    });
  }
  for (auto& probe : probes) probe.join();
  EXPECT_EQ(not_found.load(), 2000);
  EXPECT_LT(streamed.load(), kTokens) << "the good stream ended before the probe: the test proves nothing";
  t.join();
  ASSERT_TRUE(good.status.ok()) << good.status.ToString();
  EXPECT_EQ(good.tokens, SingleProcessGreedy(*dir_, prompt, kTokens));
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// Knowing the id is not enough: a wrong token is PERMISSION_DENIED for Release and Decode and
// leaves the reservation as it was; the right token releases it.
TEST_F(ClusterFailureTest, WrongTokenIsDeniedWithoutSideEffects) {
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(cluster_->decode[0]->address()));
  v1::ReserveResponse a = ReserveOn(*dec, 30, 4);
  v1::ReserveResponse b = ReserveOn(*dec, 30, 4);
  EXPECT_EQ(a.reservation_token().size(), 16u);
  EXPECT_NE(a.reservation_token(), b.reservation_token());
  EXPECT_NE(a.sequence_id(), b.sequence_id());
  // 64 random bits: both ids below 2^32 by chance has probability 2^-64.
  EXPECT_TRUE(a.sequence_id() > 0xffffffffull || b.sequence_id() > 0xffffffffull) << a.sequence_id();
  const auto held = cluster_->decode[0]->stats();
  EXPECT_EQ(held.active_sequences, 2);

  std::string wrong = a.reservation_token();
  wrong[0] ^= 1;
  grpc::Status s = ReleaseOn(*dec, a.sequence_id(), wrong);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = ReleaseOn(*dec, a.sequence_id(), b.reservation_token());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = DecodeOn(*dec, a.sequence_id(), "");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  s = DecodeOn(*dec, a.sequence_id(), wrong);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  const auto after = cluster_->decode[0]->stats();
  EXPECT_EQ(after.active_sequences, 2);
  EXPECT_EQ(after.committed_pages, held.committed_pages);

  EXPECT_TRUE(ReleaseOn(*dec, a.sequence_id(), a.reservation_token()).ok());
  EXPECT_TRUE(ReleaseOn(*dec, b.sequence_id(), b.reservation_token()).ok());
  EXPECT_EQ(ReleaseOn(*dec, a.sequence_id(), a.reservation_token()).error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// KV shipped with another token (a prefill call that knows the id but not the token) never
// lands: the decode worker's transport drops each of its messages before the sink allocates a
// page and counts them (icecache_decode_kv_segments_refused_total); the owner's Decode then finds
// no KV (DEADLINE_EXCEEDED) and everything is freed.
TEST_F(ClusterFailureTest, KvShippedWithAWrongTokenNeverLands) {
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(cluster_->decode[0]->address()));
  auto pre = v1::PrefillWorker::NewStub(cluster::MakeChannel(cluster_->prefill[0]->address()));
  const double refused_before = DecodeMetric("icecache_decode_kv_segments_refused_total");
  ASSERT_GE(refused_before, 0) << "the decode worker exports no icecache_decode_kv_segments_refused_total";
  const std::vector<int32_t> prompt = Prompt(30, 4);
  v1::ReserveResponse r = ReserveOn(*dec, static_cast<int>(prompt.size()), 4);
  v1::PrefillRequest pr;
  pr.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  pr.set_sequence_id(r.sequence_id());
  pr.set_decode_transport_address(r.transport_address());
  pr.set_reservation_token(std::string(16, 'x'));
  v1::PrefillResponse presp;
  {
    grpc::ClientContext ctx;
    grpc::Status s = pre->Prefill(&ctx, pr, &presp);
    // Small segments are dropped without a word to the sender, a refused large one fails it.
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  // The decode worker's metrics refresh every 0.5 s.
  double refused = refused_before;
  for (int i = 0; i < 200 && refused <= refused_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    refused = DecodeMetric("icecache_decode_kv_segments_refused_total");
  }
  EXPECT_GT(refused, refused_before) << "the refused segments were not counted";
  EXPECT_EQ(cluster_->decode[0]->stats().used_pages, 0) << "a stranger's KV landed in the pool";
  grpc::Status s = DecodeOn(*dec, r.sequence_id(), r.reservation_token(), /*kv_wait=*/0.5);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// Workers of incompatible builds never exchange KV: Reserve states the decode worker's KV wire
// version, and a PrefillRequest naming another is FAILED_PRECONDITION with both versions before
// anything is computed or shipped (the router passes the version through; it also serves every
// other test here). The reservation is then released by its owner and nothing stays held.
TEST_F(ClusterFailureTest, PrefillRefusesADecodeWorkerOfAnotherKvWireVersion) {
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(cluster_->decode[0]->address()));
  auto pre = v1::PrefillWorker::NewStub(cluster::MakeChannel(cluster_->prefill[0]->address()));
  const std::vector<int32_t> prompt = Prompt(20, 6);
  v1::ReserveResponse r = ReserveOn(*dec, static_cast<int>(prompt.size()), 4);
  ASSERT_EQ(r.kv_protocol_version(), transport::KvProtocolVersion());
  v1::PrefillRequest pr;
  pr.mutable_token_ids()->Add(prompt.begin(), prompt.end());
  pr.set_sequence_id(r.sequence_id());
  pr.set_decode_transport_address(r.transport_address());
  pr.set_reservation_token(r.reservation_token());
  pr.set_decode_kv_protocol_version(r.kv_protocol_version() + 1);
  v1::PrefillResponse presp;
  grpc::ClientContext ctx;
  grpc::Status s = pre->Prefill(&ctx, pr, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("KV wire version " + std::to_string(r.kv_protocol_version() + 1)), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("incompatible icecache builds"), std::string::npos) << s.error_message();
  EXPECT_EQ(cluster_->decode[0]->stats().used_pages, 0) << "KV was shipped to a decode worker of another version";
  EXPECT_TRUE(ReleaseOn(*dec, r.sequence_id(), r.reservation_token()).ok());
  ExpectDecodeIdle(*cluster_->decode[0]);
}

// The transport address and token in a PrefillRequest are checked before use: too long, empty,
// or not an icecache address never reach ucp_ep_create.
TEST_F(ClusterFailureTest, TransportAddressAndTokenShapesAreChecked) {
  auto pre = v1::PrefillWorker::NewStub(cluster::MakeChannel(cluster_->prefill[0]->address()));
  auto prefill = [&](const std::string& address, const std::string& token) {
    v1::PrefillRequest pr;
    pr.add_token_ids(5);
    pr.add_token_ids(6);
    pr.set_sequence_id(12345);
    pr.set_decode_transport_address(address);
    pr.set_reservation_token(token);
    v1::PrefillResponse presp;
    grpc::ClientContext ctx;
    return pre->Prefill(&ctx, pr, &presp);
  };
  const std::string token(16, 't');
  grpc::Status s = prefill(std::string(5000, 'a'), token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("decode_transport_address"), std::string::npos) << s.error_message();
  s = prefill("", token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = prefill("some address", "short");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("reservation_token"), std::string::npos) << s.error_message();
  // Right length, wrong contents: refused by the transport before ucp_ep_create.
  s = prefill(std::string(300, '\x01'), token);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("not an icecache transport address"), std::string::npos) << s.error_message();
  // A real address cut short by one byte.
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(cluster_->decode[0]->address()));
  v1::ReserveResponse r = ReserveOn(*dec, 2, 2);
  std::string cut = r.transport_address();
  cut.pop_back();
  s = prefill(cut, r.reservation_token());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("truncated or corrupt"), std::string::npos) << s.error_message();
  EXPECT_TRUE(ReleaseOn(*dec, r.sequence_id(), r.reservation_token()).ok());
  ExpectDecodeIdle(*cluster_->decode[0]);
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

// ---- Overload: queue with a bound instead of refusing at once -------------------------------

std::unique_ptr<LoopbackCluster> SmallCluster(int max_sequences, int max_waiting, double max_wait_seconds) {
  return LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self", true,
                                0, 60000, "reference", "f32", [&](cluster::ClusterConfig& c) {
                                  c.decode.max_sequences = max_sequences;
                                  c.router.max_waiting = max_waiting;
                                  c.router.max_queue_wait_seconds = max_wait_seconds;
                                });
}

bool WaitFor(const std::function<bool()>& cond, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

// 12 concurrent streams on a decode worker that runs 3 sequences at once: all complete (they
// used to get RESOURCE_EXHAUSTED beyond the slots), each with its full length.
TEST(ClusterOverload, MoreStreamsThanSlotsAllComplete) {
  auto c = SmallCluster(/*max_sequences=*/3, /*max_waiting=*/64, /*max_wait_seconds=*/120);
  ASSERT_NE(c, nullptr);
  constexpr int kStreams = 12;
  std::vector<Result> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      RemoteGenerateOptions o;
      o.prompt_ids = Prompt(10 + i, 300 + i);
      o.max_tokens = 30;
      o.ignore_eos = true;
      results[i] = Generate(c->router->address(), o);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString();
    EXPECT_EQ(results[i].tokens.size(), 30u) << i;
  }
  EXPECT_EQ(c->decode[0]->stats().reservations, kStreams);
  EXPECT_EQ(c->router->queued_requests(), 0);
  ExpectDecodeIdle(*c->decode[0]);
}

// RESOURCE_EXHAUSTED only when the queue is full or the wait runs out; a queued request is
// served once the running one ends.
TEST(ClusterOverload, FullQueueAndWaitLimitAreResourceExhausted) {
  auto c = SmallCluster(/*max_sequences=*/1, /*max_waiting=*/1, /*max_wait_seconds=*/120);
  ASSERT_NE(c, nullptr);
  std::atomic<bool> stop_first{false};
  std::atomic<int> first_streamed{0};
  Status first_status;
  std::thread first([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = Prompt(10, 1);
    o.max_tokens = 4000;
    o.ignore_eos = true;
    o.router = c->router->address();
    int n = 0;
    first_status = router::RunRemoteGenerate(o, [&](const RemoteChunk& ch) {
      n += static_cast<int>(ch.token_ids.size());
      first_streamed = n;
      return !stop_first.load();
    });
  });
  ASSERT_TRUE(WaitFor([&] { return first_streamed > 0; }, 60));
  Result second;
  std::thread queued([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = Prompt(12, 2);
    o.max_tokens = 5;
    o.ignore_eos = true;
    second = Generate(c->router->address(), o);
  });
  ASSERT_TRUE(WaitFor([&] { return c->router->queued_requests() == 1; }, 60));
  // The queue (1) is full: the third is refused at once.
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(12, 3);
  o.max_tokens = 5;
  Result third = Generate(c->router->address(), o);
  EXPECT_EQ(third.status.code(), StatusCode::kResourceExhausted) << third.status.ToString();
  EXPECT_NE(third.status.message().find("router.max_waiting"), std::string::npos) << third.status.message();
  // The running stream ends: the queued one is served.
  stop_first = true;
  first.join();
  queued.join();
  EXPECT_EQ(first_status.code(), StatusCode::kCancelled) << first_status.ToString();
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  EXPECT_EQ(second.tokens.size(), 5u);
  EXPECT_TRUE(WaitFor([&] { return c->decode[0]->stats().active_sequences == 0; }, 10));
  ExpectDecodeIdle(*c->decode[0]);
}

TEST(ClusterOverload, WaitLimitIsResourceExhausted) {
  auto c = SmallCluster(/*max_sequences=*/1, /*max_waiting=*/8, /*max_wait_seconds=*/0.3);
  ASSERT_NE(c, nullptr);
  std::atomic<bool> stop_first{false};
  std::atomic<int> first_streamed{0};
  std::thread first([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = Prompt(10, 1);
    o.max_tokens = 4000;
    o.ignore_eos = true;
    o.router = c->router->address();
    (void)router::RunRemoteGenerate(o, [&](const RemoteChunk& ch) {
      first_streamed += static_cast<int>(ch.token_ids.size());
      return !stop_first.load();
    });
  });
  ASSERT_TRUE(WaitFor([&] { return first_streamed > 0; }, 60));
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(12, 2);
  o.max_tokens = 5;
  Result late = Generate(c->router->address(), o);
  const bool still_running = first_streamed < 4000;
  stop_first = true;
  first.join();
  ASSERT_TRUE(still_running) << "the first stream ended before the wait limit: the test proves nothing";
  EXPECT_EQ(late.status.code(), StatusCode::kResourceExhausted) << late.status.ToString();
  EXPECT_NE(late.status.message().find("router.max_queue_wait_seconds"), std::string::npos) << late.status.message();
  EXPECT_TRUE(WaitFor([&] { return c->decode[0]->stats().active_sequences == 0; }, 10));
  ExpectDecodeIdle(*c->decode[0]);
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

// ---- Health and graceful drain --------------------------------------------------------------

// Drain (what SIGTERM does): NOT_SERVING at once, new reservations refused with UNAVAILABLE, the
// running stream finishes with all its tokens, then Drain returns.
TEST(ClusterDrain, DrainRefusesNewWorkAndLetsRunningStreamsFinish) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  const std::string dec_addr = c->decode[0]->address();
  EXPECT_TRUE(router::CheckHealth(dec_addr, "", 5).ok());
  const std::vector<int32_t> prompt = Prompt(20, 9);
  constexpr int kTokens = 600;
  std::atomic<int> streamed{0};
  Result running;
  std::thread t([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = prompt;
    o.max_tokens = kTokens;
    o.ignore_eos = true;
    o.budget_pages = 0;
    running = Generate(c->router->address(), o, &streamed);
  });
  ASSERT_TRUE(WaitFor([&] { return streamed > 0; }, 60));
  bool drained = false;
  std::thread drain([&] { drained = c->decode[0]->Drain(60); });
  ASSERT_TRUE(WaitFor([&] { return !router::CheckHealth(dec_addr, "", 5).ok(); }, 10)) << "still SERVING while draining";
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(dec_addr));
  v1::ReserveRequest rr;
  rr.set_prompt_tokens(5);
  rr.set_max_tokens(5);
  v1::ReserveResponse reserved;
  grpc::ClientContext ctx;
  grpc::Status s = dec->Reserve(&ctx, rr, &reserved);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("draining"), std::string::npos) << s.error_message();
  const bool was_running = streamed < kTokens;
  drain.join();
  t.join();
  EXPECT_TRUE(was_running) << "the stream ended before the drain began: the test proves nothing";
  EXPECT_TRUE(drained);
  ASSERT_TRUE(running.status.ok()) << running.status.ToString();
  EXPECT_EQ(running.tokens, SingleProcessGreedy(::testing::TempDir() + "/icecache_cluster_model_failure", prompt,
                                                kTokens));
  ExpectDecodeIdle(*c->decode[0]);
}

// Router drain (SIGTERM): NOT_SERVING at once, a new request is UNAVAILABLE naming the drain,
// the stream in progress finishes with all its tokens, then Drain returns.
TEST(ClusterDrain, RouterDrainRefusesNewRequestsAndFinishesStreams) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> prompt = Prompt(20, 4);
  constexpr int kTokens = 600;
  std::atomic<int> streamed{0};
  Result running;
  std::thread t([&] {
    RemoteGenerateOptions o;
    o.prompt_ids = prompt;
    o.max_tokens = kTokens;
    o.ignore_eos = true;
    o.budget_pages = 0;
    running = Generate(c->router->address(), o, &streamed);
  });
  ASSERT_TRUE(WaitFor([&] { return streamed > 0; }, 60));
  bool drained = false;
  std::thread drain([&] { drained = c->router->Drain(60); });
  ASSERT_TRUE(WaitFor([&] { return !router::CheckHealth(c->router->address(), "", 5).ok(); }, 10));
  RemoteGenerateOptions late;
  late.prompt_ids = Prompt(8, 5);
  late.max_tokens = 4;
  Result refused = Generate(c->router->address(), late);
  const bool was_running = streamed < kTokens;
  drain.join();
  t.join();
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable) << refused.status.ToString();
  EXPECT_NE(refused.status.message().find("draining"), std::string::npos) << refused.status.ToString();
  EXPECT_TRUE(was_running) << "the stream ended before the drain began: the test proves nothing";
  EXPECT_TRUE(drained);
  ASSERT_TRUE(running.status.ok()) << running.status.ToString();
  EXPECT_EQ(running.tokens, SingleProcessGreedy(::testing::TempDir() + "/icecache_cluster_model_failure", prompt,
                                                kTokens));
}

// Prefill drain: the drained worker reports NOT_SERVING and refuses prompts with UNAVAILABLE, so
// the router sends every request to the other prefill worker and all of them complete.
TEST(ClusterDrain, DrainedPrefillWorkerIsSkippedByTheRouter) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 2, 1, "tcp,sm,self");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->prefill[0]->Drain(5));  // nothing running: returns at once
  EXPECT_TRUE(WaitFor([&] { return !router::CheckHealth(c->prefill[0]->address(), "", 5).ok(); }, 10));
  const auto before = c->prefill[1]->engine_stats().completed;
  for (int i = 0; i < 6; ++i) {
    RemoteGenerateOptions o;
    o.prompt_ids = Prompt(10 + i, 30 + i);
    o.max_tokens = 3;
    o.ignore_eos = true;
    o.router = c->router->address();
    Result r = Generate(c->router->address(), o);
    EXPECT_TRUE(r.status.ok()) << i << ": " << r.status.ToString();
    EXPECT_EQ(r.tokens.size(), 3u);
  }
  EXPECT_EQ(c->prefill[1]->engine_stats().completed - before, 6);
  EXPECT_EQ(c->prefill[0]->engine_stats().completed, 0);
  ExpectDecodeIdle(*c->decode[0]);
}

// Health follows the engine loops' heartbeats: with a stall limit below the loops' idle wake-up
// (200 ms) idle workers read as stalled (NOT_SERVING, Stats UNAVAILABLE, so the router is not
// SERVING either); with the defaults they serve. (A real stall cannot be produced on demand; this checks the wiring both ways.)
TEST(ClusterHealth, HealthFollowsTheEngineHeartbeat) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self", true,
                                  0, 60000, "reference", "f32",
                                  [](cluster::ClusterConfig& cfg) {
                                    cfg.decode.health_stall_seconds = 0.001;
                                    cfg.prefill.health_stall_seconds = 0.001;
                                  });
  ASSERT_NE(c, nullptr);
  const std::string dec_addr = c->decode[0]->address();
  EXPECT_TRUE(WaitFor([&] { return !router::CheckHealth(dec_addr, "icecache.v1.DecodeWorker", 5).ok(); }, 10));
  EXPECT_TRUE(WaitFor(
      [&] { return !router::CheckHealth(c->prefill[0]->address(), "icecache.v1.PrefillWorker", 5).ok(); }, 10));
  // Without a live worker of each kind the router stops reporting SERVING too.
  EXPECT_TRUE(WaitFor([&] { return !router::CheckHealth(c->router->address(), "", 5).ok(); }, 10));
  auto dec = v1::DecodeWorker::NewStub(cluster::MakeChannel(dec_addr));
  bool saw_unavailable = WaitFor(
      [&] {
        v1::WorkerStats st;
        grpc::ClientContext ctx;
        return dec->Stats(&ctx, v1::StatsRequest(), &st).error_code() == grpc::StatusCode::UNAVAILABLE;
      },
      10);
  EXPECT_TRUE(saw_unavailable);
  auto normal = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self");
  ASSERT_NE(normal, nullptr);
  EXPECT_TRUE(router::CheckHealth(normal->decode[0]->address(), "icecache.v1.DecodeWorker", 5).ok());
  EXPECT_TRUE(router::CheckHealth(normal->prefill[0]->address(), "icecache.v1.PrefillWorker", 5).ok());
  EXPECT_TRUE(WaitFor([&] { return router::CheckHealth(normal->router->address(), "", 5).ok(); }, 10));
}

}  // namespace
}  // namespace icecache::testing

namespace icecache::testing {
namespace {

// ---- Slow readers ---------------------------------------------------------------------------

// A client that stops reading (a small HTTP/2 flow-control window, so the router's writes soon
// block): past router.write_timeout_seconds the router cancels the request, the decode worker
// frees the sequence while the client still holds the stream open, and the client then reads a
// truncated stream ending CANCELLED. Other clients are served meanwhile.
TEST(ClusterSlowReader, ClientThatStopsReadingIsCancelledAfterTheWriteTimeout) {
  auto c = LoopbackCluster::Start(::testing::TempDir() + "/icecache_cluster_model_failure", 1, 1, "tcp,sm,self",
                                  /*with_tokenizer=*/true, 0, 60000, "reference", "f32",
                                  [](cluster::ClusterConfig& cfg) { cfg.router.write_timeout_seconds = 1; });
  ASSERT_NE(c, nullptr);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto channel = grpc::CreateCustomChannel(c->router->address(), grpc::InsecureChannelCredentials(), args);
  auto stub = ::icecache::v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  ::icecache::v1::GenerateRequest req;
  for (int i = 1; i <= 8; ++i) req.mutable_token_ids()->add_ids(i * 7);
  req.set_max_tokens(4000);
  req.set_ignore_eos(true);
  auto reader = stub->Generate(&ctx, req);
  ::icecache::v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  // The client reads nothing more: the watchdog must end the sequence on the decode worker.
  EXPECT_TRUE(WaitFor([&] { return c->decode[0]->stats().active_sequences == 0; }, 120));
  // Another client is served meanwhile.
  RemoteGenerateOptions o;
  o.prompt_ids = Prompt(10, 3);
  o.max_tokens = 8;
  o.router = c->router->address();
  Result other = Generate(c->router->address(), o);
  EXPECT_TRUE(other.status.ok()) << other.status.ToString();
  int64_t tokens = r.token_ids_size();
  while (reader->Read(&r)) tokens += r.token_ids_size();
  const grpc::Status st = reader->Finish();
  EXPECT_LT(tokens, 4000) << "every token fit in the buffers: the test proves nothing";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  ExpectDecodeIdle(*c->decode[0]);
}

}  // namespace
}  // namespace icecache::testing
