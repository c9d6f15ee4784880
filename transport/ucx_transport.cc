// UCX implementation of Transport. One ucp worker owned by one progress thread: every ucp call
// except ucp_worker_signal happens on that thread; other threads post closures to it and wait on
// condition variables. Segments travel as active messages (id kData) whose header names the
// transfer and the segment and carries the transfer's token; kFinish carries the segment count
// and the token. A message whose token is not the transfer's is dropped in the AM callback,
// before the sink runs (for a rendezvous segment: before any of its data moves).
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/logging.h"
#include "common/secure_random.h"
#include "transport/transport.h"

namespace icecache::transport {
namespace {

// Our address = "ICUX" | u32 length | u32 FNV-1a of the UCX worker address | the UCX address.
// Peers hand addresses over gRPC; the frame lets Send refuse a truncated, padded or foreign
// address before its bytes reach ucp_ep_create (which trusts them).
constexpr char kAddressMagic[4] = {'I', 'C', 'U', 'X'};
constexpr size_t kAddressFrame = 12;

uint32_t Fnv1a(std::string_view bytes) {
  uint32_t h = 2166136261u;
  for (char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

std::string FrameAddress(std::string_view ucx) {
  std::string out(kAddressMagic, 4);
  const uint32_t len = static_cast<uint32_t>(ucx.size()), sum = Fnv1a(ucx);
  out.append(reinterpret_cast<const char*>(&len), 4);
  out.append(reinterpret_cast<const char*>(&sum), 4);
  out.append(ucx);
  return out;
}

StatusOr<std::string_view> UnframeAddress(const std::string& peer) {
  if (peer.empty()) return InvalidArgumentError("empty transport address");
  if (peer.size() > kMaxTransportAddressBytes) {
    return InvalidArgumentError("transport address of " + std::to_string(peer.size()) + " bytes is longer than " +
                                std::to_string(kMaxTransportAddressBytes));
  }
  uint32_t len = 0, sum = 0;
  if (peer.size() < kAddressFrame || std::memcmp(peer.data(), kAddressMagic, 4) != 0) {
    return InvalidArgumentError("not an icecache transport address");
  }
  std::memcpy(&len, peer.data() + 4, 4);
  std::memcpy(&sum, peer.data() + 8, 4);
  std::string_view ucx(peer.data() + kAddressFrame, peer.size() - kAddressFrame);
  if (len != ucx.size() || len == 0 || Fnv1a(ucx) != sum) {
    return InvalidArgumentError("transport address is truncated or corrupt");
  }
  return ucx;
}


constexpr unsigned kAmData = 1;
constexpr unsigned kAmFinish = 2;

struct WireHeader {
  uint64_t transfer_id;
  uint32_t value;  // segment index (kData) or total segments (kFinish)
  uint32_t reserved;
  char token[kTransferTokenBytes];  // the transfer's token, as the receiver's Expect named it
};
static_assert(sizeof(WireHeader) == 32);

Status CheckToken(std::string_view token) {
  if (token.size() == kTransferTokenBytes) return Status::Ok();
  return InvalidArgumentError("transfer token has " + std::to_string(token.size()) + " bytes, expected " +
                              std::to_string(kTransferTokenBytes));
}

std::string UcsError(ucs_status_t s) { return ucs_status_string(s); }

// State of one expected (received) transfer. Guarded by UcxTransport::mu_.
struct RecvTransfer {
  std::string token;  // what every message of this transfer must carry
  ScatterSink sink;
  uint64_t received = 0;
  int64_t total = -1;  // set by kFinish
  int inflight = 0;    // rendezvous receives not yet completed
  std::vector<void*> requests;  // the in-flight ucp requests, for cancellation
  Status failure;      // first error
  bool cancelled = false;
  bool closed = false;  // Wait gave up: reject everything that arrives from now on
  uint64_t bytes = 0;
  bool refusal_logged = false;  // a message with another token was refused (and logged) already
};

// Completion state of one Send/Finish call (shared with the ucp callbacks).
struct SendBatch {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
  ucs_status_t first_error = UCS_OK;
  bool issued = false;  // all requests were posted
  ucp_ep_h ep = nullptr;  // set on the progress thread before `issued`
  std::vector<WireHeader> headers;  // the AM headers, referenced by UCX until each send completes
};

// How long a sender past its deadline waits for the force-closed endpoint's sends to complete
// before it gives up on them (UCX 1.13 does not always complete them: a peer killed while
// endpoints run without peer error handling).
constexpr auto kForceCloseGrace = std::chrono::seconds(5);

class UcxTransport final : public Transport {
 public:
  ~UcxTransport() override;
  static StatusOr<std::unique_ptr<Transport>> Create(const UcxOptions& options);

  const std::string& address() const override { return address_; }
  Status Expect(uint64_t id, std::string_view token, SegmentSink sink) override;
  Status ExpectScatter(uint64_t id, std::string_view token, ScatterSink sink) override;
  Status Wait(uint64_t id, Clock::time_point deadline) override;
  void Cancel(uint64_t id) override;
  Status Send(const std::string& peer, uint64_t id, std::string_view token, std::span<const Segment> segments,
              Clock::time_point deadline) override;
  Status Finish(const std::string& peer, uint64_t id, std::string_view token, uint32_t total_segments,
                Clock::time_point deadline) override;
  TransportStats stats() const override;

 private:
  UcxTransport() = default;
  Status Init(const UcxOptions& options);
  void ProgressLoop();
  void Post(std::function<void()> fn);
  // Progress thread only.
  StatusOr<ucp_ep_h> Endpoint(const std::string& peer);
  void DropEndpoint(ucp_ep_h ep, bool force);
  Status SendMessages(const std::string& peer, unsigned am_id, uint64_t id, std::string_view token,
                      std::span<const Segment> segments, uint32_t finish_total, Clock::time_point deadline);
  // True when `h` carries `t`'s token. Otherwise counts the refusal and returns false, with
  // `log` set for the first refusal of the transfer. REQUIRES: mu_ held.
  bool Admit(RecvTransfer& t, const WireHeader& h, bool* log);

  static ucs_status_t OnData(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  static ucs_status_t OnFinish(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static void OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnSendDone(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  bool IsDone(const RecvTransfer& t) const {
    return t.total >= 0 && t.received == static_cast<uint64_t>(t.total) && t.inflight == 0;
  }

  // Constant after Init.
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::string address_;
  bool peer_failure_detection_ = false;
  std::thread thread_;

  std::atomic<bool> stop_{false};
  std::mutex post_mu_;
  std::deque<std::function<void()>> posted_;  // guarded by post_mu_

  // Progress thread only.
  std::unordered_map<std::string, ucp_ep_h> endpoints_;
  // Send batches given up on after a force-close (their requests may still complete and call
  // OnSendDone with them): kept until the worker is destroyed. Guarded by mu_.
  std::vector<std::shared_ptr<SendBatch>> abandoned_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a transfer changed state
  std::unordered_map<uint64_t, RecvTransfer> transfers_;  // guarded by mu_
  TransportStats stats_;                                   // guarded by mu_
};

struct RecvContext {
  UcxTransport* self;
  uint64_t id;
  size_t bytes;
  std::vector<ucp_dt_iov_t> iov;  // scatter receives: must outlive the request
};

// Merges pieces adjacent in memory, drops empty ones and checks that they add up to `length`.
StatusOr<std::vector<Destination>> Coalesce(std::vector<Destination> pieces, size_t length) {
  std::vector<Destination> out;
  size_t total = 0;
  for (const Destination& d : pieces) {
    total += d.bytes;
    if (d.bytes == 0) continue;
    if (d.data == nullptr) return InvalidArgumentError("sink gave a null destination");
    if (!out.empty() && static_cast<char*>(out.back().data) + out.back().bytes == d.data) {
      out.back().bytes += d.bytes;
    } else {
      out.push_back(d);
    }
  }
  if (total != length) {
    return InvalidArgumentError("sink gave " + std::to_string(total) + " bytes for a segment of " +
                                std::to_string(length));
  }
  return out;
}

StatusOr<std::unique_ptr<Transport>> UcxTransport::Create(const UcxOptions& options) {
  std::unique_ptr<UcxTransport> t(new UcxTransport());
  ICE_RETURN_IF_ERROR(t->Init(options));
  return std::unique_ptr<Transport>(std::move(t));
}

Status UcxTransport::Init(const UcxOptions& options) {
  peer_failure_detection_ = options.peer_failure_detection;
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return InternalError("ucp_config_read: " + UcsError(s));
  if (!options.tls.empty() && (s = ucp_config_modify(config, "TLS", options.tls.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return InvalidArgumentError("ucx.tls '" + options.tls + "': " + UcsError(s));
  }
  if (!options.net_devices.empty() &&
      (s = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str())) != UCS_OK) {
    ucp_config_release(config);
    return InvalidArgumentError("ucx.net_devices '" + options.net_devices + "': " + UcsError(s));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (s != UCS_OK) return UnavailableError("ucp_init (tls '" + options.tls + "'): " + UcsError(s));

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((s = ucp_worker_create(context_, &wp, &worker_)) != UCS_OK) {
    return UnavailableError("ucp_worker_create: " + UcsError(s));
  }
  if ((s = ucp_worker_get_efd(worker_, &event_fd_)) != UCS_OK) {
    return UnavailableError("ucp_worker_get_efd: " + UcsError(s));
  }
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  if ((s = ucp_worker_get_address(worker_, &addr, &addr_len)) != UCS_OK) {
    return UnavailableError("ucp_worker_get_address: " + UcsError(s));
  }
  address_ = FrameAddress(std::string_view(reinterpret_cast<const char*>(addr), addr_len));
  ucp_worker_release_address(worker_, addr);

  for (unsigned id : {kAmData, kAmFinish}) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = id == kAmData ? &UcxTransport::OnData : &UcxTransport::OnFinish;
    hp.arg = this;
    if ((s = ucp_worker_set_am_recv_handler(worker_, &hp)) != UCS_OK) {
      return InternalError("ucp_worker_set_am_recv_handler: " + UcsError(s));
    }
  }
  thread_ = std::thread([this] { ProgressLoop(); });
  return Status::Ok();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    Post([this] {
      for (auto& [peer, ep] : endpoints_) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        void* req = ucp_ep_close_nbx(ep, &p);
        if (UCS_PTR_IS_PTR(req)) {
          while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
          ucp_request_free(req);
        }
      }
      endpoints_.clear();
      stop_ = true;
    });
    thread_.join();
  }
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

void UcxTransport::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    posted_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_);
}

void UcxTransport::ProgressLoop() {
  // Busy-progress while traffic flows (some transports, shared memory among them, do not always
  // signal the event fd), sleep on the event fd once idle for a while.
  constexpr auto kSpin = std::chrono::milliseconds(2);
  auto last_activity = std::chrono::steady_clock::now();
  while (!stop_) {
    std::deque<std::function<void()>> work;
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      work.swap(posted_);
    }
    for (auto& fn : work) fn();
    if (stop_) break;
    if (ucp_worker_progress(worker_) != 0 || !work.empty()) {
      last_activity = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last_activity < kSpin) {
      std::this_thread::yield();
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(post_mu_);
      if (!posted_.empty()) continue;
    }
    ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;
    pollfd pfd{event_fd_, POLLIN, 0};
    // The timeout only bounds the cost of a missed wakeup; events normally end the wait.
    if (poll(&pfd, 1, 20) > 0) last_activity = std::chrono::steady_clock::now();
  }
}

StatusOr<ucp_ep_h> UcxTransport::Endpoint(const std::string& peer) {
  auto it = endpoints_.find(peer);
  if (it != endpoints_.end()) return it->second;
  ICE_ASSIGN_OR_RETURN(std::string_view ucx_address, UnframeAddress(peer));
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(ucx_address.data());
  ep.err_mode = peer_failure_detection_ ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  ep.err_handler.cb = &UcxTransport::OnEndpointError;
  ep.err_handler.arg = this;
  ucp_ep_h handle = nullptr;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &handle);
  if (s != UCS_OK) return UnavailableError("cannot connect to transport peer: " + UcsError(s));
  endpoints_[peer] = handle;
  return handle;
}

void UcxTransport::DropEndpoint(ucp_ep_h ep, bool force) {
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    if (it->second != ep) continue;
    endpoints_.erase(it);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    // Outstanding requests of a force-closed endpoint complete with errors during progress; the
    // close request itself is freed once done.
    if (UCS_PTR_IS_PTR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(req);
    }
    return;
  }
}

void UcxTransport::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxTransport*>(arg);
  ICE_LOG(WARNING) << "transport peer failed: " << UcsError(status);
  // Called from inside progress; close it afterwards so that requests on it finish first.
  self->Post([self, ep] { self->DropEndpoint(ep, /*force=*/true); });
}

ucs_status_t UcxTransport::OnData(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if (header_length != sizeof(WireHeader)) return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  WireHeader h;
  std::memcpy(&h, header, sizeof(h));
  std::unique_lock<std::mutex> lock(self->mu_);
  auto it = self->transfers_.find(h.transfer_id);
  if (it == self->transfers_.end()) return rndv ? UCS_ERR_CANCELED : UCS_OK;
  bool log = false;
  if (!self->Admit(it->second, h, &log)) {
    lock.unlock();
    if (log) {
      ICE_LOG(WARNING) << "transfer " << h.transfer_id << ": refused segment " << h.value
                       << " from a sender without the transfer's token (later refusals are only counted)";
    }
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  if (it->second.closed || !it->second.failure.ok() || it->second.cancelled) {
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  }
  RecvTransfer& t = it->second;
  StatusOr<std::vector<Destination>> dest = t.sink(h.value, length);
  if (dest.ok()) dest = Coalesce(std::move(*dest), length);
  if (!dest.ok()) {
    t.failure = AbortedError("segment " + std::to_string(h.value) + " refused: " + dest.status().message());
    self->cv_.notify_all();
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
  }
  if (!rndv) {
    size_t offset = 0;
    for (const Destination& d : *dest) {
      std::memcpy(d.data, static_cast<const char*>(data) + offset, d.bytes);
      offset += d.bytes;
    }
    ++t.received;
    t.bytes += length;
    self->stats_.bytes_received += length;
    ++self->stats_.segments_received;
    self->cv_.notify_all();
    return UCS_OK;
  }
  auto* ctx = new RecvContext{self, h.transfer_id, length, {}};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &UcxTransport::OnRecvDone;
  p.user_data = ctx;
  void* buffer = length == 0 ? nullptr : dest->front().data;
  size_t count = length;
  if (dest->size() > 1) {
    for (const Destination& d : *dest) ctx->iov.push_back({d.data, d.bytes});
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    buffer = ctx->iov.data();
    count = ctx->iov.size();
  }
  ++t.inflight;
  // The completion callback may run inside this call (it takes mu_): release the lock first.
  lock.unlock();
  void* req = ucp_am_recv_data_nbx(self->worker_, data, buffer, count, &p);
  if (req == nullptr) {
    OnRecvDone(nullptr, UCS_OK, length, ctx);
  } else if (UCS_PTR_IS_ERR(req)) {
    OnRecvDone(nullptr, UCS_PTR_STATUS(req), length, ctx);
  } else {
    // Completion callbacks run only during progress on this thread, so `req` is still live.
    lock.lock();
    auto again = self->transfers_.find(h.transfer_id);
    if (again != self->transfers_.end() && ucp_request_check_status(req) == UCS_INPROGRESS) {
      again->second.requests.push_back(req);
    }
  }
  return UCS_OK;
}

void UcxTransport::OnRecvDone(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* ctx = static_cast<RecvContext*>(user_data);
  UcxTransport* self = ctx->self;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    auto it = self->transfers_.find(ctx->id);
    if (it != self->transfers_.end()) {
      RecvTransfer& t = it->second;
      --t.inflight;
      if (request) std::erase(t.requests, request);
      if (status == UCS_OK) {
        ++t.received;
        t.bytes += ctx->bytes;
        self->stats_.bytes_received += ctx->bytes;
        ++self->stats_.segments_received;
      } else if (t.failure.ok()) {
        t.failure = DataLossError("segment receive failed: " + UcsError(status));
      }
      self->cv_.notify_all();
    }
  }
  if (request) ucp_request_free(request);
  delete ctx;
}

ucs_status_t UcxTransport::OnFinish(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (header_length != sizeof(WireHeader)) return UCS_OK;
  WireHeader h;
  std::memcpy(&h, header, sizeof(h));
  bool log = false;
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    auto it = self->transfers_.find(h.transfer_id);
    if (it == self->transfers_.end()) return UCS_OK;
    if (self->Admit(it->second, h, &log)) {
      if (!it->second.closed) {
        it->second.total = h.value;
        self->cv_.notify_all();
      }
      return UCS_OK;
    }
  }
  if (log) {
    ICE_LOG(WARNING) << "transfer " << h.transfer_id << ": ignored an end-of-transfer message from a sender without "
                     << "the transfer's token (later refusals are only counted)";
  }
  return UCS_OK;
}

bool UcxTransport::Admit(RecvTransfer& t, const WireHeader& h, bool* log) {
  if (ConstantTimeEqual(std::string_view(h.token, kTransferTokenBytes), t.token)) return true;
  ++stats_.segments_refused;
  *log = !t.refusal_logged;
  t.refusal_logged = true;
  return false;
}

Status UcxTransport::Expect(uint64_t id, std::string_view token, SegmentSink sink) {
  return ExpectScatter(id, token, [sink = std::move(sink)](uint32_t index, size_t bytes) -> StatusOr<std::vector<Destination>> {
    ICE_ASSIGN_OR_RETURN(void* dest, sink(index, bytes));
    return std::vector<Destination>{{dest, bytes}};
  });
}

Status UcxTransport::ExpectScatter(uint64_t id, std::string_view token, ScatterSink sink) {
  ICE_RETURN_IF_ERROR(CheckToken(token));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = transfers_.try_emplace(id);
  if (!inserted) return AlreadyExistsError("transfer " + std::to_string(id) + " is already expected");
  it->second.token = std::string(token);
  it->second.sink = std::move(sink);
  return Status::Ok();
}

void UcxTransport::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  it->second.cancelled = true;
  cv_.notify_all();
}

Status UcxTransport::Wait(uint64_t id, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return NotFoundError("transfer " + std::to_string(id) + " is not expected");
  RecvTransfer* t = &it->second;
  bool timed_out = !cv_.wait_until(lock, deadline, [&] {
    return IsDone(*t) || !t->failure.ok() || t->cancelled;
  });
  Status result;
  if (IsDone(*t) && t->failure.ok() && !t->cancelled) {
    ++stats_.transfers_completed;
  } else {
    if (t->cancelled) {
      result = CancelledError("transfer " + std::to_string(id) + " was cancelled");
    } else if (!t->failure.ok()) {
      result = t->failure;
    } else {
      result = DeadlineExceededError(
          "transfer " + std::to_string(id) + " stalled: " + std::to_string(t->received) + " segments arrived" +
          (t->total >= 0 ? " of " + std::to_string(t->total) : ", end not announced") +
          (timed_out ? " by the deadline" : ""));
    }
    ++stats_.transfers_failed;
    t->closed = true;
    // Writes into sink memory may still be in flight: cancel them and wait until UCX reports each
    // one finished before letting the caller free the memory.
    if (t->inflight > 0) {
      // Requests are freed only on the progress thread, so checking membership there right
      // before each cancel keeps the handle valid.
      Post([this, id] {
        std::vector<void*> reqs;
        {
          std::lock_guard<std::mutex> l(mu_);
          auto found = transfers_.find(id);
          if (found != transfers_.end()) reqs = found->second.requests;
        }
        for (void* r : reqs) {
          {
            std::lock_guard<std::mutex> l(mu_);
            auto found = transfers_.find(id);
            if (found == transfers_.end() || std::find(found->second.requests.begin(),
                                                       found->second.requests.end(), r) ==
                                                 found->second.requests.end()) {
              continue;
            }
          }
          ucp_request_cancel(worker_, r);
        }
      });
      auto warn_at = Clock::now() + std::chrono::seconds(5);
      while (t->inflight > 0) {
        if (cv_.wait_until(lock, warn_at) == std::cv_status::timeout) {
          ICE_LOG(WARNING) << "transfer " << id << ": still waiting for " << t->inflight
                           << " cancelled receives to finish";
          warn_at = Clock::now() + std::chrono::seconds(5);
        }
      }
    }
  }
  transfers_.erase(id);
  return result;
}

void UcxTransport::OnSendDone(void* request, ucs_status_t status, void* user_data) {
  auto* batch = static_cast<SendBatch*>(user_data);
  ucp_request_free(request);
  // Notify with the lock held: once it is released, SendMessages may see pending == 0 and
  // destroy the batch (this callback holds only a raw pointer to it).
  std::lock_guard<std::mutex> lock(batch->mu);
  if (status != UCS_OK && batch->first_error == UCS_OK) batch->first_error = status;
  --batch->pending;
  batch->cv.notify_all();
}

Status UcxTransport::SendMessages(const std::string& peer, unsigned am_id, uint64_t id, std::string_view token,
                                  std::span<const Segment> segments, uint32_t finish_total,
                                  Clock::time_point deadline) {
  ICE_RETURN_IF_ERROR(CheckToken(token));
  auto batch = std::make_shared<SendBatch>();
  batch->headers.resize(am_id == kAmData ? segments.size() : 1);
  std::vector<WireHeader>& headers = batch->headers;
  Status post_status;
  Post([&, batch] {
    StatusOr<ucp_ep_h> ep = Endpoint(peer);
    std::lock_guard<std::mutex> lock(batch->mu);
    if (!ep.ok()) {
      post_status = ep.status();
    } else {
      batch->ep = *ep;
      for (size_t i = 0; i < headers.size(); ++i) {
        headers[i] = WireHeader{id, am_id == kAmData ? segments[i].index : finish_total, 0, {}};
        std::memcpy(headers[i].token, token.data(), kTransferTokenBytes);
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb.send = &UcxTransport::OnSendDone;
        p.user_data = batch.get();
        const void* buf = am_id == kAmData ? segments[i].data : nullptr;
        size_t len = am_id == kAmData ? segments[i].bytes : 0;
        void* req = ucp_am_send_nbx(*ep, am_id, &headers[i], sizeof(WireHeader), buf, len, &p);
        if (UCS_PTR_IS_ERR(req)) {
          if (batch->first_error == UCS_OK) batch->first_error = UCS_PTR_STATUS(req);
          break;
        }
        if (req != nullptr) ++batch->pending;
      }
    }
    batch->issued = true;
    batch->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(batch->mu);
  bool ok = batch->cv.wait_until(lock, deadline, [&] { return batch->issued && batch->pending == 0; });
  if (!ok) {
    // Force-closing the endpoint completes its outstanding sends with errors, after which the
    // segments' memory is no longer referenced.
    lock.unlock();
    Post([this, batch] {
      ucp_ep_h ep = nullptr;
      {
        std::lock_guard<std::mutex> l(batch->mu);
        if (batch->pending > 0) ep = batch->ep;
      }
      if (ep) DropEndpoint(ep, /*force=*/true);
    });
    lock.lock();
    if (!batch->cv.wait_for(lock, kForceCloseGrace, [&] { return batch->issued && batch->pending == 0; })) {
      // Bounded: the sender (a prefill worker's ship thread) must not hang on a dead peer. The
      // batch stays alive for late completions; UCX may still read the segments' memory, which
      // is the sender's page pool (mapped for the process's life), to send it to a dead peer.
      ICE_LOG(WARNING) << "transfer " << id << ": " << batch->pending
                       << " sends still outstanding after force-closing the endpoint; giving up on them";
      lock.unlock();
      std::lock_guard<std::mutex> l(mu_);
      abandoned_.push_back(batch);
    }
    return DeadlineExceededError("sending transfer " + std::to_string(id) + " did not finish by the deadline");
  }
  if (!post_status.ok()) return post_status;
  if (batch->first_error != UCS_OK) {
    ucs_status_t e = batch->first_error;
    if (e == UCS_ERR_CANCELED || e == UCS_ERR_REJECTED || e == UCS_ERR_INVALID_PARAM) {
      return FailedPreconditionError("receiver refused transfer " + std::to_string(id) + ": " + UcsError(e));
    }
    return UnavailableError("sending transfer " + std::to_string(id) + " failed: " + UcsError(e));
  }
  if (am_id == kAmData) {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& s : segments) stats_.bytes_sent += s.bytes;
    stats_.segments_sent += segments.size();
  }
  return Status::Ok();
}

Status UcxTransport::Send(const std::string& peer, uint64_t id, std::string_view token,
                          std::span<const Segment> segments, Clock::time_point deadline) {
  if (segments.empty()) return CheckToken(token);
  return SendMessages(peer, kAmData, id, token, segments, 0, deadline);
}

Status UcxTransport::Finish(const std::string& peer, uint64_t id, std::string_view token, uint32_t total_segments,
                            Clock::time_point deadline) {
  return SendMessages(peer, kAmFinish, id, token, {}, total_segments, deadline);
}

TransportStats UcxTransport::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace

StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxOptions& options) {
  return UcxTransport::Create(options);
}

}  // namespace icecache::transport
