// The router's view of one kind of worker (prefill or decode): their addresses (a static list, or
// every address of a DNS name re-resolved periodically), a channel to each, and their load as
// last reported by Stats, plus the router's own count of requests it has sent there since.
//
// Thread safety: all methods may be called from any thread.
#pragma once

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "icecache/v1/worker.grpc.pb.h"
#include "serving/cluster_config.h"

namespace icecache::router {

enum class WorkerKind { kPrefill, kDecode };

struct WorkerInfo {
  std::string address;
  std::shared_ptr<v1::PrefillWorker::Stub> prefill;  // kind == kPrefill
  std::shared_ptr<v1::DecodeWorker::Stub> decode;    // kind == kDecode
  v1::WorkerStats stats;
  // The last Stats call succeeded, and no request's call failed UNAVAILABLE there since it began
  // (MarkFailed).
  bool healthy = false;
  int64_t inflight = 0;    // requests (decode) or prompt tokens (prefill) routed and not yet done
  std::chrono::steady_clock::time_point failed_at{};  // the last MarkFailed
};

// How a request waits for a worker of one role to be ready again after a failure
// (router.retry_wait_seconds, router.retry_attempts): the one retry policy of the router, used
// by the reservation, the prefill retry and the migration.
struct RetryPolicy {
  double wait_seconds = 30;  // the longest one wait for a ready worker lasts
  int attempts = 8;          // calls after a failure on workers that counted as ready
  // Pause before retry `attempt` (1, 2, ...): 50 ms doubling, at most 1 s.
  std::chrono::milliseconds Backoff(int attempt) const;
};

// Resolves "name:port" to every "ip:port" it has (IPv4 and IPv6). UNAVAILABLE when it does not
// resolve.
StatusOr<std::vector<std::string>> ResolveAll(const std::string& name_and_port);

class WorkerPool {
 public:
  // `credentials` (null = plaintext) and `server_name` are those of the internal plane
  // (serving/internal_tls.h): every channel to a worker is made with them.
  WorkerPool(WorkerKind kind, const cluster::WorkerDiscovery& discovery, double dns_refresh_seconds,
             double stats_refresh_seconds, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
             std::string server_name = "");
  ~WorkerPool();

  // Resolves and polls once (so a fresh router sees its workers), then keeps refreshing in the
  // background.
  void Start();

  // Workers in order of preference: decode by (active sequences + inflight) ascending then free
  // pages descending; prefill by (queued prompt tokens + inflight tokens) ascending. Unhealthy
  // workers come last, and among the healthy (and among the unhealthy) those in `avoid` (workers
  // that failed this request) come after the others. With claim != 0, `claim` is added to the
  // first worker's inflight count in the same critical section (the caller moves or removes it
  // with AddInflight later).
  std::vector<WorkerInfo> Ranked(int64_t claim = 0, const std::vector<std::string>& avoid = {});
  size_t size() const;
  // True when at least one worker answered its last Stats call.
  bool AnyHealthy() const;

  // A request's call to `address` failed UNAVAILABLE (unreachable, killed, draining): it counts
  // as unhealthy (ranked last, not ready for AwaitReady) until a Stats call that starts after
  // this moment succeeds. No-op for an unknown address.
  void MarkFailed(const std::string& address);

  // The retry policy's wait, before retry number `attempt` (1, 2, ...) of a call that failed:
  // sleeps policy.Backoff(attempt), then waits until some worker of this pool is healthy.
  // OK then; CANCELLED as soon as `cancelled()` is true (checked every 10 ms); DEADLINE_EXCEEDED
  // when `until` passes first (the message says so; the caller names the role and the setting).
  Status AwaitReady(const RetryPolicy& policy, int attempt, std::chrono::steady_clock::time_point until,
                    const std::function<bool()>& cancelled);

  // After each Stats round (every stats_refresh_seconds) `observer` gets every worker that is not
  // ready then and the seconds since the previous round (the router's
  // icecache_worker_unavailable_seconds_total). Called on the polling thread; once this returns,
  // the previous observer is not running and is not called again (nullptr clears it).
  void SetUnavailableObserver(std::function<void(const std::string& address, double seconds)> observer);

  // Adjusts the router-side inflight count of `address` (no-op for an unknown address).
  void AddInflight(const std::string& address, int64_t delta);

 private:
  void Refresh(bool resolve);
  void Loop();

  const WorkerKind kind_;
  const cluster::WorkerDiscovery discovery_;
  const double dns_refresh_seconds_;
  const double stats_refresh_seconds_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::string server_name_;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // stop_, and a worker's health

  std::chrono::steady_clock::time_point last_round_{};  // the previous Stats round's end (Refresh)

  std::map<std::string, WorkerInfo> workers_;  // guarded by mu_
  std::mutex observer_mu_;  // held while the observer runs, so a caller that clears it can free what it uses
  std::function<void(const std::string&, double)> unavailable_observer_;  // guarded by observer_mu_
  bool stop_ = false;                          // guarded by mu_
  std::thread thread_;
};

}  // namespace icecache::router
