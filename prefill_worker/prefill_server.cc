#include "prefill_worker/prefill_server.h"

#include <fcntl.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "common/logging.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "kernels/backend.h"
#include "prefill_worker/prefill_engine.h"
#include "serving/grpc_util.h"
#include "serving/internal_tls.h"
#include "serving/metric_families.h"
#include "serving/metrics_exposer.h"
#include "transport/fault_injection.h"
#include "transport/kv_shipping.h"

namespace icecache::prefill {
namespace {

namespace pb = ::icecache::v1;

using Metrics = cluster::PrefillMetrics;

bool Stalled(const PrefillEngine& engine, double stall_seconds) {
  return std::chrono::steady_clock::now() - engine.last_heartbeat() > std::chrono::duration<double>(stall_seconds);
}

class PrefillServiceImpl final : public pb::PrefillWorker::Service {
 public:
  PrefillServiceImpl(PrefillEngine* engine, const model::LanguageModel* model, Metrics* metrics, const std::string& model_dir,
                     double stall_seconds)
      : engine_(engine), model_(model), metrics_(metrics), model_dir_(model_dir), stall_seconds_(stall_seconds) {}

  grpc::Status Prefill(grpc::ServerContext* ctx, const pb::PrefillRequest* req, pb::PrefillResponse* resp) override {
    // The address goes to ucp_ep_create and the token into the KV header: check their shape first.
    if (req->decode_transport_address().empty() ||
        req->decode_transport_address().size() > transport::kMaxTransportAddressBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "decode_transport_address has " + std::to_string(req->decode_transport_address().size()) +
                              " bytes: it must be 1.." + std::to_string(transport::kMaxTransportAddressBytes));
    }
    if (req->decode_kv_protocol_version() != 0 && req->decode_kv_protocol_version() != transport::KvProtocolVersion()) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "the decode worker speaks KV wire version " + std::to_string(req->decode_kv_protocol_version()) +
                              ", this prefill worker " + std::to_string(transport::KvProtocolVersion()) +
                              ": the two run incompatible icecache builds and cannot exchange KV; run one version "
                              "across the cluster's workers");
    }
    if (req->reservation_token().size() != transport::kKvTokenBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "reservation_token must be the " + std::to_string(transport::kKvTokenBytes) +
                              " bytes Reserve returned");
    }
    PrefillJob job;
    job.tokens.assign(req->token_ids().begin(), req->token_ids().end());
    job.token = req->reservation_token();
    const auto& s = req->sampling();
    job.sampling.temperature = s.temperature();
    job.sampling.top_k = s.top_k();
    job.sampling.top_p = (s.top_p() <= 0.f || s.top_p() > 1.f) ? 1.f : s.top_p();
    if (s.seed() != 0) job.sampling.seed = s.seed();
    job.sampling.presence_penalty = s.presence_penalty();
    job.sampling.frequency_penalty = s.frequency_penalty();
    job.sampling.logprobs = s.logprobs() ? s.top_logprobs() : -1;
    job.build_index = req->build_index();
    job.peer = req->decode_transport_address();
    job.transfer_id = req->sequence_id();
    job.cancelled = [ctx] { return ctx->IsCancelled(); };
    metrics_->waiting.Increment();
    in_flight_.fetch_add(1);
    auto r = engine_->Run(std::move(job));
    in_flight_.fetch_sub(1);
    metrics_->waiting.Decrement();
    if (!r.ok()) return cluster::ToGrpc(r.status());
    metrics_->prompt_tokens.Increment(req->token_ids_size());
    metrics_->sent_bytes.Increment(static_cast<double>(r->transfer_bytes));
    metrics_->ObservePhase("queue", r->queue_seconds);
    metrics_->ObservePhase("compute", r->compute_seconds);
    metrics_->ObservePhase("tree_build", r->tree_build_seconds);
    metrics_->ObservePhase("tree_build_total", r->tree_build_total_seconds);
    metrics_->ObservePhase("transfer", r->transfer_seconds);
    resp->set_first_token(r->first_token);
    if (r->first_logprobs) {
      auto* lp = resp->mutable_first_logprob();
      lp->set_logprob(r->first_logprobs->logprob);
      lp->mutable_top_ids()->Add(r->first_logprobs->top_ids.begin(), r->first_logprobs->top_ids.end());
      lp->mutable_top_logprobs()->Add(r->first_logprobs->top_logprobs.begin(), r->first_logprobs->top_logprobs.end());
    }
    resp->set_queue_seconds(r->queue_seconds);
    resp->set_compute_seconds(r->compute_seconds);
    resp->set_tree_build_seconds(r->tree_build_seconds);
    resp->set_transfer_seconds(r->transfer_seconds);
    resp->set_transfer_bytes(r->transfer_bytes);
    resp->set_pages_shipped(r->pages_shipped);
    return grpc::Status::OK;
  }

  // Prefill calls inside the engine (queued, computing or shipping).
  int in_flight() const { return in_flight_.load(); }

  grpc::Status Stats(grpc::ServerContext*, const pb::StatsRequest*, pb::WorkerStats* resp) override {
    if (Stalled(*engine_, stall_seconds_)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill engine shows no sign of life");
    }
    if (draining_.load()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker is draining");
    if (engine_->broken()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "prefill worker's tensor-parallel group failed; restart it");
    }
    resp->set_queued_prompt_tokens(engine_->queued_tokens());
    resp->set_model_name(model_dir_);
    resp->set_vocab_size(model_->config().vocab_size);
    return grpc::Status::OK;
  }

 private:
  PrefillEngine* engine_;
  const model::LanguageModel* model_;
  Metrics* metrics_;
  std::string model_dir_;
  double stall_seconds_;
  std::atomic<int> in_flight_{0};

 public:
  std::atomic<bool> draining_{false};
};

}  // namespace

struct PrefillServer::Impl {
  std::unique_ptr<model::Model> model;    // tensor_parallel_size 1
  std::unique_ptr<model::TpGroup> group;  // tensor_parallel_size > 1
  model::LanguageModel* lm = nullptr;     // whichever of the two runs
  std::unique_ptr<transport::Transport> transport;
  std::unique_ptr<transport::FaultInjectionTransport> faults;  // test hook only (kStallEnv)
  std::unique_ptr<PrefillEngine> engine;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<cluster::CollectiveMetrics> collective;  // tensor parallelism only
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<PrefillServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string host;
  int port = 0;
  std::once_flag shutdown_once;
  double stall_seconds = 120;
  std::mutex health_mu;
  std::condition_variable health_cv;
  bool stop = false;  // guarded by health_mu
  std::thread health_thread;

  void UpdateHealth(bool stopping) {
    const bool serving = !stopping && !service->draining_.load() && !engine->broken() && !Stalled(*engine, stall_seconds);
    if (auto* h = server->GetHealthCheckService()) {
      h->SetServingStatus(serving);
      h->SetServingStatus("icecache.v1.PrefillWorker", serving);
    }
  }
};

PrefillServer::PrefillServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {
// Test-only fault hook (tests/cluster/prefill_retry_test.cc): with N > 0, every transfer of this
// worker stops after its first N segments (the start notice counts) and the shipping thread
// stalls, logging "fault injection: transfer ID stalls after N segments", so that a test can
// kill -9 the worker mid-shipment. Never set in production; the worker logs a warning when it is.
constexpr const char* kStallEnv = "ICECACHE_TEST_PREFILL_STALL_AFTER_SEGMENTS";

// With ICECACHE_TEST_PREFILL_STALL_ONCE_FILE=PATH as well, only the process that creates PATH
// (O_EXCL) takes the hook and writes its pid there: one worker of a cluster whose processes all
// inherit the environment (`icecache cluster`), and not the same worker once restarted.
constexpr const char* kStallOnceEnv = "ICECACHE_TEST_PREFILL_STALL_ONCE_FILE";

int64_t StallAfterSegments() {
  const char* v = std::getenv(kStallEnv);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (end == nullptr || *end != '\0' || n <= 0) return -1;
  if (const char* once = std::getenv(kStallOnceEnv); once != nullptr && *once != '\0') {
    const int fd = open(once, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return -1;
    const std::string pid = std::to_string(getpid());
    const bool written = write(fd, pid.data(), pid.size()) == static_cast<ssize_t>(pid.size());
    close(fd);
    if (!written) return -1;
  }
  return n;
}
}  // namespace

StatusOr<std::unique_ptr<PrefillServer>> PrefillServer::Start(const cluster::ClusterConfig& config) {
  auto impl = std::make_unique<Impl>();
  if (config.model.dir.empty()) return InvalidArgumentError("model.dir is not set (use --model DIR)");
  PrefillEngineOptions eo;
  auto preset = kvstore::DciParamsPreset(config.cache.dci_preset);
  if (!preset.ok()) return preset.status().WithContext("cache.dci_preset");
  eo.dci = preset.value();
  if (config.cache.dci_fov_fraction > 0) eo.dci.fov_fraction = config.cache.dci_fov_fraction;
  if (config.cache.dci_fov_min > 0) eo.dci.fov_min = config.cache.dci_fov_min;
  if (config.cache.dci_group_fov > 0) eo.dci.group_fov = config.cache.dci_group_fov;
  // A config built in code skips the YAML parser's range checks: refuse bad tree parameters at
  // start (before loading the model) rather than on every request.
  ICE_RETURN_IF_ERROR(kvstore::ValidateDciParams(eo.dci).WithContext("cache.dci_*"));
  const int tp = config.parallel.tensor_parallel_size;
  ICE_ASSIGN_OR_RETURN(const kernels::Device device, kernels::ParseDevice(config.prefill.device));
  ICE_ASSIGN_OR_RETURN(const std::vector<kernels::Device> devices,
                       cluster::RankDevices(config.prefill.devices, tp, "prefill"));
  ICE_ASSIGN_OR_RETURN(model::WorkerModel loaded, model::LoadWorkerModel(config.model.dir, {tp, devices, device}));
  impl->model = std::move(loaded.model);
  impl->group = std::move(loaded.group);
  impl->lm = loaded.lm;
  ICE_ASSIGN_OR_RETURN(impl->transport,
                       transport::CreateUcxTransport(transport::UcxOptions{
                           config.ucx.tls, config.ucx.net_devices, config.ucx.peer_failure_detection}));
  transport::Transport* shipping = impl->transport.get();
  if (const int64_t stall = StallAfterSegments(); stall > 0) {
    impl->faults = std::make_unique<transport::FaultInjectionTransport>(shipping);
    transport::FaultPlan plan;
    plan.stall_after_segments = stall;
    plan.stall_for = std::chrono::minutes(10);
    impl->faults->set_plan(plan);
    shipping = impl->faults.get();
    ICE_LOG(WARNING) << kStallEnv << "=" << stall << ": TEST FAULT HOOK ON, every transfer stalls after " << stall
                     << " segments";
  }
  eo.page_size = config.cache.page_size;
  eo.threads = config.prefill.threads;
  eo.dense_layers = config.cache.dense_layers;
  eo.sink_pages = config.cache.sink_pages;
  eo.window_pages = config.cache.window_pages;
  eo.ice_group = config.cache.ice_group;
  eo.max_batch_tokens = config.prefill.max_batch_tokens;
  eo.transfer_timeout_seconds = config.ucx.transfer_timeout_seconds;
  ICE_ASSIGN_OR_RETURN(eo.kv_dtype, kernels::ParseDType(config.cache.kv_dtype));
  eo.overlap_tree_build = config.prefill.overlap_tree_build;
  eo.max_segment_bytes = static_cast<size_t>(config.ucx.max_segment_bytes);
  eo.max_queued_requests = config.prefill.max_queued_requests;
  impl->registry = std::make_shared<prometheus::Registry>();
  if (impl->group) {
    impl->collective = std::make_unique<cluster::CollectiveMetrics>(
        *impl->registry, cluster::ProcessLabels("prefill", cluster::ServedModelName(config.model.name, config.model.dir)));
    eo.rank_times_observer = [m = impl->collective.get()](const model::RankStepTimes& t) { m->ObserveStep(t.step, t.collective); };
  }
  impl->engine = impl->group ? std::make_unique<PrefillEngine>(impl->group.get(), shipping, eo)
                             : std::make_unique<PrefillEngine>(impl->model.get(), shipping, eo);
  impl->metrics = std::make_unique<Metrics>(
      *impl->registry, cluster::ProcessLabels("prefill", cluster::ServedModelName(config.model.name, config.model.dir)));
  impl->service = std::make_unique<PrefillServiceImpl>(impl->engine.get(), impl->lm, impl->metrics.get(),
                                                       config.model.dir, config.prefill.health_stall_seconds);
  ICE_ASSIGN_OR_RETURN(auto credentials, cluster::InternalServerCredentials(config.internal_tls));
  ICE_ASSIGN_OR_RETURN(impl->server, cluster::StartServer(config.prefill.listen, {impl->service.get()},
                                                          {"icecache.v1.PrefillWorker"}, &impl->port,
                                                          config.limits.max_message_bytes, credentials));
  int unused = 0;
  ICE_RETURN_IF_ERROR(cluster::SplitHostPort(config.prefill.listen, &impl->host, &unused));
  if (config.prefill.metrics_port > 0) {
    ICE_ASSIGN_OR_RETURN(impl->exposer,
                         cluster::StartMetricsExposer(impl->host, config.prefill.metrics_port, impl->registry));
  }
  impl->stall_seconds = config.prefill.health_stall_seconds;
  Impl* raw = impl.get();
  impl->health_thread = std::thread([raw] {
    std::unique_lock<std::mutex> lock(raw->health_mu);
    while (!raw->health_cv.wait_for(lock, std::chrono::milliseconds(100), [raw] { return raw->stop; })) {
      raw->UpdateHealth(false);
    }
  });
  ICE_LOG(INFO) << "prefill worker serving on " << impl->host << ":" << impl->port << " (model " << config.model.dir
                << ", " << (impl->group ? std::to_string(impl->group->size()) + " tensor-parallel ranks over " +
                                              std::string(impl->group->communicator_name())
                                        : std::string("1 rank"))
                << (config.internal_tls.enabled() ? ", mutual TLS" : ", plaintext internal plane") << ")";
  return std::unique_ptr<PrefillServer>(new PrefillServer(std::move(impl)));
}

PrefillServer::~PrefillServer() { Shutdown(); }

bool PrefillServer::Drain(double seconds) {
  {
    std::lock_guard<std::mutex> lock(impl_->health_mu);
    if (impl_->stop) return true;  // already shut down
  }
  impl_->service->draining_ = true;
  impl_->UpdateHealth(/*stopping=*/true);
  impl_->engine->StopAdmitting();
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->service->in_flight() > 0) {
    if (std::chrono::steady_clock::now() >= until) {
      ICE_LOG(WARNING) << "drain: " << impl_->service->in_flight() << " prefill calls still running after " << seconds
                       << " s; stopping anyway";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void PrefillServer::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    {
      std::lock_guard<std::mutex> lock(impl_->health_mu);
      impl_->stop = true;
    }
    impl_->health_cv.notify_all();
    if (impl_->health_thread.joinable()) impl_->health_thread.join();
    impl_->UpdateHealth(/*stopping=*/true);
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->engine.reset();
    impl_->exposer.reset();
  });
}

void PrefillServer::Wait() { impl_->server->Wait(); }
int PrefillServer::port() const { return impl_->port; }
PrefillEngineStats PrefillServer::engine_stats() const { return impl_->engine->stats(); }
std::string PrefillServer::address() const { return impl_->host + ":" + std::to_string(impl_->port); }

}  // namespace icecache::prefill
