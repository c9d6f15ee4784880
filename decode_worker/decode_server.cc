#include "decode_worker/decode_server.h"

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <thread>

#include "common/logging.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "kernels/backend.h"
#include "serving/grpc_util.h"
#include "serving/internal_tls.h"
#include "serving/metric_families.h"
#include "serving/metrics_exposer.h"
#include "transport/kv_shipping.h"
#include "transport/transport.h"

namespace icecache::decode {
namespace {

namespace pb = ::icecache::v1;
using cluster::ToGrpc;

model::SamplingParams ToModel(const pb::SamplingParams& s) {
  model::SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = (s.top_p() <= 0.f || s.top_p() > 1.f) ? 1.f : s.top_p();
  if (s.seed() != 0) p.seed = s.seed();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.logprobs = s.logprobs() ? s.top_logprobs() : -1;
  return p;
}

// Trailing metadata of a RESOURCE_EXHAUSTED Reserve: "never" when the request exceeds the whole
// pool (router/router_server.cc reads it).
constexpr std::string_view kFitsKey = "icecache-fits";

int BudgetOf(const pb::CachePolicy& c, int default_budget) {
  switch (c.policy_case()) {
    case pb::CachePolicy::kFull:
      return 0;
    case pb::CachePolicy::kBudgetPages:
      return c.budget_pages();
    default:
      return default_budget;
  }
}

using Metrics = cluster::DecodeMetrics;

bool Stalled(const DecodeEngine& engine, double stall_seconds) {
  return transport::Clock::now() - engine.last_heartbeat() > std::chrono::duration<double>(stall_seconds);
}

class DecodeServiceImpl final : public pb::DecodeWorker::Service {
 public:
  DecodeServiceImpl(DecodeEngine* engine, const cluster::ClusterConfig& config, const model::ModelConfig& mc)
      : engine_(engine), config_(config), model_config_(mc) {}

  grpc::Status Reserve(grpc::ServerContext* ctx, const pb::ReserveRequest* req, pb::ReserveResponse* resp) override {
    int budget = BudgetOf(req->cache(), config_.cache.default_budget_pages);
    // Bounded: a reservation waits for its prefill at most a day, whatever the router asks.
    const double wait = std::isfinite(req->prefill_wait_seconds()) ? std::min(req->prefill_wait_seconds(), 86400.0) : 0.0;
    PrefixRequest prefix;
    if (req->prompt_token_ids_size() > 0) {
      if (req->prompt_token_ids_size() != req->prompt_tokens()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "prompt_token_ids has " + std::to_string(req->prompt_token_ids_size()) +
                                " ids for prompt_tokens " + std::to_string(req->prompt_tokens()));
      }
      prefix.tokens.assign(req->prompt_token_ids().begin(), req->prompt_token_ids().end());
      prefix.salt = req->cache_salt();
      prefix.local_max_tokens = req->local_prefill_max_tokens();
    }
    auto admitted = engine_->Reserve(req->prompt_tokens(), req->max_tokens(), budget, wait, &prefix);
    if (!admitted.ok()) {
      // Tells the router not to queue a request that no amount of waiting lets in here.
      if (admitted.status().code() == StatusCode::kResourceExhausted &&
          engine_->PagesNeeded(req->prompt_tokens(), req->max_tokens(), budget) > engine_->pool().capacity_pages()) {
        ctx->AddTrailingMetadata(std::string(kFitsKey), "never");
      }
      return ToGrpc(admitted.status());
    }
    resp->set_sequence_id(admitted->id);
    resp->set_reservation_token(admitted->token);
    resp->set_transport_address(engine_->transport_address());
    resp->set_kv_protocol_version(transport::KvProtocolVersion());
    resp->set_cached_tokens(static_cast<int32_t>(admitted->cached_tokens));
    return grpc::Status::OK;
  }

  grpc::Status Decode(grpc::ServerContext* ctx, const pb::DecodeRequest* req,
                      grpc::ServerWriter<pb::DecodeResponse>* writer) override {
    DecodeParams p;
    p.first_token = req->first_token();
    p.sampling = ToModel(req->sampling());
    p.sampling.max_tokens = std::max(1, req->max_tokens());
    p.sampling.stop_ids.assign(req->stop_token_ids().begin(), req->stop_token_ids().end());
    p.sampling.ignore_eos = req->ignore_eos();
    p.sampler_draws_done = req->sampler_draws_done();
    p.prior_tokens.assign(req->prior_tokens().begin(), req->prior_tokens().end());
    double wait = req->kv_wait_seconds() > 0 ? req->kv_wait_seconds() : config_.ucx.transfer_timeout_seconds;
    auto deadline = transport::Clock::now() + std::chrono::duration_cast<transport::Clock::duration>(
                                                  std::chrono::duration<double>(wait));
    // Counted from here: a drain waits for every Decode call to have written its last response.
    decode_calls_.fetch_add(1);
    struct Uncount {
      std::atomic<int>& n;
      ~Uncount() { n.fetch_sub(1); }
    } uncount{decode_calls_};
    auto stream = engine_->Start(req->sequence_id(), req->reservation_token(), p, deadline);
    if (!stream.ok()) return ToGrpc(stream.status());
    bool cancelled = false;
    for (;;) {
      DecodeUpdate u;
      if (!(*stream)->Next(&u, std::chrono::milliseconds(50))) {
        if (!cancelled && ctx->IsCancelled()) {
          cancelled = true;
          engine_->Cancel(req->sequence_id());
        }
        continue;
      }
      pb::DecodeResponse resp;
      for (int32_t t : u.tokens) resp.add_token_ids(t);
      for (const model::TokenLogprobs& l : u.logprobs) {
        auto* lp = resp.add_logprobs();
        lp->set_logprob(l.logprob);
        lp->mutable_top_ids()->Add(l.top_ids.begin(), l.top_ids.end());
        lp->mutable_top_logprobs()->Add(l.top_logprobs.begin(), l.top_logprobs.end());
      }
      if (u.done) {
        if (!u.status.ok()) return ToGrpc(u.status);
        switch (u.finish) {
          case model::FinishReason::kStop:
            resp.set_finish_reason(pb::FINISH_REASON_EOS);
            break;
          default:
            resp.set_finish_reason(pb::FINISH_REASON_LENGTH);
        }
        resp.set_pages_fetched(u.pages_fetched);
        resp.set_retrieval_seconds(u.retrieval_seconds);
      }
      if (!cancelled && !writer->Write(resp)) {
        cancelled = true;
        engine_->Cancel(req->sequence_id());
      }
      if (u.done) return grpc::Status::OK;
    }
  }

  // Decode calls in progress (waiting for KV, streaming or flushing their last responses).
  int decode_calls() const { return decode_calls_.load(); }

  grpc::Status Release(grpc::ServerContext*, const pb::ReleaseRequest* req, pb::ReleaseResponse*) override {
    return ToGrpc(engine_->Release(req->sequence_id(), req->reservation_token()));
  }

  grpc::Status Stats(grpc::ServerContext*, const pb::StatsRequest*, pb::WorkerStats* resp) override {
    if (Stalled(*engine_, config_.decode.health_stall_seconds)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode engine loop is stalled");
    }
    if (engine_->broken()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker's tensor-parallel group failed; restart it");
    }
    DecodeEngineStats s = engine_->stats();
    resp->set_total_pages(s.total_pages);
    resp->set_free_pages(s.total_pages - s.committed_pages);
    resp->set_reserved_pages(s.committed_pages);
    resp->set_active_sequences(s.active_sequences);
    resp->set_page_bytes(s.page_bytes);
    resp->set_model_name(config_.model.dir);
    resp->set_vocab_size(model_config_.vocab_size);
    return grpc::Status::OK;
  }

 private:
  DecodeEngine* engine_;
  const cluster::ClusterConfig config_;
  const model::ModelConfig model_config_;
  std::atomic<int> decode_calls_{0};
};

}  // namespace

struct DecodeServer::Impl {
  cluster::ClusterConfig config;
  std::unique_ptr<model::Model> model;    // tensor_parallel_size 1
  std::unique_ptr<model::TpGroup> group;  // tensor_parallel_size > 1
  model::LanguageModel* lm = nullptr;     // whichever of the two runs
  std::unique_ptr<cluster::CollectiveMetrics> collective;  // tensor parallelism only
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<DecodeEngine> engine;
  std::unique_ptr<DecodeServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string host;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  int metrics_port = 0;
  std::atomic<bool> stop{false};
  std::atomic<bool> draining{false};
  std::thread metrics_thread;

  void UpdateHealth() {
    const bool serving =
        !draining && !stop && !engine->broken() && !Stalled(*engine, config.decode.health_stall_seconds);
    if (auto* h = server->GetHealthCheckService()) {
      h->SetServingStatus(serving);
      h->SetServingStatus("icecache.v1.DecodeWorker", serving);
    }
  }
  std::once_flag shutdown_once;

  void UpdateMetrics(DecodeEngineStats& last, transport::TransportStats& last_transport) {
    DecodeEngineStats s = engine->stats();
    // In use by sequences; retained prefixes are evictable, so they count as free (as vLLM's
    // cache usage counts cached free blocks) and have their own gauge.
    const int64_t live = s.used_pages;
    metrics->kv_host_bytes.Set(static_cast<double>(live * s.page_bytes));
    metrics->kv_usage.Set(s.total_pages ? static_cast<double>(live) / s.total_pages : 0.0);
    metrics->kv_retained_bytes.Set(static_cast<double>(s.retained_pages * s.page_bytes));
    metrics->prefix_entries.Set(static_cast<double>(s.retained_entries));
    metrics->prefix_evictions.Increment(static_cast<double>(s.prefix_evictions - last.prefix_evictions));
    metrics->prefix_lookups.Increment(static_cast<double>(s.prefix_lookups - last.prefix_lookups));
    metrics->prefix_hits.Increment(static_cast<double>(s.prefix_hits - last.prefix_hits));
    metrics->prefix_reused_tokens.Increment(static_cast<double>(s.prefix_reused_tokens - last.prefix_reused_tokens));
    metrics->prefix_computed_tokens.Increment(
        static_cast<double>(s.prefix_computed_tokens - last.prefix_computed_tokens));
    metrics->running.Set(s.active_sequences);
    metrics->generation_tokens.Increment(static_cast<double>(s.tokens_generated - last.tokens_generated));
    metrics->pages_fetched.Increment(static_cast<double>(s.pages_fetched - last.pages_fetched));
    metrics->retrieval.Increment(s.retrieval_seconds - last.retrieval_seconds);
    metrics->kv_gpu_bytes.Set(static_cast<double>(s.device_cache.bytes));
    metrics->cache_hits.Increment(static_cast<double>(s.device_cache.hits - last.device_cache.hits));
    metrics->cache_misses.Increment(static_cast<double>(s.device_cache.misses - last.device_cache.misses));
    metrics->h2d_bytes.Increment(static_cast<double>(s.device_cache.h2d_bytes - last.device_cache.h2d_bytes));
    const transport::TransportStats t = transport->stats();
    metrics->received_bytes.Increment(static_cast<double>(t.bytes_received - last_transport.bytes_received));
    metrics->segments_refused.Increment(static_cast<double>(t.segments_refused - last_transport.segments_refused));
    last_transport = t;
    last = s;
  }
};

DecodeServer::DecodeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<DecodeServer>> DecodeServer::Start(const cluster::ClusterConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (config.model.dir.empty()) return InvalidArgumentError("model.dir is not set (use --model DIR)");
  const int tp = config.parallel.tensor_parallel_size;
  ICE_ASSIGN_OR_RETURN(const kernels::Device device, kernels::ParseDevice(config.decode.device));
  ICE_ASSIGN_OR_RETURN(const std::vector<kernels::Device> devices,
                       cluster::RankDevices(config.decode.devices, tp, "decode"));
  ICE_ASSIGN_OR_RETURN(model::WorkerModel loaded, model::LoadWorkerModel(config.model.dir, {tp, devices, device}));
  impl->model = std::move(loaded.model);
  impl->group = std::move(loaded.group);
  impl->lm = loaded.lm;
  ICE_ASSIGN_OR_RETURN(impl->transport,
                       transport::CreateUcxTransport(transport::UcxOptions{
                           config.ucx.tls, config.ucx.net_devices, config.ucx.peer_failure_detection}));
  DecodeEngineOptions eo;
  eo.page_size = config.cache.page_size;
  eo.threads = config.decode.threads;
  eo.pool_pages = config.decode.pool_pages;
  eo.max_sequences = config.decode.max_sequences;
  eo.reservation_timeout_seconds = std::max(60.0, 4 * config.ucx.transfer_timeout_seconds);
  ICE_ASSIGN_OR_RETURN(eo.kv_dtype, kernels::ParseDType(config.cache.kv_dtype));
  eo.device_cache_pages = static_cast<int>(config.cache.device_cache_pages);
  eo.rest_estimate = config.cache.rest_estimate;
  eo.rest_cells = config.cache.rest_cells;
  eo.prefix_cache = config.decode.prefix_cache;
  if (eo.device_cache_pages == 0 && !kernels::MemoryIsHost(impl->lm->device().backend)) {
    eo.device_cache_pages = static_cast<int>(std::min<int64_t>(config.decode.pool_pages, 65536));
  }
  impl->registry = std::make_shared<prometheus::Registry>();
  if (impl->group) {
    impl->collective = std::make_unique<cluster::CollectiveMetrics>(
        *impl->registry, cluster::ProcessLabels("decode", cluster::ServedModelName(config.model.name, config.model.dir)));
    eo.rank_times_observer = [m = impl->collective.get()](const model::RankStepTimes& t) { m->ObserveStep(t.step, t.collective); };
    ICE_ASSIGN_OR_RETURN(impl->engine, DecodeEngine::Create(impl->group.get(), impl->transport.get(), eo));
  } else {
    ICE_ASSIGN_OR_RETURN(impl->engine, DecodeEngine::Create(impl->model.get(), impl->transport.get(), eo));
  }
  impl->service = std::make_unique<DecodeServiceImpl>(impl->engine.get(), config, impl->lm->config());
  ICE_ASSIGN_OR_RETURN(auto credentials, cluster::InternalServerCredentials(config.internal_tls));
  ICE_ASSIGN_OR_RETURN(impl->server, cluster::StartServer(config.decode.listen, {impl->service.get()},
                                                          {"icecache.v1.DecodeWorker"}, &impl->port,
                                                          config.limits.max_message_bytes, credentials));
  int unused_port = 0;
  ICE_RETURN_IF_ERROR(cluster::SplitHostPort(config.decode.listen, &impl->host, &unused_port));
  impl->metrics = std::make_unique<Metrics>(
      *impl->registry, cluster::ProcessLabels("decode", cluster::ServedModelName(config.model.name, config.model.dir)));
  if (config.decode.metrics_port > 0) {
    ICE_ASSIGN_OR_RETURN(impl->exposer, cluster::StartMetricsExposer(impl->host, config.decode.metrics_port,
                                                                     impl->registry));
    impl->metrics_port = config.decode.metrics_port;
  }
  Impl* raw = impl.get();
  impl->metrics_thread = std::thread([raw] {
    DecodeEngineStats last;
    transport::TransportStats last_transport;
    for (int tick = 0; !raw->stop; ++tick) {
      if (tick % 5 == 0) raw->UpdateMetrics(last, last_transport);
      raw->UpdateHealth();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  ICE_LOG(INFO) << "decode worker serving on " << impl->host << ":" << impl->port << " (model " << config.model.dir
                << " on " << kernels::DeviceName(impl->lm->device())
                << (impl->group ? " and " + std::to_string(impl->group->size() - 1) + " more tensor-parallel ranks over " +
                                      std::string(impl->group->communicator_name())
                                : std::string())
                << ", " << config.decode.pool_pages
                << " host pages, " << eo.device_cache_pages << " device cache pages, "
                << (config.internal_tls.enabled() ? "mutual TLS" : "plaintext internal plane") << ")";
  return std::unique_ptr<DecodeServer>(new DecodeServer(std::move(impl)));
}

DecodeServer::~DecodeServer() { Shutdown(); }

bool DecodeServer::Drain(double seconds) {
  if (impl_->stop) return true;  // already shut down (WorkerMain may stop twice)
  impl_->draining = true;
  impl_->UpdateHealth();
  impl_->engine->StopAdmitting();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  // Live sequences, and Decode calls still sending the tokens of sequences that have ended (a
  // slow reader): Shutdown would cut those off.
  auto busy = [&] { return impl_->engine->stats().active_sequences > 0 || impl_->service->decode_calls() > 0; };
  while (busy()) {
    if (std::chrono::steady_clock::now() >= until) {
      ICE_LOG(WARNING) << "drain: " << impl_->engine->stats().active_sequences
                       << " sequences still live after " << seconds << " s; ending them with UNAVAILABLE";
      // UNAVAILABLE, not CANCELLED: the router migrates these requests to another decode worker.
      impl_->engine->FailAll(UnavailableError("decode worker shut down after its drain period (decode.drain_seconds = " +
                                              std::to_string(seconds) + " s)"));
      const auto flush = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (busy() && std::chrono::steady_clock::now() < flush) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void DecodeServer::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    impl_->draining = true;
    impl_->UpdateHealth();
    impl_->stop = true;
    if (impl_->metrics_thread.joinable()) impl_->metrics_thread.join();
    // Running streams end when the engine goes away; give handlers a moment via the deadline.
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->engine.reset();
    impl_->exposer.reset();
  });
}

void DecodeServer::Wait() { impl_->server->Wait(); }
int DecodeServer::port() const { return impl_->port; }
std::string DecodeServer::address() const { return impl_->host + ":" + std::to_string(impl_->port); }
int DecodeServer::metrics_port() const { return impl_->metrics_port; }
DecodeEngineStats DecodeServer::stats() const { return impl_->engine->stats(); }

}  // namespace icecache::decode
