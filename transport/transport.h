// Moves byte segments (KV pages and their index metadata) from one process to another, straight
// into memory the receiver chose. Callers never see the underlying library (UCX); a Transport is
// made by a factory (CreateUcxTransport) and addressed by an opaque address string that peers
// exchange out of band (gRPC bytes fields).
//
// A transfer is identified by a 64-bit id chosen by the receiver and guarded by a secret token
// (kTransferTokenBytes bytes, e.g. the decode worker's reservation token) that the receiver hands
// to the one peer allowed to send it. The receiver Expect()s (id, token) with a SegmentSink that
// maps each arriving segment to its destination (or ExpectScatter()s it with a ScatterSink, which
// may split a segment over several destinations); the sender Send()s any number of segments
// (indices are the sender's labels, passed to the sink; any order, possibly in several calls) and
// then Finish()es with the number of segments it sent, every message carrying (id, token). Wait()
// returns once every segment has landed, or reports why not; after Wait() returns nothing more is
// written into the sink's memory, so the caller may free it. A transfer that stalls (no Finish, a
// segment missing) ends with DEADLINE_EXCEEDED at the caller's deadline.
//
// Sender check: a data segment or Finish whose token is not the transfer's (compared in constant
// time) is dropped before the sink sees it, counted in TransportStats::segments_refused and logged
// once per transfer; the transfer itself goes on (a stranger who knows an id can neither write
// into its memory nor fail or end it). A refused rendezvous segment fails the stranger's Send
// (FAILED_PRECONDITION); a refused small one is dropped silently.
//
// Thread safety: all methods may be called from any thread concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace icecache::transport {

using Clock = std::chrono::steady_clock;

// Largest transport address a peer may hand over (UCX worker addresses over tcp/sm are a few
// hundred bytes). Send/Finish refuse longer or malformed addresses with INVALID_ARGUMENT before
// the address reaches the transport library.
inline constexpr size_t kMaxTransportAddressBytes = 4096;

// Length of a transfer's token. Expect/ExpectScatter/Send/Finish refuse another length with
// INVALID_ARGUMENT.
inline constexpr size_t kTransferTokenBytes = 16;

// Version of the transport's own message format (the per-message header); bump it whenever that
// changes. 2: the 32-byte header with the transfer's token. Part of KvProtocolVersion
// (transport/kv_shipping.h), which workers compare before shipping.
inline constexpr uint32_t kTransportWireVersion = 2;

// Returns where segment `index` of `bytes` bytes is to be written (at least `bytes` writable), or
// an error, which fails the transfer (Wait returns it; the sender's Send sees an error too).
// Called on the transport's progress thread: it must be quick and must not call the Transport.
using SegmentSink = std::function<StatusOr<void*>(uint32_t index, size_t bytes)>;

// One piece of a segment's destination: `bytes` writable bytes at `data`.
struct Destination {
  void* data = nullptr;
  size_t bytes = 0;
};

// Returns where segment `index` of `bytes` bytes is to be written: pieces filled in order, whose
// sizes must add up to `bytes` (else the transfer fails with ABORTED). Pieces that are adjacent in
// memory are merged; a segment landing in one piece is received zero-copy, several pieces use
// UCX's scatter (iov) receive. Same calling rules as SegmentSink.
using ScatterSink = std::function<StatusOr<std::vector<Destination>>(uint32_t index, size_t bytes)>;

// One segment to send. `data` must stay valid and unchanged until Send() returns.
struct Segment {
  uint32_t index = 0;
  const void* data = nullptr;
  size_t bytes = 0;
};

struct TransportStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t segments_sent = 0;
  uint64_t segments_received = 0;
  uint64_t transfers_completed = 0;
  uint64_t transfers_failed = 0;  // received transfers that ended in an error (timeouts included)
  // Messages (data segments and Finish) for an expected transfer that carried another token:
  // dropped unread.
  uint64_t segments_refused = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // This endpoint's address (opaque bytes) for peers to send to.
  virtual const std::string& address() const = 0;

  // ---- Receiving ----
  // Registers transfer `id`, accepted only from senders presenting `token` (kTransferTokenBytes
  // bytes, else INVALID_ARGUMENT). ALREADY_EXISTS if it is registered.
  virtual Status Expect(uint64_t id, std::string_view token, SegmentSink sink) = 0;
  virtual Status ExpectScatter(uint64_t id, std::string_view token, ScatterSink sink) = 0;
  // Blocks until transfer `id` completes (OK) or fails: DEADLINE_EXCEEDED at `deadline`,
  // CANCELLED after Cancel(id), ABORTED when the sink refused a segment, DATA_LOSS when a segment
  // failed in flight, NOT_FOUND for an unknown id. In every case the transfer is forgotten and no
  // write into sink memory is pending when it returns.
  virtual Status Wait(uint64_t id, Clock::time_point deadline) = 0;
  // Makes a pending or future Wait(id) return CANCELLED. Unknown ids are ignored.
  virtual void Cancel(uint64_t id) = 0;

  // ---- Sending ----
  // Sends `segments` of transfer `id` with its `token` to `peer` and returns when the receiver
  // has them (or, for small segments, when they are buffered for it). UNAVAILABLE when the peer
  // cannot be reached or fails, FAILED_PRECONDITION when it refused (unknown or failed transfer,
  // another token), DEADLINE_EXCEEDED, INVALID_ARGUMENT (token length, address). On any error
  // nothing still references the segments' memory when it returns.
  virtual Status Send(const std::string& peer, uint64_t id, std::string_view token, std::span<const Segment> segments,
                      Clock::time_point deadline) = 0;
  // Tells the receiver that transfer `id` has `total_segments` segments in all (Wait completes once
  // that many have landed). Ignored by the receiver unless `token` is the transfer's.
  virtual Status Finish(const std::string& peer, uint64_t id, std::string_view token, uint32_t total_segments,
                        Clock::time_point deadline) = 0;

  virtual TransportStats stats() const = 0;
};

struct UcxOptions {
  std::string tls;          // UCX_TLS, e.g. "tcp,sm,self" or "tcp"; empty = UCX's default
  std::string net_devices;  // UCX_NET_DEVICES, e.g. "lo"; empty = UCX's default
  // Ask UCX to detect failed peers (endpoints in peer error-handling mode). UCX 1.13's shared
  // memory transports cannot, so with this on only tcp carries data; with it off a dead peer
  // shows up as a Send deadline instead of an immediate UNAVAILABLE.
  bool peer_failure_detection = false;
};

// Creates a UCX (ucp active messages) transport with its own worker and progress thread.
// Segments above UCX's rendezvous threshold are received zero-copy into sink memory; smaller
// ones are copied there from UCX's buffers.
StatusOr<std::unique_ptr<Transport>> CreateUcxTransport(const UcxOptions& options);

}  // namespace icecache::transport
