// The router process as a library: serves icecache.v1.Generation (+ health, reflection) and
// /metrics; validates requests, tokenizes text (when the model directory has a tokenizer), picks
// a decode worker (free KV pages, active sequences) and a prefill worker (queued prompt tokens),
// runs Reserve -> Prefill -> Decode and relays the token stream. Client cancellation and
// deadlines propagate to the workers (their calls are children of the client's call).
// Overload: a request that finds every decode worker full waits in a bounded admission queue
// (router.max_waiting, router.max_queue_wait_seconds; router/admission_queue.h) and is refused
// with RESOURCE_EXHAUSTED only when the queue is full or its wait runs out; at most
// router.max_streams Generate calls run at once. A prefill worker that is full or unreachable is
// skipped for the next one.
// The same request path (router/request_path.h) serves the OpenAI-compatible HTTP API
// (router/http_server.h) on router.http_port when it is set.
// Health: the router reports SERVING (overall and for icecache.v1.Generation) only while at least
// one prefill and one decode worker answer their Stats calls.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "serving/cluster_config.h"

namespace icecache::router {

class RouterServer {
 public:
  // Uses config.model (config.json, optional tokenizer.json; weights are not loaded),
  // config.cache, config.limits, config.router.
  static StatusOr<std::unique_ptr<RouterServer>> Start(const cluster::ClusterConfig& config);
  ~RouterServer();

  int port() const;
  std::string address() const;
  int metrics_port() const;  // 0 when disabled
  int http_port() const;     // the OpenAI-compatible HTTP API (router.http_port); 0 when disabled
  // Requests waiting in the admission queue for a decode worker with room now.
  int queued_requests() const;
  void Wait();
  // Graceful stop, step one (SIGTERM): reports NOT_SERVING (gRPC health and HTTP /health), refuses
  // new requests with UNAVAILABLE and waits up to `seconds` for the streams in progress to end.
  // Returns true when none is left. Shutdown() must still follow.
  bool Drain(double seconds);
  void Shutdown();

 private:
  struct Impl;
  explicit RouterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace icecache::router
