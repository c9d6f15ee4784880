#include "router/worker_pool.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "common/logging.h"
#include "serving/grpc_util.h"

namespace icecache::router {

StatusOr<std::vector<std::string>> ResolveAll(const std::string& name_and_port) {
  std::string host;
  int port = 0;
  ICE_RETURN_IF_ERROR(cluster::SplitHostPort(name_and_port, &host, &port));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return UnavailableError("cannot resolve '" + host + "': " + gai_strerror(rc));
  std::set<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {0};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out.insert(std::string(buf) + ":" + std::to_string(port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf, sizeof(buf));
      out.insert("[" + std::string(buf) + "]:" + std::to_string(port));
    }
  }
  freeaddrinfo(res);
  return std::vector<std::string>(out.begin(), out.end());
}

WorkerPool::WorkerPool(WorkerKind kind, const cluster::WorkerDiscovery& discovery, double dns_refresh_seconds,
                       double stats_refresh_seconds, std::shared_ptr<grpc::ChannelCredentials> credentials,
                       std::string server_name)
    : kind_(kind),
      discovery_(discovery),
      dns_refresh_seconds_(dns_refresh_seconds),
      stats_refresh_seconds_(stats_refresh_seconds),
      credentials_(std::move(credentials)),
      server_name_(std::move(server_name)) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WorkerPool::Start() {
  Refresh(/*resolve=*/true);
  thread_ = std::thread([this] { Loop(); });
}

void WorkerPool::Loop() {
  auto last_dns = std::chrono::steady_clock::now();
  const auto stats_period = std::chrono::duration<double>(stats_refresh_seconds_);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, stats_period, [&] { return stop_; })) return;
    }
    bool resolve = !discovery_.dns.empty() &&
                   std::chrono::steady_clock::now() - last_dns > std::chrono::duration<double>(dns_refresh_seconds_);
    if (resolve) last_dns = std::chrono::steady_clock::now();
    Refresh(resolve);
  }
}

void WorkerPool::Refresh(bool resolve) {
  if (resolve) {
    std::vector<std::string> addresses = discovery_.addresses;
    if (!discovery_.dns.empty()) {
      auto resolved = ResolveAll(discovery_.dns);
      if (resolved.ok()) {
        addresses.insert(addresses.end(), resolved->begin(), resolved->end());
      } else {
        ICE_LOG(WARNING) << resolved.status().ToString() << " (keeping the previous worker list)";
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& [a, w] : workers_) addresses.push_back(a);
      }
    }
    std::set<std::string> wanted(addresses.begin(), addresses.end());
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      it = wanted.count(it->first) ? std::next(it) : workers_.erase(it);
    }
    for (const auto& a : wanted) {
      if (workers_.count(a)) continue;
      WorkerInfo w;
      w.address = a;
      auto channel = cluster::MakeChannel(a, cluster::kDefaultMaxMessageBytes, credentials_, server_name_);
      if (kind_ == WorkerKind::kPrefill) {
        w.prefill = std::make_shared<v1::PrefillWorker::Stub>(channel);
      } else {
        w.decode = std::make_shared<v1::DecodeWorker::Stub>(channel);
      }
      workers_[a] = std::move(w);
    }
  }
  std::vector<WorkerInfo> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [a, w] : workers_) snapshot.push_back(w);
  }
  bool any_healthy = false;
  for (auto& w : snapshot) {
    const auto started = std::chrono::steady_clock::now();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::StatsRequest req;
    v1::WorkerStats stats;
    grpc::Status s = w.prefill ? w.prefill->Stats(&ctx, req, &stats) : w.decode->Stats(&ctx, req, &stats);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(w.address);
    if (it == workers_.end()) continue;
    // A failure a request saw after this poll began outweighs the poll's success.
    it->second.healthy = s.ok() && it->second.failed_at < started;
    if (s.ok()) it->second.stats = stats;
    any_healthy = any_healthy || it->second.healthy;
  }
  if (any_healthy) cv_.notify_all();
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> down;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [a, w] : workers_) {
      if (!w.healthy) down.push_back(a);
    }
  }
  if (last_round_ != std::chrono::steady_clock::time_point{}) {
    const double seconds = std::chrono::duration<double>(now - last_round_).count();
    std::lock_guard<std::mutex> lock(observer_mu_);
    if (unavailable_observer_) {
      for (const auto& a : down) unavailable_observer_(a, seconds);
    }
  }
  last_round_ = now;
}

void WorkerPool::SetUnavailableObserver(std::function<void(const std::string&, double)> observer) {
  std::lock_guard<std::mutex> lock(observer_mu_);
  unavailable_observer_ = std::move(observer);
}

std::chrono::milliseconds RetryPolicy::Backoff(int attempt) const {
  int64_t ms = 50;
  for (int i = 1; i < attempt && ms < 1000; ++i) ms *= 2;
  return std::chrono::milliseconds(std::min<int64_t>(ms, 1000));
}

void WorkerPool::MarkFailed(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(address);
  if (it == workers_.end()) return;
  it->second.healthy = false;
  it->second.failed_at = std::chrono::steady_clock::now();
}

Status WorkerPool::AwaitReady(const RetryPolicy& policy, int attempt, std::chrono::steady_clock::time_point until,
                              const std::function<bool()>& cancelled) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kCheck = std::chrono::milliseconds(10);  // how soon a client's cancel ends the wait
  const auto backoff_end = std::min(until, Clock::now() + policy.Backoff(std::max(1, attempt)));
  std::unique_lock<std::mutex> lock(mu_);
  auto healthy = [&] {
    for (const auto& [a, w] : workers_) {
      if (w.healthy) return true;
    }
    return false;
  };
  for (;;) {
    if (cancelled()) return CancelledError("request cancelled by the client while waiting for a worker");
    const auto now = Clock::now();
    if (now >= backoff_end && healthy()) return Status::Ok();
    if (now >= until) return DeadlineExceededError("no worker became ready in time");
    if (stop_) return UnavailableError("the router is shutting down");
    cv_.wait_until(lock, std::min(now + kCheck, now < backoff_end ? backoff_end : until));
  }
}

std::vector<WorkerInfo> WorkerPool::Ranked(int64_t claim, const std::vector<std::string>& avoid) {
  auto load = [&](const WorkerInfo& w) {
    return kind_ == WorkerKind::kDecode ? w.stats.active_sequences() + w.inflight
                                        : w.stats.queued_prompt_tokens() + w.inflight;
  };
  std::vector<WorkerInfo> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [a, w] : workers_) out.push_back(w);
  auto avoided = [&](const WorkerInfo& w) { return std::find(avoid.begin(), avoid.end(), w.address) != avoid.end(); };
  std::stable_sort(out.begin(), out.end(), [&](const WorkerInfo& a, const WorkerInfo& b) {
    if (a.healthy != b.healthy) return a.healthy;
    if (avoided(a) != avoided(b)) return !avoided(a);
    if (load(a) != load(b)) return load(a) < load(b);
    return a.stats.free_pages() > b.stats.free_pages();
  });
  // Claiming under the same lock as the ranking keeps concurrent requests from all picking the
  // same worker before any of them has been counted.
  if (claim != 0 && !out.empty()) workers_[out.front().address].inflight += claim;
  return out;
}

size_t WorkerPool::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.size();
}

bool WorkerPool::AnyHealthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [a, w] : workers_) {
    if (w.healthy) return true;
  }
  return false;
}

void WorkerPool::AddInflight(const std::string& address, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(address);
  if (it != workers_.end()) it->second.inflight += delta;
}

}  // namespace icecache::router
