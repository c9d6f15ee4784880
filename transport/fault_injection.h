// A Transport that forwards to another one and injects faults, for tests of what the engines do
// when shipping fails (the LevelDB fault-injection Env idea applied to the page transport).
// Header-only; the wrapped transport is not owned and must outlive this.
//
// Thread safety: as Transport; set_plan may be called at any time (later calls see the new plan).
#pragma once

#include <chrono>
#include <mutex>
#include <thread>

#include "transport/transport.h"

namespace icecache::transport {

struct FaultPlan {
  Status fail_send;    // non-OK: Send returns this without sending anything
  Status fail_finish;  // non-OK: Finish returns this without announcing the end
  Status fail_wait;    // non-OK: Wait cancels the inner transfer, waits for it, then returns this
  std::chrono::milliseconds send_delay{0};  // slept before every Send (a slow or stuck peer)
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
    return inner_->Send(peer, id, token, segments, deadline);
  }
  Status Finish(const std::string& peer, uint64_t id, std::string_view token, uint32_t total_segments,
                Clock::time_point deadline) override {
    const FaultPlan p = plan();
    if (!p.fail_finish.ok()) return p.fail_finish;
    return inner_->Finish(peer, id, token, total_segments, deadline);
  }
  TransportStats stats() const override { return inner_->stats(); }

 private:
  FaultPlan plan() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plan_;
  }

  Transport* const inner_;
  mutable std::mutex mu_;
  FaultPlan plan_;  // guarded by mu_
};

}  // namespace icecache::transport
