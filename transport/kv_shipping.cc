#include "transport/kv_shipping.h"

#include <algorithm>
#include <cstring>

namespace icecache::transport {
namespace {

constexpr uint32_t kMagic = 0x564b4349;  // "ICKV"
constexpr uint32_t kVersion = 2;  // 2: the reservation token

struct KvShipHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t dtype;  // kernels::DType
  uint32_t reserved;
  uint64_t page_bytes;
  uint64_t num_pages;
  uint8_t token[kKvTokenBytes];
};
static_assert(sizeof(KvShipHeader) == 48);

bool TokenMatches(const KvShipHeader& h, const std::string& token) {
  if (token.size() != kKvTokenBytes) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < kKvTokenBytes; ++i) diff |= static_cast<uint8_t>(h.token[i] ^ static_cast<uint8_t>(token[i]));
  return diff == 0;
}

std::string DTypeLabel(uint32_t d) {
  return d <= 2 ? std::string(kernels::DTypeName(static_cast<kernels::DType>(d))) : "dtype " + std::to_string(d);
}

}  // namespace

uint32_t KvProtocolVersion() { return kTransportWireVersion * 10000 + kVersion * 100 + kvstore::kKvWireVersion; }

StatusOr<KvShipStats> ShipSequence(Transport& transport, const std::string& peer, uint64_t id,
                                   std::string_view token, const kvstore::SequenceWire& wire,
                                   const kvstore::PagePool& pool, size_t max_segment_bytes,
                                   Clock::time_point deadline, bool notice_sent) {
  if (token.size() != kKvTokenBytes) {
    return InvalidArgumentError("reservation token has " + std::to_string(token.size()) + " bytes, expected " +
                                std::to_string(kKvTokenBytes));
  }
  const size_t page_bytes = pool.page_bytes();
  KvShipHeader h{kMagic, kVersion, static_cast<uint32_t>(pool.dtype()), 0, page_bytes, wire.pages.size(), {}};
  std::memcpy(h.token, token.data(), kKvTokenBytes);
  std::vector<uint8_t> first(sizeof(h) + wire.metadata.size());
  std::memcpy(first.data(), &h, sizeof(h));
  if (!wire.metadata.empty()) std::memcpy(first.data() + sizeof(h), wire.metadata.data(), wire.metadata.size());

  const size_t max_run = std::max<size_t>(1, max_segment_bytes / page_bytes);
  std::vector<Segment> segments;
  segments.push_back({0, first.data(), first.size()});
  for (size_t s = 0; s < wire.pages.size();) {
    size_t k = 1;
    while (s + k < wire.pages.size() && k < max_run && wire.pages[s + k] == wire.pages[s] + static_cast<int32_t>(k)) {
      ++k;
    }
    segments.push_back({static_cast<uint32_t>(1 + s), pool.PageK(wire.pages[s]), k * page_bytes});
    s += k;
  }
  ICE_RETURN_IF_ERROR(transport.Send(peer, id, token, segments, deadline));
  ICE_RETURN_IF_ERROR(transport.Finish(peer, id, token,
                                       static_cast<uint32_t>(segments.size() + (notice_sent ? 1 : 0)), deadline));
  KvShipStats st;
  st.segments = static_cast<int64_t>(segments.size());
  st.pages = static_cast<int64_t>(wire.pages.size());
  st.bytes = static_cast<int64_t>(first.size() + wire.pages.size() * page_bytes);
  return st;
}

Status SendPrefillStarted(Transport& transport, const std::string& peer, uint64_t id, std::string_view token,
                          Clock::time_point deadline) {
  static const uint8_t kByte = 1;
  const Segment notice{kPrefillStartedSegment, &kByte, 1};
  return transport.Send(peer, id, token, std::span<const Segment>(&notice, 1), deadline);
}

ScatterSink KvReceiver::Sink() {
  return [this](uint32_t index, size_t bytes) { return Receive(index, bytes); };
}

StatusOr<std::vector<Destination>> KvReceiver::Receive(uint32_t index, size_t bytes) {
  const size_t page_bytes = pool_->page_bytes();
  if (index == kPrefillStartedSegment) {
    if (bytes != 1 || prefill_started_ns() != 0) return InvalidArgumentError("bad or repeated prefill start notice");
    prefill_started_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    return std::vector<Destination>{{&notice_, 1}};
  }
  if (index == 0) {
    if (!metadata_.empty()) return InvalidArgumentError("sequence metadata sent twice");
    if (bytes < sizeof(KvShipHeader)) {
      return InvalidArgumentError("sequence metadata of " + std::to_string(bytes) + " bytes has no header");
    }
    if (bytes > (64u << 20)) return InvalidArgumentError("sequence metadata larger than 64 MiB");
    metadata_.resize(bytes);
    // The header is checked once it has landed (Import); the sink cannot see the bytes before.
    return std::vector<Destination>{{metadata_.data(), bytes}};
  }
  if (bytes == 0 || bytes % page_bytes != 0) {
    return FailedPreconditionError("a run of " + std::to_string(bytes) + " bytes is not a whole number of this pool's " +
                                   std::to_string(page_bytes) + "-byte pages (" +
                                   std::string(kernels::DTypeName(pool_->dtype())) +
                                   "): kv_dtype/page_size differ between the prefill and decode workers");
  }
  const size_t first = index - 1;
  const size_t count = bytes / page_bytes;
  if (first + count > static_cast<size_t>(pool_->capacity_pages())) {
    return InvalidArgumentError("pages " + std::to_string(first) + ".." + std::to_string(first + count) +
                                " exceed the pool's capacity");
  }
  if (pages_.size() < first + count) pages_.resize(first + count, -1);
  for (size_t s = first; s < first + count; ++s) {
    if (pages_[s] != -1) return InvalidArgumentError("page " + std::to_string(s) + " sent twice");
  }
  std::vector<int32_t> got;
  ICE_RETURN_IF_ERROR(pool_->AllocateMany(static_cast<int64_t>(count), &got));
  // Ascending ids make adjacent pages (one receive) likely even after the free list was shuffled.
  std::sort(got.begin(), got.end());
  std::vector<Destination> dest;
  dest.reserve(count);
  for (size_t j = 0; j < count; ++j) {
    pages_[first + j] = got[j];
    dest.push_back({pool_->PageK(got[j]), page_bytes});
  }
  return dest;
}

StatusOr<std::unique_ptr<kvstore::SequenceCache>> KvReceiver::Import() {
  if (metadata_.size() < sizeof(KvShipHeader)) return DataLossError("the sequence metadata did not arrive");
  KvShipHeader h;
  std::memcpy(&h, metadata_.data(), sizeof(h));
  if (h.magic != kMagic || h.version != kVersion) {
    return DataLossError("shipped KV has an unknown header (magic " + std::to_string(h.magic) + ", version " +
                         std::to_string(h.version) + ")");
  }
  if (!TokenMatches(h, token_)) {
    return Status(StatusCode::kPermissionDenied, "shipped KV does not carry this reservation's token");
  }
  if (h.page_bytes != pool_->page_bytes() || h.dtype != static_cast<uint32_t>(pool_->dtype())) {
    return FailedPreconditionError("shipped KV pages are " + std::to_string(h.page_bytes) + " bytes of " +
                                   DTypeLabel(h.dtype) + ", this pool holds " + std::to_string(pool_->page_bytes()) +
                                   "-byte pages of " + std::string(kernels::DTypeName(pool_->dtype())) +
                                   ": kv_dtype/page_size differ between the prefill and decode workers");
  }
  if (pages_.size() != h.num_pages) {
    return DataLossError(std::to_string(pages_.size()) + " pages arrived, " + std::to_string(h.num_pages) + " were sent");
  }
  for (int32_t p : pages_) {
    if (p < 0) return DataLossError("a shipped page is missing");
  }
  ICE_ASSIGN_OR_RETURN(auto cache, kvstore::SequenceCache::Deserialize(metadata_.data() + sizeof(h),
                                                                       metadata_.size() - sizeof(h), pages_.data(),
                                                                       pages_.size(), pool_));
  pages_.clear();
  return cache;
}

void KvReceiver::Release() {
  for (int32_t p : pages_) {
    if (p >= 0) pool_->Free(p).IgnoreError();
  }
  pages_.clear();
}

}  // namespace icecache::transport
