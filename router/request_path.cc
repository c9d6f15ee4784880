#include "router/request_path.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "common/logging.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "model/finish_rules.h"
#include "serving/grpc_util.h"
#include "serving/metric_families.h"
#include "router/admission_queue.h"
#include "router/request_checks.h"
#include "router/worker_pool.h"

namespace icecache::router {
namespace {

namespace pb = ::icecache::v1;
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void CopyLogprob(const pb::TokenLogprob& from, pb::GenerateResponse* out) { *out->add_logprobs() = from; }

// One choice of a request with n > 1: the parent's deadline, credentials and cancellation, plus
// its own Cancel (a sibling choice failed). Worker contexts handed out are cancelled by either.
class ChoiceContext final : public RequestContext {
 public:
  explicit ChoiceContext(RequestContext& parent) : parent_(parent) {}
  void Cancel() { calls_.Cancel(); }
  bool cancelled() const override { return calls_.cancelled() || parent_.cancelled(); }
  Clock::time_point deadline() const override { return parent_.deadline(); }
  std::shared_ptr<grpc::ClientContext> WorkerContext() override {
    std::shared_ptr<grpc::ClientContext> c;
    {
      std::lock_guard<std::mutex> lock(parent_mu_);  // the parent is shared by the choices
      c = parent_.WorkerContext();
    }
    return calls_.Track(std::move(c));
  }
  std::string authorization() const override { return parent_.authorization(); }

  static std::mutex parent_mu_;

 private:
  RequestContext& parent_;
  WorkerCalls calls_;
};
std::mutex ChoiceContext::parent_mu_;

// Serialises the choices' responses into the one sink, each stamped with its index. Once the
// sink refuses a write (the client is gone), every later write is refused too.
class ChoiceSinks {
 public:
  explicit ChoiceSinks(ResponseSink& sink) : sink_(sink) {}
  class One final : public ResponseSink {
   public:
    One(ChoiceSinks* all, int index) : all_(all), index_(index) {}
    bool Write(const pb::GenerateResponse& response) override {
      pb::GenerateResponse r = response;
      r.set_index(index_);
      std::lock_guard<std::mutex> lock(all_->mu_);
      if (all_->gone_) return false;
      if (!all_->sink_.Write(r)) all_->gone_ = true;
      return !all_->gone_;
    }

   private:
    ChoiceSinks* const all_;
    const int index_;
  };

 private:
  ResponseSink& sink_;
  std::mutex mu_;
  bool gone_ = false;  // guarded by mu_
};

}  // namespace

struct RequestPath::Metrics : cluster::RouterMetrics {
  using cluster::RouterMetrics::RouterMetrics;
};

namespace {

const char* FinishName(pb::FinishReason r) {
  switch (r) {
    case pb::FINISH_REASON_LENGTH:
      return "length";
    case pb::FINISH_REASON_EOS:
      return "eos";
    case pb::FINISH_REASON_STOP:
      return "stop";
    default:
      return "unspecified";
  }
}

// The retry policy's wait (WorkerPool::AwaitReady) before retry `attempt` of a call that failed
// with `why`, at most policy.wait_seconds from now: OK when a `role` worker is ready; CANCELLED
// when the client cancels meanwhile; DEADLINE_EXCEEDED when the request's own deadline comes
// first; otherwise UNAVAILABLE saying that no such worker became ready in time.
Status AwaitWorker(WorkerPool* pool, const std::string& role, const RetryPolicy& policy, int attempt,
                   RequestContext& ctx, const std::string& why) {
  const auto wait_end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(policy.wait_seconds));
  const auto until = std::min(ctx.deadline(), wait_end);
  Status s = pool->AwaitReady(policy, attempt, until, [&] { return ctx.cancelled(); });
  if (s.ok()) return s;
  if (s.code() == StatusCode::kCancelled) return CancelledError("request cancelled by the client");
  if (s.code() != StatusCode::kDeadlineExceeded) return UnavailableError(why + "; " + s.message());
  if (ctx.deadline() < wait_end) {
    return DeadlineExceededError(why + "; the request's deadline passed while waiting for a " + role +
                                 " worker to become ready");
  }
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g", policy.wait_seconds);
  return UnavailableError(why + "; no " + role + " worker became ready within " + secs +
                          " s (router.retry_wait_seconds)");
}

}  // namespace

GrpcRequestContext::GrpcRequestContext(grpc::ServerContext* ctx, std::chrono::duration<double> default_timeout)
    : ctx_(ctx),
      deadline_(ctx->deadline() == std::chrono::system_clock::time_point::max()
                    ? Clock::now() + std::chrono::duration_cast<Clock::duration>(default_timeout)
                    : Clock::now() + std::chrono::duration_cast<Clock::duration>(ctx->deadline() -
                                                                                 std::chrono::system_clock::now())) {}

bool GrpcRequestContext::cancelled() const { return ctx_->IsCancelled(); }
RequestContext::Clock::time_point GrpcRequestContext::deadline() const { return deadline_; }

std::shared_ptr<grpc::ClientContext> GrpcRequestContext::WorkerContext() {
  std::shared_ptr<grpc::ClientContext> c = grpc::ClientContext::FromServerContext(*ctx_);
  // Without a client deadline the child has none either: the configured request timeout applies.
  if (ctx_->deadline() == std::chrono::system_clock::time_point::max()) {
    c->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline_ - Clock::now()));
  }
  return c;
}

std::string GrpcRequestContext::authorization() const {
  const auto& md = ctx_->client_metadata();
  auto it = md.find("authorization");
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

void WorkerCalls::Cancel() {
  std::vector<std::shared_ptr<grpc::ClientContext>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    for (auto& w : live_) {
      if (auto c = w.lock()) live.push_back(std::move(c));
    }
  }
  for (auto& c : live) c->TryCancel();
}

bool WorkerCalls::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

std::shared_ptr<grpc::ClientContext> WorkerCalls::Track(std::shared_ptr<grpc::ClientContext> c) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) {
    c->TryCancel();
    return c;
  }
  std::erase_if(live_, [](const std::weak_ptr<grpc::ClientContext>& w) { return w.expired(); });
  live_.push_back(c);
  return c;
}

std::shared_ptr<grpc::ClientContext> CancellableRequestContext::WorkerContext() {
  auto c = std::make_shared<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() +
                  std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline_ - Clock::now()));
  return calls_.Track(std::move(c));
}

RequestPath::RequestPath(const cluster::ClusterConfig& config, model::ModelConfig model_config,
                         std::unique_ptr<tokenizer::Tokenizer> tokenizer, WorkerPool* prefill, WorkerPool* decode,
                         AdmissionQueue* admission, prometheus::Registry& registry)
    : config_(config),
      model_config_(std::move(model_config)),
      tokenizer_(std::move(tokenizer)),
      prefill_(prefill),
      decode_(decode),
      admission_(admission),
      metrics_(std::make_unique<Metrics>(
          registry, cluster::ProcessLabels("router", cluster::ServedModelName(config.model.name, config.model.dir)))),
      prefixes_(config.cache.page_size, size_t{1} << 20) {
  for (auto [pool, role] : {std::pair{prefill_, "prefill"}, std::pair{decode_, "decode"}}) {
    if (pool == nullptr) continue;
    pool->SetUnavailableObserver([family = &metrics_->worker_unavailable, role](const std::string& a, double s) {
      family->Add({{"role", role}, {"worker", a}}).Increment(s);
    });
  }
}

RequestPath::~RequestPath() {
  for (WorkerPool* pool : {prefill_, decode_}) {
    if (pool != nullptr) pool->SetUnavailableObserver(nullptr);
  }
}

Status RequestPath::Authorize(std::string_view authorization) const {
  if (config_.router.api_keys.empty()) return Status::Ok();
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() > kBearer.size() && authorization.substr(0, kBearer.size()) == kBearer) {
    const std::string_view key = authorization.substr(kBearer.size());
    bool match = false;
    for (const auto& k : config_.router.api_keys) {
      // Compares every byte of equal-length keys, so the time taken does not tell a prefix.
      if (k.size() != key.size()) continue;
      unsigned char diff = 0;
      for (size_t i = 0; i < k.size(); ++i) diff |= static_cast<unsigned char>(k[i] ^ key[i]);
      match = match || diff == 0;
    }
    if (match) return Status::Ok();
    return Status(StatusCode::kUnauthenticated, "the API key is not valid");
  }
  return Status(StatusCode::kUnauthenticated, "this server needs an API key: send 'Authorization: Bearer KEY' (gRPC metadata "
                              "'authorization')");
}

Status RequestPath::Generate(const pb::GenerateRequest& request, RequestContext& ctx, ResponseSink& sink) {
  const auto arrival = Clock::now();
  if (Status a = Authorize(ctx.authorization()); !a.ok()) {
    CountRefused(a);
    return a;
  }
  if (request.n() < 0 || request.n() > kMaxChoices) {
    Status bad = InvalidArgumentError("n = " + std::to_string(request.n()) + ": it must be in [1, " +
                                      std::to_string(kMaxChoices) + "] (0 = 1)");
    CountRefused(bad);
    return bad;
  }
  Status s;
  // Every choice is a stream of its own for router.max_streams (and for admission, in Serve).
  const int n = std::max(1, request.n());
  if (draining_.load()) {
    streams_.fetch_add(n);
    s = UnavailableError("the router is draining (shutting down): send the request to another router");
  } else if (streams_.fetch_add(n) + n > config_.router.max_streams) {
    s = ResourceExhaustedError("the router serves " + std::to_string(config_.router.max_streams) +
                               " streams at once (router.max_streams)" +
                               (n > 1 ? std::string(" and this request asks for ") + std::to_string(n) : std::string()) +
                               "; retry later");
  } else if (request.n() <= 1) {
    s = Serve(request, ctx, sink, arrival);
  } else {
    s = ServeChoices(request, ctx, sink, arrival);
  }
  streams_.fetch_sub(n);
  if (!s.ok()) CountRefused(s);
  return s;
}

Status RequestPath::ServeChoices(const pb::GenerateRequest& request, RequestContext& ctx, ResponseSink& sink,
                                 Clock::time_point arrival) {
  // Refuse a bad request once, before any choice reserves anything.
  {
    std::vector<int32_t> ids;
    ICE_RETURN_IF_ERROR(Validate(request, &ids));
  }
  const int n = request.n();
  ChoiceSinks sinks(sink);
  std::vector<std::unique_ptr<ChoiceContext>> contexts;
  std::vector<pb::GenerateRequest> requests(n, request);
  std::vector<Status> results(n);
  for (int i = 0; i < n; ++i) {
    contexts.push_back(std::make_unique<ChoiceContext>(ctx));
    requests[i].set_n(1);
    if (!request.request_id().empty()) requests[i].set_request_id(request.request_id() + "-" + std::to_string(i));
    if (request.sampling().seed() != 0) requests[i].mutable_sampling()->set_seed(request.sampling().seed() + i);
  }
  auto run = [&](int i) {
    ChoiceSinks::One one(&sinks, i);
    results[i] = Serve(requests[i], *contexts[i], one, arrival);
    if (!results[i].ok()) {
      for (auto& c : contexts) c->Cancel();  // one choice failed: the request has failed
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  // The first error that is not a sibling's cancellation.
  const Status* first = nullptr;
  for (const Status& r : results) {
    if (r.ok()) continue;
    if (first == nullptr || (first->code() == StatusCode::kCancelled && r.code() != StatusCode::kCancelled)) first = &r;
  }
  return first == nullptr ? Status::Ok() : *first;
}

void RequestPath::CountRefused(const Status& status) {
  metrics_->errors.Add({{"code", std::string(StatusCodeName(status.code()))}}).Increment();
}

Status RequestPath::Validate(const pb::GenerateRequest& req, std::vector<int32_t>* ids) const {
  // Sizes, UTF-8 and sampling first: nothing is tokenized for a request refused anyway.
  ICE_RETURN_IF_ERROR(CheckRequestBeforeTokenizing(req, config_.limits, tokenizer_ != nullptr));
  if (req.prompt_case() == pb::GenerateRequest::kText) {
    if (!tokenizer_) {
      return InvalidArgumentError("this model has no tokenizer.json: send the prompt as token_ids instead of text");
    }
    ICE_ASSIGN_OR_RETURN(*ids, tokenizer_->Encode(req.text(), /*add_special_tokens=*/true));
    if (ids->empty()) return InvalidArgumentError("prompt text encodes to no tokens");
  } else if (req.prompt_case() == pb::GenerateRequest::kTokenIds) {
    ids->assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
    if (ids->empty()) return InvalidArgumentError("prompt token_ids is empty");
    for (size_t i = 0; i < ids->size(); ++i) {
      int32_t id = (*ids)[i];
      if (id < 0 || id >= model_config_.vocab_size) {
        return InvalidArgumentError("token_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                                    " is outside the vocabulary [0, " + std::to_string(model_config_.vocab_size) +
                                    ")");
      }
    }
  } else if (req.prompt_case() == pb::GenerateRequest::kMessages) {
    std::vector<tokenizer::ChatMessage> messages;
    for (const auto& m : req.messages().messages()) messages.push_back({m.role(), m.content()});
    // The tokenizer decides what it can format (FAILED_PRECONDITION without a usable template).
    auto formatted = tokenizer_->ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
    if (!formatted.ok()) {
      return Status(formatted.status().code(),
                    "cannot format messages with this model's chat template (tokenizer_config.json's or the "
                    "GGUF's chat_template): " + formatted.status().message() +
                        "; send the prompt as text instead of messages");
    }
    const std::string& text = *formatted;
    // The template writes the special tokens it wants (bos included).
    ICE_ASSIGN_OR_RETURN(*ids, tokenizer_->Encode(text, /*add_special_tokens=*/false));
    if (ids->empty()) return InvalidArgumentError("messages format to no tokens");
  } else {
    return InvalidArgumentError("no prompt: set text, token_ids or messages");
  }
  if (req.max_tokens() < 1 || req.max_tokens() > config_.limits.max_tokens) {
    return InvalidArgumentError("max_tokens = " + std::to_string(req.max_tokens()) + " is out of range [1, " +
                                std::to_string(config_.limits.max_tokens) + "]");
  }
  const int64_t prompt = static_cast<int64_t>(ids->size());
  if (prompt > config_.limits.max_prompt_tokens) {
    return InvalidArgumentError("prompt has " + std::to_string(prompt) + " tokens, more than the limit of " +
                                std::to_string(config_.limits.max_prompt_tokens));
  }
  if (prompt >= model_config_.max_position) {
    return InvalidArgumentError("prompt has " + std::to_string(prompt) + " tokens; the model's context is " +
                                std::to_string(model_config_.max_position));
  }
  if (req.cache().policy_case() == pb::CachePolicy::kBudgetPages) {
    const int min_budget = config_.cache.sink_pages + config_.cache.window_pages + 1;
    if (req.cache().budget_pages() < min_budget) {
      return InvalidArgumentError("cache.budget_pages = " + std::to_string(req.cache().budget_pages()) +
                                  " is too small: it must be at least sink + window + 1 = " +
                                  std::to_string(min_budget) + " pages (or use full)");
    }
  }
  for (int32_t id : req.stop_token_ids()) {
    if (id < 0 || id >= model_config_.vocab_size) return InvalidArgumentError("stop_token_ids has an id outside the vocabulary");
  }
  return Status::Ok();
}

Status RequestPath::Serve(const pb::GenerateRequest& request, RequestContext& ctx, ResponseSink& sink,
                          Clock::time_point arrival) {
  const pb::GenerateRequest* req = &request;
  std::vector<int32_t> ids;
  ICE_RETURN_IF_ERROR(Validate(*req, &ids));
  const int budget = req->cache().policy_case() == pb::CachePolicy::kFull      ? 0
                     : req->cache().policy_case() == pb::CachePolicy::kBudgetPages ? req->cache().budget_pages()
                                                                               : config_.cache.default_budget_pages;
  pb::SamplingParams sampling = req->sampling();
  if (sampling.seed() == 0 && sampling.temperature() > 0) sampling.set_seed(std::random_device{}() | 1);
  // KV reuse: requests share prefixes only under the same API key and cache_salt.
  const bool prefix_routing = config_.router.prefix_routing;
  std::string salt;
  if (prefix_routing) {
    std::string key = ctx.authorization();
    if (key.rfind("Bearer ", 0) == 0) key = key.substr(7);
    salt = PrefixSalt(key, req->cache_salt());
  }
  int64_t cached_tokens = 0;  // of the first placement: the prompt tokens whose KV was reused

  // Holds one unit of a gauge (icecache_requests_waiting / _running) until Reset or scope exit.
  struct GaugeHold {
    prometheus::Gauge* g = nullptr;
    void Hold(prometheus::Gauge& x) {
      Reset();
      g = &x;
      g->Increment();
    }
    void Reset() {
      if (g != nullptr) g->Decrement();
      g = nullptr;
    }
    ~GaugeHold() { Reset(); }
  };

  GaugeHold waiting;
  waiting.Hold(metrics_->waiting);
  // The decode worker that holds the request now, its reservation, and the decode workers this
  // request has lost (tried after the others when it reserves again).
  const RetryPolicy policy{config_.router.retry_wait_seconds, config_.router.retry_attempts};
  WorkerInfo decoder;
  pb::ReserveResponse reserved;
  std::vector<std::string> lost;
  // What the next reservation is for: the prompt the prefill worker will prefill and the tokens
  // still to generate (the decode call's first token included).
  int reserve_prompt = static_cast<int>(ids.size());
  int reserve_max = req->max_tokens();
  bool never_fits = false;  // every worker said the request exceeds its whole pool
  // 1. Reserve on the best decode worker that has room; without room anywhere, wait in the
  // admission queue (bounded in length and time) and retry.
  // The tokens whose KV the reservation's sequence will hold after its prefill (the prompt, or
  // for a migration the prompt and the tokens sent but the last): the worker reuses a prefix of
  // them and keeps them when the sequence ends. Only a first placement may reuse (a migration
  // restarts from the shipped KV of exactly its context).
  std::vector<int32_t> reserve_tokens = ids;
  bool allow_reuse = true;  // false once a placement failed: its retry prefills
  auto try_reserve = [&]() -> Status {
    auto decoders = decode_->Ranked(/*claim=*/1, lost);
    if (decoders.empty()) return UnavailableError("no decode workers are configured");
    const std::string claimed = decoders.front().address;
    // KV-aware routing: the worker that holds the longest prefix goes first, if it is ready and
    // not one this request lost.
    PrefixHolder holder;
    if (prefix_routing && allow_reuse) {
      holder = prefixes_.Lookup(salt, reserve_tokens);
      auto it = std::find_if(decoders.begin(), decoders.end(),
                             [&](const WorkerInfo& w) { return w.address == holder.worker && w.healthy; });
      if (it != decoders.end() && it != decoders.begin()) std::rotate(decoders.begin(), it, it + 1);
    }
    grpc::Status last_error(grpc::StatusCode::UNAVAILABLE, "no decode worker answered");
    size_t exhausted = 0, never = 0, tried = 0;
    bool got = false;
    for (const auto& w : decoders) {
      ++tried;
      auto c = ctx.WorkerContext();
      pb::ReserveRequest rr;
      rr.set_request_id(req->request_id());
      rr.set_prompt_tokens(reserve_prompt);
      rr.set_max_tokens(reserve_max);
      // The reservation waits for its prefill to start as long as the request may live.
      rr.set_prefill_wait_seconds(std::max(0.001, std::chrono::duration<double>(ctx.deadline() - Clock::now()).count()));
      if (prefix_routing) {
        rr.mutable_prompt_token_ids()->Add(reserve_tokens.begin(), reserve_tokens.end());
        rr.set_cache_salt(salt);
        rr.set_local_prefill_max_tokens(allow_reuse ? config_.router.local_prefill_max_tokens : 0);
      }
      if (budget == 0) {
        rr.mutable_cache()->set_full(true);
      } else {
        rr.mutable_cache()->set_budget_pages(budget);
      }
      grpc::Status s = w.decode->Reserve(c.get(), rr, &reserved);
      if (s.ok()) {
        decoder = w;
        got = true;
        // The worker the index named reuses less than it said: forget what it no longer holds.
        if (w.address == holder.worker && reserved.cached_tokens() < holder.tokens) {
          prefixes_.Forget(w.address, salt, reserve_tokens);
        }
        break;
      }
      last_error = grpc::Status(s.error_code(), "reserve on " + w.address + ": " + s.error_message());
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) decode_->MarkFailed(w.address);
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++exhausted;
        const auto& md = c->GetServerTrailingMetadata();
        auto it = md.find("icecache-fits");
        if (it != md.end() && it->second == "never") ++never;
      }
      if (s.error_code() == grpc::StatusCode::CANCELLED || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) break;
    }
    // Move the claim Ranked() made on the first worker to the one that accepted (or drop it).
    decode_->AddInflight(claimed, -1);
    if (got) {
      decode_->AddInflight(decoder.address, 1);
      return Status::Ok();
    }
    if (exhausted > 0 && last_error.error_code() != grpc::StatusCode::CANCELLED &&
        last_error.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      never_fits = never == tried;
      return ResourceExhaustedError("no decode worker can hold this request now: " + last_error.error_message());
    }
    return cluster::FromGrpc(last_error);
  };
  // Admission, and when no decode worker answered (all unreachable or restarting): the retry
  // policy's bounded wait for one to be ready, then admission again.
  auto admit = [&]() -> Status {
    for (int attempt = 1;; ++attempt) {
      never_fits = false;
      Status s = admission_->Admit(
          try_reserve, [&](const Status&) { return !never_fits; }, [&] { return ctx.cancelled(); }, ctx.deadline());
      if (s.code() != StatusCode::kUnavailable || ctx.cancelled()) return s;
      if (attempt >= policy.attempts) {
        return UnavailableError(s.message() + "; gave up after " + std::to_string(attempt) +
                                " reservation attempts (router.retry_attempts)");
      }
      ICE_RETURN_IF_ERROR(AwaitWorker(decode_, "decode", policy, attempt, ctx, s.message()));
    }
  };
  ICE_RETURN_IF_ERROR(admit());
  cached_tokens = reserved.cached_tokens();
  // From here on this request holds decode capacity: whoever waits may retry once it ends.
  const auto reserved_at = Clock::now();
  metrics_->queue_time.Observe(std::chrono::duration<double>(reserved_at - arrival).count());
  struct NotifyOnExit {
    AdmissionQueue* q;
    ~NotifyOnExit() { q->Notify(); }
  } notify_on_exit{admission_};
  struct InflightGuard {
    WorkerPool* pool;
    std::string address;
    int64_t n;
    ~InflightGuard() { pool->AddInflight(address, -n); }
  } decode_guard{decode_, decoder.address, 1};
  // Frees the current reservation (a no-op on the worker for a sequence that has ended).
  auto release = [&](double seconds) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds)));
    pb::ReleaseRequest rel;
    rel.set_sequence_id(reserved.sequence_id());
    rel.set_reservation_token(reserved.reservation_token());
    pb::ReleaseResponse ignored;
    decoder.decode->Release(&c, rel, &ignored).ok();
  };

  std::unique_ptr<tokenizer::IncrementalDecoder> detok;
  if (tokenizer_) detok = std::make_unique<tokenizer::IncrementalDecoder>(*tokenizer_);
  // Finish rules (model/finish_rules.h): stop strings with hold-back here; the token rules run on
  // the decode worker, and here only to tell whether a stream that broke had already ended.
  model::StopStrings stops(std::vector<std::string>(req->stop().begin(), req->stop().end()));
  std::vector<int32_t> eos = model_config_.eos_ids;
  if (tokenizer_) {
    const std::vector<int32_t> tok_eos = tokenizer_->eos_ids();
    eos.insert(eos.end(), tok_eos.begin(), tok_eos.end());
  }
  const model::TokenStops token_rules(std::vector<int32_t>(req->stop_token_ids().begin(), req->stop_token_ids().end()),
                                      eos, req->ignore_eos(), req->max_tokens(), model_config_.max_position);
  std::vector<int32_t> generated;  // every token sent to the client, in order (across migrations)
  Clock::time_point first_at{}, last_at{};
  pb::FinishReason finish = pb::FINISH_REASON_UNSPECIFIED;
  int64_t pages_fetched = 0;
  double retrieval_seconds = 0;
  pb::PrefillResponse first_prefill;  // the timing the client sees is the first prefill's
  GaugeHold running;
  std::string first_decoder = decoder.address;  // where the stream starts (a prefill retry may move it)

  // Sends tokens (and their text, and their logprobs when asked); returns false when the client
  // is gone.
  const bool want_logprobs = sampling.logprobs();
  auto emit = [&](const std::vector<int32_t>& tokens, const std::vector<const pb::TokenLogprob*>& logprobs,
                  bool first) -> bool {
    pb::GenerateResponse out;
    if (first) {
      out.set_request_id(req->request_id());
      out.set_decode_worker(first_decoder);
    }
    std::string text;
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int32_t t = tokens[i];
      if (stops.stopped()) break;
      out.add_token_ids(t);
      generated.push_back(t);
      if (want_logprobs) CopyLogprob(i < logprobs.size() ? *logprobs[i] : pb::TokenLogprob(), &out);
      if (detok) {
        auto piece = detok->Push(t);
        text += stops.Push(piece.ok() ? *piece : std::string());
      }
    }
    if (!text.empty()) out.set_text(text);
    const auto now = Clock::now();
    if (first) {
      first_at = now;
      metrics_->ttft.Observe(std::chrono::duration<double>(now - arrival).count());
    } else if (!tokens.empty()) {
      metrics_->itl.Observe(std::chrono::duration<double>(now - last_at).count() / tokens.size());
    }
    last_at = now;
    metrics_->generation_tokens.Increment(static_cast<double>(out.token_ids_size()));
    return sink.Write(out);
  };

  // 2-3, once per decode worker the request runs on. Migration (as Dynamo does it): when the
  // decode worker fails mid-stream (UNAVAILABLE: killed, connection lost, drained past its grace
  // period), the prompt + the tokens so far except the last are prefilled on another pair and
  // the new Decode call starts from the last token sent, so the client's stream goes on with no
  // token lost or repeated; max_tokens and the stop strings' hold-back count across the move.
  int migrations = 0;
  for (;;) {
    // 2. Prefill on the least loaded ready prefill worker; it ships the KV into the decode worker.
    // A worker that is full (RESOURCE_EXHAUSTED: nothing was done) is skipped for the next one
    // with the same reservation. One that fails UNAVAILABLE (unreachable, draining, or killed,
    // maybe mid-shipment with part of the KV already in the reservation's pages) is tried last
    // from then on, and the next attempt gets a fresh reservation: the old one is released (its
    // pages go back to the pool) and the request reserves again through admission, on the same
    // decode worker or another. Between attempts the retry policy (router.retry_wait_seconds,
    // router.retry_attempts) backs off and waits for a prefill worker to be ready.
    std::vector<int32_t> context = ids;
    if (!generated.empty()) context.insert(context.end(), generated.begin(), generated.end() - 1);
    pb::PrefillResponse prefilled;
    grpc::Status s;
    bool gave_up = false;  // the retry policy ran out (wait or attempts): no migration either
    // A reused prefix: the decode worker computes the rest of the prompt, nothing is prefilled.
    const bool reused = reserved.cached_tokens() > 0;
    if (!reused) {
      if (prefill_->size() == 0) {
        release(5);
        return UnavailableError("no prefill workers are configured");
      }
      pb::PrefillRequest pr;
      pr.set_request_id(req->request_id());
      pr.mutable_token_ids()->Add(context.begin(), context.end());
      *pr.mutable_sampling() = sampling;
      pr.set_build_index(budget != 0);
      auto for_reservation = [&] {
        pr.set_sequence_id(reserved.sequence_id());
        pr.set_decode_transport_address(reserved.transport_address());
        pr.set_decode_kv_protocol_version(reserved.kv_protocol_version());
        pr.set_reservation_token(reserved.reservation_token());
      };
      for_reservation();
      std::vector<std::string> failed_prefill;  // workers that failed this placement: tried last
      size_t exhausted = 0;                     // full workers in a row (RESOURCE_EXHAUSTED: nothing done)
      int failures = 0;                         // UNAVAILABLE answers
      bool fresh_reservation = false;  // the last attempt failed UNAVAILABLE: reserve again first
      for (;;) {
        if (fresh_reservation) {
          allow_reuse = false;
          if (Status again = admit(); !again.ok()) {
            if (ctx.cancelled()) return CancelledError("request cancelled by the client");
            return Status(again.code() == StatusCode::kDeadlineExceeded ? again.code() : StatusCode::kUnavailable,
                          s.error_message() + "; no decode worker took the retry on another prefill worker: " +
                              again.message());
          }
          decode_guard.address = decoder.address;
          decode_guard.n = 1;
          if (generated.empty()) first_decoder = decoder.address;
          for_reservation();
          metrics_->prefill_retries.Increment();
        }
        // The least loaded ready worker, one that has not failed this placement if there is one.
        auto prefillers = prefill_->Ranked(/*claim=*/static_cast<int64_t>(context.size()), failed_prefill);
        if (prefillers.empty()) {
          release(5);
          return UnavailableError("no prefill workers are configured");
        }
        const WorkerInfo& prefiller = prefillers.front();
        InflightGuard prefill_guard{prefill_, prefiller.address, static_cast<int64_t>(context.size())};
        if (fresh_reservation) {
          ICE_LOG(INFO) << "request " << req->request_id() << ": retrying prefill on " << prefiller.address
                        << " with a new reservation on " << decoder.address << " (" << s.error_message() << ")";
          fresh_reservation = false;
        }
        auto c = ctx.WorkerContext();
        s = prefiller.prefill->Prefill(c.get(), pr, &prefilled);
        if (s.ok()) break;
        s = grpc::Status(s.error_code(), "prefill on " + prefiller.address + " failed: " + s.error_message());
        if (ctx.cancelled()) break;
        std::erase(failed_prefill, prefiller.address);
        failed_prefill.push_back(prefiller.address);  // the latest failure is tried last
        if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          // Full: the next worker with the same reservation, until every one has said so.
          if (++exhausted >= prefillers.size()) break;
          continue;
        }
        if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
        // Unreachable, draining, or killed (maybe mid-shipment with part of the KV already in the
        // reservation's pages): the old reservation is released now, before any wait (anything
        // still arriving for it is dropped, its id and token being dead); the next try gets a
        // fresh one.
        exhausted = 0;
        prefill_->MarkFailed(prefiller.address);
        release(5);
        decode_->AddInflight(decode_guard.address, -decode_guard.n);
        decode_guard.n = 0;
        if (++failures >= policy.attempts) {
          s = grpc::Status(s.error_code(), "every prefill attempt failed (" + std::to_string(failures) +
                                               " tried, each with its own reservation; router.retry_attempts); the last: " +
                                               s.error_message());
          gave_up = true;
          break;
        }
        if (Status w = AwaitWorker(prefill_, "prefill", policy, failures, ctx, s.error_message());
            !w.ok()) {
          s = cluster::ToGrpc(w);
          gave_up = true;
          break;
        }
        fresh_reservation = true;
      }
    }
    grpc::Status ds;  // the outcome of this attempt's decode call
    if (!s.ok()) {
      release(5);
      // The first prefill's failure is the request's (nothing was sent yet). During a migration
      // the target decode worker may be what failed: try another one.
      if (generated.empty() || s.error_code() != grpc::StatusCode::UNAVAILABLE || gave_up || ctx.cancelled()) {
        if (ctx.cancelled()) return CancelledError("request cancelled by the client");
        return cluster::FromGrpc(s);
      }
      ds = s;
    } else if (reused) {
      metrics_->prompt_tokens.Increment(static_cast<double>(ids.size()));
      waiting.Reset();
      running.Hold(metrics_->running);
    } else {
      if (generated.empty()) {
        first_prefill = prefilled;
        metrics_->prompt_tokens.Increment(static_cast<double>(ids.size()));
        waiting.Reset();
        running.Hold(metrics_->running);
        if (!emit({prefilled.first_token()}, {&prefilled.first_logprob()}, /*first=*/true)) {
          release(5);
          return CancelledError("client went away");
        }
      } else if (sampling.temperature() == 0 && prefilled.first_token() != generated.back()) {
        // Greedy: the re-prefill recomputed the last token sent; a different one means logits
        // that differ in rounding between the two paths (a near tie). The stream keeps the sent one.
        ICE_LOG(WARNING) << "request " << req->request_id() << ": migration re-prefill predicts token "
                         << prefilled.first_token() << " where " << generated.back() << " was sent";
      }
    }
    if (s.ok()) {
      // 3. Decode stream from the last token sent (or, reusing a prefix, from the prompt's end).
      const int sent = static_cast<int>(generated.size());
      auto dctx = ctx.WorkerContext();
      pb::DecodeRequest dr;
      dr.set_sequence_id(reserved.sequence_id());
      dr.set_reservation_token(reserved.reservation_token());
      *dr.mutable_sampling() = sampling;
      dr.mutable_stop_token_ids()->CopyFrom(req->stop_token_ids());
      dr.set_ignore_eos(req->ignore_eos());
      dr.set_kv_wait_seconds(config_.router.kv_transfer_timeout_seconds);
      if (reused) {
        dr.set_first_token(-1);
        dr.set_max_tokens(req->max_tokens());
      } else {
        dr.set_first_token(generated.back());
        dr.set_max_tokens(req->max_tokens() - (sent - 1));
        dr.set_sampler_draws_done(sent - 1);  // tokens 2..sent were drawn on decode workers
        // The penalties' context on the new worker: what was generated before its first token.
        dr.mutable_prior_tokens()->Add(generated.begin(), generated.end() - 1);
      }
      auto reader = decoder.decode->Decode(dctx.get(), dr);
      pb::DecodeResponse dresp;
      bool client_gone = false;
      while (!stops.stopped() && reader->Read(&dresp)) {
        std::vector<int32_t> tokens(dresp.token_ids().begin(), dresp.token_ids().end());
        if (want_logprobs && dresp.logprobs_size() != dresp.token_ids_size()) {
          dctx->TryCancel();
          reader->Finish();
          release(5);
          return InternalError("decode on " + decoder.address + " sent " + std::to_string(dresp.logprobs_size()) +
                               " logprobs for " + std::to_string(dresp.token_ids_size()) + " tokens");
        }
        std::vector<const pb::TokenLogprob*> logprobs;
        for (const auto& l : dresp.logprobs()) logprobs.push_back(&l);
        if (!tokens.empty() && !emit(tokens, logprobs, /*first=*/generated.empty())) {
          dctx->TryCancel();
          client_gone = true;
          break;
        }
        if (dresp.finish_reason() != pb::FINISH_REASON_UNSPECIFIED) {
          finish = dresp.finish_reason();
          pages_fetched += dresp.pages_fetched();
          retrieval_seconds += dresp.retrieval_seconds();
        }
      }
      if (stops.stopped()) {
        dctx->TryCancel();
        finish = pb::FINISH_REASON_STOP;
      }
      ds = reader->Finish();
      if (stops.stopped() || ds.ok()) break;
      // A Decode that failed before it took the reservation over (refused parameters, KV that
      // never arrived, a worker that went away) must not leave it held until it expires.
      release(migrations < config_.router.max_migrations ? 1 : 5);
      if (client_gone || ctx.cancelled()) return CancelledError("request cancelled by the client");
      ds = grpc::Status(ds.error_code(), "decode on " + decoder.address + " failed: " + ds.error_message());
      if (ds.error_code() == grpc::StatusCode::UNAVAILABLE) decode_->MarkFailed(decoder.address);
      // The stream may have ended by a token rule before the failure reached us (the finish
      // response lost): then there is nothing to continue.
      const model::FinishReason done =
          generated.empty() ? model::FinishReason::kNone
                            : token_rules.After(generated.back(), static_cast<int>(generated.size()),
                                                static_cast<int64_t>(ids.size() + generated.size()));
      if (done != model::FinishReason::kNone) {
        finish = done == model::FinishReason::kStop ? pb::FINISH_REASON_EOS : pb::FINISH_REASON_LENGTH;
        break;
      }
      if (ds.error_code() != grpc::StatusCode::UNAVAILABLE) return cluster::FromGrpc(ds);
    }
    // Migrate: a new reservation for prompt + tokens so far, on another decode worker when one is
    // ready, else (the retry policy) on the first to become ready, the restarted one included.
    if (migrations >= config_.router.max_migrations) {
      return UnavailableError(ds.error_message() + "; gave up after " + std::to_string(migrations) +
                              " migrations (router.max_migrations) with " + std::to_string(generated.size()) +
                              " tokens sent");
    }
    lost.push_back(decoder.address);
    decode_->AddInflight(decode_guard.address, -decode_guard.n);
    decode_guard.n = 0;
    // Nothing sent yet (a reused prefix's decode failed first): the next placement prefills.
    const size_t kept = generated.empty() ? 0 : generated.size() - 1;
    reserve_prompt = static_cast<int>(ids.size() + kept);
    reserve_max = req->max_tokens() - static_cast<int>(kept);
    reserve_tokens = ids;
    reserve_tokens.insert(reserve_tokens.end(), generated.begin(), generated.begin() + static_cast<ptrdiff_t>(kept));
    allow_reuse = false;
    if (Status again = admit(); !again.ok()) {
      if (ctx.cancelled()) return CancelledError("request cancelled by the client");
      return UnavailableError(ds.error_message() + "; no other decode worker could continue the stream after " +
                              std::to_string(generated.size()) + " tokens: " + again.message());
    }
    decode_guard.address = decoder.address;
    decode_guard.n = 1;
    ++migrations;
    metrics_->migrations.Increment();
    ICE_LOG(INFO) << "request " << req->request_id() << ": migrated to decode worker " << decoder.address
                  << " after " << generated.size() << " tokens (" << ds.error_message() << ")";
  }
  if (finish == pb::FINISH_REASON_UNSPECIFIED) finish = pb::FINISH_REASON_LENGTH;
  const int completion = static_cast<int>(generated.size());

  pb::GenerateResponse last;
  if (detok && !stops.stopped()) {
    std::string tail = stops.Push(detok->Flush());
    if (stops.stopped()) {
      finish = pb::FINISH_REASON_STOP;
    } else {
      tail += stops.Flush();
    }
    if (!tail.empty()) last.set_text(tail);
  }
  last.set_finish_reason(finish);
  last.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(ids.size()));
  last.mutable_usage()->set_completion_tokens(completion);
  last.mutable_usage()->set_cached_tokens(static_cast<int32_t>(cached_tokens));
  if (prefix_routing && completion > 0) {
    // The decode worker keeps the sequence: the prompt and every token but the last (never fed).
    std::vector<int32_t> held = ids;
    held.insert(held.end(), generated.begin(), generated.end() - 1);
    prefixes_.Record(decoder.address, salt, held);
  }
  if (cached_tokens > 0) metrics_->cached_prompt_tokens.Increment(static_cast<double>(cached_tokens));
  auto* t = last.mutable_timing();
  const double ttft = std::chrono::duration<double>(first_at - arrival).count();
  const double e2e = Since(arrival);
  t->set_ttft_seconds(ttft);
  t->set_tpot_seconds(completion > 1 ? std::chrono::duration<double>(last_at - first_at).count() / (completion - 1)
                                     : 0.0);
  t->set_e2e_seconds(e2e);
  t->set_prefill_queue_seconds(first_prefill.queue_seconds());
  t->set_prefill_compute_seconds(first_prefill.compute_seconds());
  t->set_tree_build_seconds(first_prefill.tree_build_seconds());
  t->set_transfer_seconds(first_prefill.transfer_seconds());
  t->set_transfer_bytes(first_prefill.transfer_bytes());
  t->set_pages_fetched(pages_fetched);
  t->set_retrieval_seconds(retrieval_seconds);
  sink.Write(last);
  metrics_->e2e.Observe(e2e);
  if (completion > 1) metrics_->tpot.Observe(t->tpot_seconds());
  if (completion > 0) {
    metrics_->prefill_time.Observe(std::chrono::duration<double>(first_at - reserved_at).count());
    metrics_->decode_time.Observe(std::chrono::duration<double>(last_at - first_at).count());
  }
  metrics_->prompt_tokens_per_request.Observe(static_cast<double>(ids.size()));
  metrics_->generation_tokens_per_request.Observe(static_cast<double>(completion));
  metrics_->success.Add({{"finished_reason", FinishName(finish)}}).Increment();
  return Status::Ok();
}

}  // namespace icecache::router
