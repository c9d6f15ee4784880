#include "router/router_server.h"

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "icecache/v1/generation.grpc.pb.h"
#include "model/model_info.h"
#include "serving/grpc_util.h"
#include "serving/internal_tls.h"
#include "serving/metric_families.h"
#include "serving/metrics_exposer.h"
#include "router/admission_queue.h"
#include "router/http_server.h"
#include "router/request_path.h"
#include "router/worker_pool.h"
#include "router/write_watchdog.h"

namespace icecache::router {
namespace {

namespace pb = ::icecache::v1;

// The gRPC transport of the request path: responses go to the ServerWriter as they come.
// A write blocked past router.write_timeout_seconds (a client that stopped reading) is cancelled.
class GenerationServiceImpl final : public pb::Generation::Service {
 public:
  explicit GenerationServiceImpl(RequestPath* path)
      : path_(path), watchdog_(path->config().router.write_timeout_seconds) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                        grpc::ServerWriter<pb::GenerateResponse>* writer) override {
    struct WriterSink final : ResponseSink {
      grpc::ServerWriter<pb::GenerateResponse>* w;
      grpc::ServerContext* ctx;
      WriteWatchdog* watchdog;
      bool Write(const pb::GenerateResponse& r) override {
        return watchdog->Guard([&] { return w->Write(r); }, [this] { ctx->TryCancel(); });
      }
    } sink;
    sink.w = writer;
    sink.ctx = ctx;
    sink.watchdog = &watchdog_;
    GrpcRequestContext rc(ctx, std::chrono::duration<double>(path_->config().router.request_timeout_seconds));
    return cluster::ToGrpc(path_->Generate(*req, rc, sink));
  }

 private:
  RequestPath* const path_;
  WriteWatchdog watchdog_;
};

}  // namespace

struct RouterServer::Impl {
  std::unique_ptr<WorkerPool> prefill;
  std::unique_ptr<WorkerPool> decode;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<prometheus::Exposer> exposer;
  std::unique_ptr<AdmissionQueue> admission;
  std::unique_ptr<RequestPath> path;
  std::unique_ptr<GenerationServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> serving{false};  // the health state, for the HTTP /health too
  std::atomic<bool> draining{false};
  std::string host;
  int port = 0;
  int metrics_port = 0;
  int http_port = 0;
  std::once_flag shutdown_once;
  // Health: SERVING only while some prefill and some decode worker answer.
  std::mutex health_mu;
  std::condition_variable health_cv;
  bool stop = false;
  std::thread health_thread;
};

RouterServer::RouterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const cluster::ClusterConfig& config) {
  auto impl = std::make_unique<Impl>();
  if (config.model.dir.empty()) return InvalidArgumentError("model.dir is not set (use --model DIR)");
  // Config and tokenizer of a HF directory or a GGUF file, without the weights.
  ICE_ASSIGN_OR_RETURN(model::ModelInfo info, model::LoadModelInfo(config.model.dir));
  model::ModelConfig mc = std::move(info.config);
  std::unique_ptr<tokenizer::Tokenizer> tok = std::move(info.tokenizer);
  if (config.router.prefill.addresses.empty() && config.router.prefill.dns.empty()) {
    return InvalidArgumentError("router.prefill: no addresses and no dns name: the router has no prefill workers");
  }
  if (config.router.decode.addresses.empty() && config.router.decode.dns.empty()) {
    return InvalidArgumentError("router.decode: no addresses and no dns name: the router has no decode workers");
  }
  ICE_ASSIGN_OR_RETURN(auto internal_credentials, cluster::InternalChannelCredentials(config.internal_tls));
  impl->prefill = std::make_unique<WorkerPool>(WorkerKind::kPrefill, config.router.prefill,
                                               config.router.dns_refresh_seconds, config.router.stats_refresh_seconds,
                                               internal_credentials, config.internal_tls.server_name);
  impl->decode = std::make_unique<WorkerPool>(WorkerKind::kDecode, config.router.decode,
                                              config.router.dns_refresh_seconds, config.router.stats_refresh_seconds,
                                              internal_credentials, config.internal_tls.server_name);
  impl->prefill->Start();
  impl->decode->Start();
  impl->registry = std::make_shared<prometheus::Registry>();
  impl->admission = std::make_unique<AdmissionQueue>(config.router.max_waiting, config.router.max_queue_wait_seconds);
  impl->path = std::make_unique<RequestPath>(config, std::move(mc), std::move(tok), impl->prefill.get(),
                                             impl->decode.get(), impl->admission.get(), *impl->registry);
  impl->service = std::make_unique<GenerationServiceImpl>(impl->path.get());
  std::shared_ptr<grpc::ServerCredentials> public_credentials;  // null: plaintext
  if (config.router.tls_enabled()) {
    ICE_ASSIGN_OR_RETURN(public_credentials,
                         cluster::PublicServerCredentials(config.router.tls_cert_file, config.router.tls_key_file));
  }
  ICE_ASSIGN_OR_RETURN(impl->server, cluster::StartServer(config.router.listen, {impl->service.get()},
                                                          {"icecache.v1.Generation"}, &impl->port,
                                                          config.limits.max_message_bytes, public_credentials));
  int unused = 0;
  ICE_RETURN_IF_ERROR(cluster::SplitHostPort(config.router.listen, &impl->host, &unused));
  if (config.router.metrics_port > 0) {
    ICE_ASSIGN_OR_RETURN(impl->exposer,
                         cluster::StartMetricsExposer(impl->host, config.router.metrics_port, impl->registry));
    impl->metrics_port = config.router.metrics_port;
  }
  Impl* raw = impl.get();
  auto update_health = [raw] {
    bool serving = !raw->draining && raw->prefill->AnyHealthy() && raw->decode->AnyHealthy();
    raw->serving = serving;
    if (auto* h = raw->server->GetHealthCheckService()) {
      h->SetServingStatus(serving);
      h->SetServingStatus("icecache.v1.Generation", serving);
    }
  };
  update_health();
  if (config.router.http_port > 0) {
    HttpServerOptions ho;
    ho.host = impl->host;
    ho.port = config.router.http_port;
    ho.model_name = cluster::ServedModelName(config.model.name, config.model.dir);
    ho.threads = config.router.http_threads;
    ho.max_body_bytes = config.limits.max_message_bytes;
    if (config.router.write_timeout_seconds > 0) ho.write_timeout_seconds = config.router.write_timeout_seconds;
    ho.tls_cert_file = config.router.tls_cert_file;
    ho.tls_key_file = config.router.tls_key_file;
    ICE_ASSIGN_OR_RETURN(impl->http, HttpServer::Start(ho, impl->path.get(), [raw] { return raw->serving.load(); }));
    impl->http_port = impl->http->port();
  }
  const auto period = std::chrono::duration<double>(config.router.stats_refresh_seconds);
  impl->health_thread = std::thread([raw, update_health, period] {
    std::unique_lock<std::mutex> lock(raw->health_mu);
    while (!raw->health_cv.wait_for(lock, period, [raw] { return raw->stop; })) update_health();
  });
  ICE_LOG(INFO) << "router serving on " << impl->host << ":" << impl->port << " (" << impl->prefill->size()
                << " prefill, " << impl->decode->size() << " decode workers)"
                << (impl->http ? std::string("; OpenAI-compatible HTTP") + (config.router.tls_enabled() ? "S" : "") +
                                     " on port " + std::to_string(impl->http_port)
                               : "")
                << (config.router.tls_enabled() ? "; public ports on TLS" : "");
  return std::unique_ptr<RouterServer>(new RouterServer(std::move(impl)));
}

RouterServer::~RouterServer() { Shutdown(); }

bool RouterServer::Drain(double seconds) {
  impl_->draining = true;
  impl_->serving = false;
  impl_->path->StopAdmitting();
  if (auto* h = impl_->server->GetHealthCheckService()) {
    h->SetServingStatus(false);
    h->SetServingStatus("icecache.v1.Generation", false);
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (impl_->path->active_streams() > 0) {
    if (std::chrono::steady_clock::now() >= until) {
      ICE_LOG(WARNING) << "drain: " << impl_->path->active_streams() << " streams still running after " << seconds
                       << " s; stopping anyway";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void RouterServer::Shutdown() {
  std::call_once(impl_->shutdown_once, [this] {
    {
      std::lock_guard<std::mutex> lock(impl_->health_mu);
      impl_->stop = true;
    }
    impl_->health_cv.notify_all();
    if (impl_->health_thread.joinable()) impl_->health_thread.join();
    if (impl_->http) impl_->http->Shutdown();
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    impl_->exposer.reset();
  });
}

void RouterServer::Wait() { impl_->server->Wait(); }
int RouterServer::port() const { return impl_->port; }
std::string RouterServer::address() const { return impl_->host + ":" + std::to_string(impl_->port); }
int RouterServer::metrics_port() const { return impl_->metrics_port; }
int RouterServer::http_port() const { return impl_->http_port; }
int RouterServer::queued_requests() const { return impl_->admission->waiting(); }

}  // namespace icecache::router
