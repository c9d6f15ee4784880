// The router's one request path, whatever transport carries the request (the gRPC Generation
// service, the OpenAI-compatible HTTP API): validation (router/request_checks.h plus the checks
// that need the tokenizer and the model config), chat formatting, tokenizing, the
// router.max_streams limit, admission (router/admission_queue.h), Reserve -> Prefill -> Decode on
// the workers, stop strings, detokenizing, and the router's metrics (icecache_request_* and the
// latency histograms). A transport only translates its request into a v1::GenerateRequest and the
// v1::GenerateResponse stream back into its own shape.
//
// Thread safety: Generate may be called from any number of threads at once.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "icecache/v1/generation.pb.h"
#include "model/config.h"
#include "model/tokenizer/tokenizer.h"
#include "router/prefix_index.h"
#include "serving/cluster_config.h"

namespace prometheus {
class Registry;
}

namespace icecache::router {

class AdmissionQueue;
class WorkerPool;

// Cancellation and deadline of one request, as the transport sees them.
class RequestContext {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~RequestContext() = default;
  // True once the client has cancelled or gone away.
  virtual bool cancelled() const = 0;
  // The request's deadline on the steady clock.
  virtual Clock::time_point deadline() const = 0;
  // A context for one worker call made for this request: it carries the request's deadline and
  // is cancelled when the request is (also when that happens during the call).
  virtual std::shared_ptr<grpc::ClientContext> WorkerContext() = 0;
  // The credentials the client sent ("Bearer KEY"; "" = none).
  virtual std::string authorization() const = 0;
};

// A gRPC call: cancellation and deadline propagate from the ServerContext (worker calls are its
// children). Without a client deadline, `default_timeout` from construction applies.
class GrpcRequestContext final : public RequestContext {
 public:
  GrpcRequestContext(grpc::ServerContext* ctx, std::chrono::duration<double> default_timeout);
  bool cancelled() const override;
  Clock::time_point deadline() const override;
  std::shared_ptr<grpc::ClientContext> WorkerContext() override;
  std::string authorization() const override;  // metadata "authorization"

 private:
  grpc::ServerContext* const ctx_;
  const Clock::time_point deadline_;
};

// Any other transport: cancelled by Cancel() (for HTTP: the client closed the connection).
// Worker contexts handed out and still alive are cancelled at that moment.
// The worker calls of one request (or of one choice of it), cancelled together: Cancel() cancels
// the live ones and every one tracked after it. Thread-safe.
class WorkerCalls {
 public:
  void Cancel();
  bool cancelled() const;
  // Tracks `c` until it is released (cancelled at once when Cancel already ran) and returns it.
  std::shared_ptr<grpc::ClientContext> Track(std::shared_ptr<grpc::ClientContext> c);

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;                                // guarded by mu_
  std::vector<std::weak_ptr<grpc::ClientContext>> live_;  // guarded by mu_
};

class CancellableRequestContext final : public RequestContext {
 public:
  CancellableRequestContext(Clock::time_point deadline, std::string authorization)
      : deadline_(deadline), authorization_(std::move(authorization)) {}
  void Cancel() { calls_.Cancel(); }
  bool cancelled() const override { return calls_.cancelled(); }
  Clock::time_point deadline() const override { return deadline_; }
  std::shared_ptr<grpc::ClientContext> WorkerContext() override;
  std::string authorization() const override { return authorization_; }

 private:
  const Clock::time_point deadline_;
  const std::string authorization_;
  WorkerCalls calls_;
};

// Receives a request's responses in order: the first carries the first token, the last one the
// finish reason, usage and timing. With n > 1 each choice's responses come in that order,
// interleaved with the other choices' (GenerateResponse.index tells them apart), from several
// threads, one Write at a time. Write returns false when the client is gone (the request is
// then cancelled on the workers).
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual bool Write(const v1::GenerateResponse& response) = 0;
};

class RequestPath {
 public:
  // `tokenizer` may be null (the model then serves token ids only). The pools, the admission
  // queue and `registry` must outlive this object. Registers the router's metric families in
  // `registry`.
  RequestPath(const cluster::ClusterConfig& config, model::ModelConfig model_config,
              std::unique_ptr<tokenizer::Tokenizer> tokenizer, WorkerPool* prefill, WorkerPool* decode,
              AdmissionQueue* admission, prometheus::Registry& registry);
  ~RequestPath();
  RequestPath(const RequestPath&) = delete;
  RequestPath& operator=(const RequestPath&) = delete;

  // OK when router.api_keys is empty or `authorization` is "Bearer KEY" for one of them, else
  // UNAUTHENTICATED. Generate checks it first; transports call it for their other endpoints.
  Status Authorize(std::string_view authorization) const;

  // Serves one request, writing its responses to `sink`. An error before the first response
  // means nothing was written; after it, the stream ended early. Errors are the codes listed in
  // proto/icecache/v1/generation.proto; each is counted in icecache_request_errors_total.
  Status Generate(const v1::GenerateRequest& request, RequestContext& ctx, ResponseSink& sink);

  // Counts a request its transport refused before it reached Generate (e.g. an HTTP body that
  // maps to no GenerateRequest), so that every refused request is in icecache_request_errors_total.
  void CountRefused(const Status& status);

  // Draining (SIGTERM): from now on Generate refuses new requests with UNAVAILABLE; requests in
  // progress carry on.
  void StopAdmitting() { draining_ = true; }
  // Requests in Generate now.
  int active_streams() const { return streams_.load(); }

  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const model::ModelConfig& model_config() const { return model_config_; }
  const cluster::ClusterConfig& config() const { return config_; }

 private:
  struct Metrics;
  Status Validate(const v1::GenerateRequest& req, std::vector<int32_t>* ids) const;
  Status Serve(const v1::GenerateRequest& req, RequestContext& ctx, ResponseSink& sink,
               std::chrono::steady_clock::time_point arrival);
  // n > 1: n Serve calls at once, one per choice (seed + i; request id "<id>-i"), each
  // admitted on its own; their responses go to `sink` with their index. The first failing
  // choice cancels the others and its error is the request's.
  Status ServeChoices(const v1::GenerateRequest& req, RequestContext& ctx, ResponseSink& sink,
                      std::chrono::steady_clock::time_point arrival);

  const cluster::ClusterConfig config_;
  const model::ModelConfig model_config_;
  const std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  WorkerPool* const prefill_;
  WorkerPool* const decode_;
  AdmissionQueue* const admission_;
  std::unique_ptr<Metrics> metrics_;
  PrefixIndex prefixes_;  // KV-aware routing (router.prefix_routing)
  std::atomic<int> streams_{0};  // requests in progress (limit: router.max_streams)
  std::atomic<bool> draining_{false};
};

}  // namespace icecache::router
