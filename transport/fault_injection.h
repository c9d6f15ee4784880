// A Transport that forwards to another one and injects faults, for tests of what the engines do
// when shipping fails (the LevelDB fault-injection Env idea applied to the page transport).
// Header-only; the wrapped transport is not owned and must outlive this.
//
// Thread safety: as Transport; set_plan may be called at any time (later calls see the new plan).
#pragma once

#include <chrono>
#include <algorithm>
#include <map>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "transport/transport.h"

namespace icecache::transport {

struct FaultPlan {
  Status fail_send;    // non-OK: Send returns this without sending anything
  Status fail_finish;  // non-OK: Finish returns this without announcing the end
  Status fail_wait;    // non-OK: Wait cancels the inner transfer, waits for it, then returns this
  std::chrono::milliseconds send_delay{0};  // slept before every Send (a slow or stuck peer)
  // >= 0: a sender stuck mid-transfer. Of each transfer, only the first `stall_after_segments`
  // segments handed to Send are forwarded; the Send that reaches the limit forwards the segments
  // before it, logs "fault injection: transfer ID stalls after N segments" (WARNING), sleeps
  // `stall_for` and returns UNAVAILABLE; later Sends and the Finish of that transfer do the same
  // without forwarding anything. (A test kill -9s a process while it stalls.)
  int64_t stall_after_segments = -1;
  std::chrono::milliseconds stall_for{0};
};

class FaultInjectionTransport final : public Transport {
 public:
  explicit FaultInjectionTransport(Transport* inner) : inner_(inner) {}

  void set_plan(const FaultPlan& plan) {
    std::lock_guard<std::mutex> lock(mu_);
    plan_ = plan;
  }

  const std::string& address() const override { return inner_->address(); }
  Status Expect(uint64_t id, std::string_view token, SegmentSink sink) override {
    return inner_->Expect(id, token, std::move(sink));
  }
  Status ExpectScatter(uint64_t id, std::string_view token, ScatterSink sink) override {
    return inner_->ExpectScatter(id, token, std::move(sink));
  }
  Status Wait(uint64_t id, Clock::time_point deadline) override {
    const FaultPlan p = plan();
    if (p.fail_wait.ok()) return inner_->Wait(id, deadline);
    inner_->Cancel(id);
    inner_->Wait(id, deadline).IgnoreError();  // the inner transfer is forgotten, no write pending
    return p.fail_wait;
  }
  void Cancel(uint64_t id) override { inner_->Cancel(id); }
  Status Send(const std::string& peer, uint64_t id, std::string_view token, std::span<const Segment> segments,
              Clock::time_point deadline) override {
    const FaultPlan p = plan();
    if (p.send_delay.count() > 0) std::this_thread::sleep_for(p.send_delay);
    if (!p.fail_send.ok()) return p.fail_send;
    if (p.stall_after_segments < 0) return inner_->Send(peer, id, token, segments, deadline);
    size_t forward = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t& sent = forwarded_[id];
      forward = static_cast<size_t>(std::clamp<int64_t>(p.stall_after_segments - sent, 0,
                                                        static_cast<int64_t>(segments.size())));
      sent += static_cast<int64_t>(forward);
    }
    if (forward > 0) ICE_RETURN_IF_ERROR(inner_->Send(peer, id, token, segments.first(forward), deadline));
    if (forward == segments.size()) return Status::Ok();
    return Stall(id, p);
  }
  Status Finish(const std::string& peer, uint64_t id, std::string_view token, uint32_t total_segments,
                Clock::time_point deadline) override {
    const FaultPlan p = plan();
    if (!p.fail_finish.ok()) return p.fail_finish;
    if (p.stall_after_segments >= 0) {
      bool stalled = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = forwarded_.find(id);
        stalled = it != forwarded_.end() && it->second >= p.stall_after_segments &&
                  static_cast<int64_t>(total_segments) > p.stall_after_segments;
      }
      if (stalled) return Stall(id, p);
    }
    return inner_->Finish(peer, id, token, total_segments, deadline);
  }
  TransportStats stats() const override { return inner_->stats(); }

 private:
  FaultPlan plan() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plan_;
  }
  static Status Stall(uint64_t id, const FaultPlan& p) {
    ICE_LOG(WARNING) << "fault injection: transfer " << id << " stalls after " << p.stall_after_segments
                     << " segments";
    std::this_thread::sleep_for(p.stall_for);
    return UnavailableError("fault injection: transfer " + std::to_string(id) + " stalled after " +
                            std::to_string(p.stall_after_segments) + " segments");
  }

  Transport* const inner_;
  mutable std::mutex mu_;
  FaultPlan plan_;  // guarded by mu_
  std::map<uint64_t, int64_t> forwarded_;  // guarded by mu_: segments forwarded per transfer (stall plans)
};

}  // namespace icecache::transport
