// Shipping one prefilled sequence (kvstore::SequenceCache) from the prefill worker's page pool
// into the decode worker's page pool over a Transport: the wire protocol, its sender and its
// receiver, in one place.
//
// Wire protocol (transfer id = the decode worker's sequence id, transfer token = its reservation
// token: the transport drops every message that does not carry it, transport/transport.h):
//   segment 0      KvShipHeader (carrying the reservation's 16-byte token) followed by the
//                  SequenceCache metadata (SequenceWire::metadata);
//   segment 1 + s  a run of k >= 1 pages: wire pages s .. s+k-1 (SequenceWire::pages order),
//                  k * page_bytes bytes, the pages back to back.
//   Finish         the number of segments sent (1 + runs, + 1 with the start notice).
//   segment kPrefillStartedSegment (optional, first): one byte, sent when the prefill of the
//                  sequence starts (SendPrefillStarted); the receiver's reservation clock starts
//                  then (decode_worker/decode_engine.h).
// The sender makes a run of pages that are consecutive both in the wire order and in its pool
// (one contiguous source buffer), up to max_segment_bytes; the receiver allocates a run's pages
// in its own pool (sorted ascending, so that they are often adjacent) and receives the segment
// scattered over them.
//
// Pages travel in the pool's dtype; the header names it and the page size. A receiver whose pool
// has pages of another size refuses the transfer: at once when a run is not a whole number of its
// pages, else in Import (FAILED_PRECONDITION naming both sides' page size and dtype).
//
// Trust: the transport accepts a segment only with the reservation's token (checked per message
// before the sink runs), so a stranger's segments never reach the pool. On top, Import refuses
// (PERMISSION_DENIED) a header whose token is not the reservation's, and a transfer whose header
// never arrived (DATA_LOSS); the pages received stay with the receiver until Release.
#pragma once

#include <atomic>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kernels/dtype.h"
#include "kvstore/page_pool.h"
#include "kvstore/sequence_cache.h"
#include "transport/transport.h"

namespace icecache::transport {

struct KvShipStats {
  int64_t segments = 0;  // including the metadata segment
  int64_t pages = 0;
  int64_t bytes = 0;     // metadata + pages
};

// Sends `wire` (pages in `pool`) as transfer `id` to `peer` and Finish()es it. Runs are capped at
// max(max_segment_bytes, one page). Errors are the transport's (see Transport::Send).
// `token` is the reservation token (kKvTokenBytes bytes; INVALID_ARGUMENT otherwise).
inline constexpr size_t kKvTokenBytes = kTransferTokenBytes;
// `notice_sent`: SendPrefillStarted was sent for this transfer (Finish then counts it).
StatusOr<KvShipStats> ShipSequence(Transport& transport, const std::string& peer, uint64_t id,
                                   std::string_view token, const kvstore::SequenceWire& wire,
                                   const kvstore::PagePool& pool, size_t max_segment_bytes,
                                   Clock::time_point deadline, bool notice_sent = false);

// The version of everything one KV transfer puts on the wire between a prefill and a decode
// worker: the transport's message header (kTransportWireVersion), this ship protocol and the
// sequence's wire form (kvstore::kKvWireVersion), as one number. Two workers of different
// versions cannot exchange KV (the receiver would drop or refuse every message, and the request
// would fail only at the KV timeout), so the decode worker states its version in
// ReserveResponse.kv_protocol_version and the prefill worker refuses a PrefillRequest naming
// another (FAILED_PRECONDITION, both versions named) before it computes anything.
uint32_t KvProtocolVersion();

// The start notice: tells the receiver of transfer `id` (with its `token`) that its prefill has
// started.
inline constexpr uint32_t kPrefillStartedSegment = 0xFFFFFFFFu;
Status SendPrefillStarted(Transport& transport, const std::string& peer, uint64_t id, std::string_view token,
                          Clock::time_point deadline);

// The receiving half of one transfer into `pool` (not owned, must outlive this).
// Thread safety: Sink()'s function runs on the transport's progress thread while the transfer is
// live; every other method must be called only after Transport::Wait for the transfer returned
// (then nothing runs the sink any more).
class KvReceiver {
 public:
  // `token`: what the sender's header must carry (pass the same one to ExpectScatter).
  KvReceiver(kvstore::PagePool* pool, std::string token) : pool_(pool), token_(std::move(token)) {}
  ~KvReceiver() { Release(); }
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  // The sink to pass to Transport::ExpectScatter. Refuses: a header of another protocol or page
  // size, runs that are not whole pages of this pool, pages sent twice, a full pool.
  ScatterSink Sink();

  // After a successful Wait: checks the header and that every page arrived, and rebuilds the
  // sequence. On success the cache owns the pages; on error they stay here (Release frees them).
  StatusOr<std::unique_ptr<kvstore::SequenceCache>> Import();

  // Frees the pages received and not imported.
  void Release();

  // When the start notice arrived (Clock's epoch count; 0 = not yet). Any thread, any time.
  int64_t prefill_started_ns() const { return prefill_started_ns_.load(std::memory_order_acquire); }

 private:
  StatusOr<std::vector<Destination>> Receive(uint32_t index, size_t bytes);

  kvstore::PagePool* const pool_;
  const std::string token_;
  std::vector<uint8_t> metadata_;  // segment 0: header + SequenceCache metadata
  std::vector<int32_t> pages_;     // pages_[s] = pool page holding wire page s, -1: not arrived
  uint8_t notice_ = 0;             // where the start notice's byte lands
  std::atomic<int64_t> prefill_started_ns_{0};
};

}  // namespace icecache::transport
