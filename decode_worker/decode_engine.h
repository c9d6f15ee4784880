// The decode engine: admits sequences (Reserve), receives their prefilled KV over a Transport
// straight into the host page pool, and decodes all active sequences together (continuous
// batching: one forward pass per step over every running sequence, sequences joining and leaving
// between steps) with the IceCache attention backend. Tokens go to a per-sequence TokenStream.
//
// Life of a sequence: Reserve -> (prefill worker ships KV: transfer id = sequence id) ->
// Start (waits for the KV, imports it, joins the batch) -> tokens ... -> finished, cancelled or
// failed; its pages are freed at that moment, or, with a prefix cache (options.prefix_cache and a
// Reserve that gave the sequence's tokens), a sequence that finished or was cancelled is kept as
// a retained prefix (decode_worker/prefix_cache.h: its pages, trees and tokens).
//
// KV reuse: a Reserve whose tokens start with a retained prefix of at least one page, leaving at
// most `local_max_tokens` uncached, reuses it (Admission::cached_tokens > 0) and needs no prefill
// worker: Start takes the retained sequence (or copies the shared prefix, the copy-on-write rule
// of prefix_cache.h) and the engine feeds the uncached tokens through decode steps, one per step
// and with full attention (so they attend exactly over the prefix while their keys join the
// trees by insertion), then samples output token 1 from the last one's logits. At least the last
// token is always computed: a request whose tokens are all cached reuses all but the last. Release() drops a reservation that will not be
// started; reservations not started within reservation_timeout_seconds are dropped too. A Start()
// whose parameters are refused frees the reservation at once.
//
// Page accounting: each reservation commits an estimate of the pages the sequence can need
// (prompt + max_tokens in every (layer, kv head), plus tree slack); retained prefixes hold pages
// outside any commitment, and admission evicts them (least recently used first, never one a
// reservation holds) before it fails with RESOURCE_EXHAUSTED because the estimate does not fit
// the uncommitted pages.
//
// Isolation: an error of one sequence (bad input token, no context left, a failure in its KV
// backend) ends that sequence's stream alone; the rest of the batch keeps decoding.
//
// Threads: the engine thread runs forward passes only; it never waits on the transport. A reaper
// thread expires reservations; Start() waits for KV on the caller's thread.
//
// Tensor parallelism (docs/parallel.md): over a model::TpGroup the engine runs one
// IceCacheBackend per rank, each of the rank's kv heads, all in the one host page pool. A shipped
// sequence arrives whole (every kv head, one transfer, whatever the prefill worker's TP size) and
// is split by head at import (kvstore::SequenceCache::SplitByHead: pages and trees move to the
// rank that owns the heads, nothing is copied), so each rank selects, reads and attends over its
// own heads' pages with no communication beyond the model's all-reduces. With more ranks than kv
// heads (a group size that is a multiple of num_kv_heads) the heads are replicated: each rank
// gets its own copy of its one kv head (SplitByHead clones the pages), and the admission
// estimate counts every copy.
//
// Thread safety: all public methods may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "decode_worker/icecache_backend.h"
#include "decode_worker/prefix_cache.h"
#include "kvstore/page_pool.h"
#include "model/generator.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/tensor_parallel.h"
#include "transport/transport.h"

namespace icecache::decode {

struct DecodeEngineOptions {
  int page_size = kernels::kDefaultPageSize;
  int64_t pool_pages = kvstore::kDefaultDecodePoolPages;
  int max_sequences = 64;
  double reservation_timeout_seconds = 120;
  int threads = 0;  // OpenMP threads of the forward pass (0 = OpenMP's default)
  kernels::DType kv_dtype = kernels::DType::kBF16;  // page pool element type; must match the prefill side's
  int device_cache_pages = 0;  // device page cache (IceCacheBackendOptions), per rank; 0 = none (CPU only)
  // Merge the estimate of the tree leaves a step leaves out (kvstore::RetrievalPolicy::estimate_rest).
  bool rest_estimate = kvstore::RetrievalPolicy{}.estimate_rest;
  int rest_cells = kvstore::RetrievalPolicy{}.rest_cells;  // its resolution (RetrievalPolicy::rest_cells)
  // Keep finished sequences as retained prefixes for KV reuse (decode.prefix_cache). With more
  // than one tensor-parallel rank nothing is retained (not supported yet).
  bool prefix_cache = true;
  // Called on the engine thread after each decode step with every rank's seconds in it: its
  // whole Forward and its collectives (only with a TpGroup of more than one rank).
  std::function<void(const model::RankStepTimes&)> rank_times_observer;
};

// What Reserve hands out: the sequence id (random, never 0) and its secret token (16 random
// bytes). Start, Release and the KV transfer must present the token.
struct Admission {
  uint64_t id = 0;
  std::string token;
  // > 0: the sequence reuses a retained prefix of this many tokens; no KV is shipped to it, and
  // Start needs DecodeParams::first_token = -1 (the engine computes the rest and samples it).
  int64_t cached_tokens = 0;
};

// What a reservation tells the prefix cache: the sequence's tokens (the prompt: every token whose
// KV the prefill would compute), the isolation salt (requests of different salts never share),
// and how many uncached tokens the decode worker may compute itself (more: no reuse, the prefill
// worker computes the prompt). Empty tokens: the sequence is neither reused nor retained.
struct PrefixRequest {
  std::vector<int32_t> tokens;
  std::string salt;
  int local_max_tokens = 0;
};

struct DecodeParams {
  int32_t first_token = -1;        // from prefill; output token 1 (-1 with a reused prefix: sampled here)
  model::SamplingParams sampling;  // temperature/top_k/top_p/seed, max_tokens, stop_ids, ignore_eos
  // Random draws the sampler skips before its first (Sampler::SkipDraws): for a sequence migrated
  // here, the tokens sampled on the decode workers before. >= 0.
  int64_t sampler_draws_done = 0;
  // A migrated sequence's tokens generated before first_token (DecodeRequest.prior_tokens): part
  // of the penalties' context, not of max_tokens.
  std::vector<int32_t> prior_tokens;
};

// One update of a sequence's stream. The last one has done == true.
struct DecodeUpdate {
  std::vector<int32_t> tokens;
  std::vector<model::TokenLogprobs> logprobs;  // one per token when sampling.logprobs >= 0
  bool done = false;
  model::FinishReason finish = model::FinishReason::kNone;
  Status status;  // non-OK when the sequence failed or was cancelled (done == true)
  int64_t pages_fetched = 0;       // last update only
  double retrieval_seconds = 0.0;  // last update only
};

// Tokens of one sequence, produced by the engine thread, consumed by one reader.
class TokenStream {
 public:
  // Waits up to `timeout` for the next update. Returns false on timeout. Updates pending at the
  // same time are coalesced (tokens concatenated).
  bool Next(DecodeUpdate* out, std::chrono::milliseconds timeout);
  void Push(DecodeUpdate update);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DecodeUpdate> updates_;
};

struct DecodeEngineStats {
  int64_t total_pages = 0;
  int64_t used_pages = 0;       // pages holding KV of sequences now (retained prefixes not counted)
  int64_t committed_pages = 0;  // admission estimates of live sequences
  int64_t page_bytes = 0;
  int active_sequences = 0;     // reserved, receiving or decoding
  int decoding_sequences = 0;
  int64_t reservations = 0;          // cumulative: Reserve calls that admitted a sequence
  int64_t tokens_generated = 0;      // cumulative
  int64_t pages_fetched = 0;         // cumulative, sparse layers
  double retrieval_seconds = 0.0;    // cumulative
  DevicePageCacheStats device_cache;  // cumulative counters; slots/bytes of the cache
  // The prefix cache: retained entries and their pages (not in used_pages), evictions,
  // and cumulative lookups (reservations that gave tokens), hits (reused a prefix), reused tokens
  // and tokens computed here for reused prefixes.
  int64_t retained_pages = 0;
  int64_t retained_entries = 0;
  int64_t prefix_evictions = 0;
  int64_t prefix_lookups = 0;
  int64_t prefix_hits = 0;
  int64_t prefix_reused_tokens = 0;
  int64_t prefix_computed_tokens = 0;
  int64_t device_weight_bytes = 0;    // the model's weights in device memory
};

class DecodeEngine {
 public:
  // `model` and `transport` are not owned and must outlive the engine. The page pool is created
  // here (options.kv_dtype pages of options.page_size tokens).
  static StatusOr<std::unique_ptr<DecodeEngine>> Create(model::Model* model, transport::Transport* transport,
                                                        const DecodeEngineOptions& options);
  // The same over the ranks of a tensor-parallel group (not owned, must outlive the engine).
  // INVALID_ARGUMENT when the group's size neither divides num_kv_heads nor is a multiple of it.
  static StatusOr<std::unique_ptr<DecodeEngine>> Create(model::TpGroup* group, transport::Transport* transport,
                                                        const DecodeEngineOptions& options);
  ~DecodeEngine();

  // Admits a sequence. budget_pages: 0 = full attention, else the sparse page budget.
  // RESOURCE_EXHAUSTED (pool, or max_sequences sequences reserved, receiving or decoding),
  // INVALID_ARGUMENT (bad sizes).
  // Expiry (a reservation never Start()ed is dropped): reservation_timeout_seconds after its
  // prefill started (the prefill worker's start notice, transport/kv_shipping.h), so time spent
  // in a prefill queue does not count; before the notice, after prefill_wait_seconds from now
  // (<= 0: reservation_timeout_seconds from now).
  // `prefix` (optional): the KV reuse above.
  StatusOr<Admission> Reserve(int prompt_tokens, int max_tokens, int budget_pages, double prefill_wait_seconds = 0,
                              const PrefixRequest* prefix = nullptr);
  // The admission estimate Reserve commits for such a sequence; more than pool().capacity_pages()
  // means it can never be admitted here.
  int64_t PagesNeeded(int prompt_tokens, int max_tokens, int budget_pages) const;
  // Waits until the KV of sequence `id` has arrived (or kv_deadline), imports it and starts
  // decoding. NOT_FOUND (unknown id), FAILED_PRECONDITION (already started), INVALID_ARGUMENT
  // (params: sampling out of range, first_token outside the vocabulary, max_tokens above the
  // reservation's), transfer errors (DEADLINE_EXCEEDED, CANCELLED, ...), DATA_LOSS (bad wire
  // form). On every error but NOT_FOUND and FAILED_PRECONDITION the reservation is freed before
  // this returns.
  // PERMISSION_DENIED (wrong token) changes nothing.
  StatusOr<std::shared_ptr<TokenStream>> Start(uint64_t id, std::string_view token, const DecodeParams& params,
                                               transport::Clock::time_point kv_deadline);
  // Cancels a live sequence (reserved, receiving or decoding) for a caller that presents its
  // token: NOT_FOUND when `id` is not live, PERMISSION_DENIED (and nothing changes) for a wrong
  // token.
  Status Release(uint64_t id, std::string_view token);
  // Cancels a sequence in any state without a token: for the owner of a started stream (the
  // Decode call that presented the token). Its stream (if started) ends with CANCELLED.
  void Cancel(uint64_t id);

  // True once a failure inside a step aborted the tensor-parallel group (TpGroup::usable): the
  // step's sequences failed, Reserve answers UNAVAILABLE and the worker must be restarted (its
  // health turns NOT_SERVING). Never true with one Model.
  bool broken() const { return broken_.load(); }

  // Draining: from now on Reserve answers UNAVAILABLE; live sequences carry on.
  void StopAdmitting();
  // End of a drain's grace period: every live sequence (reserved, receiving, joining or decoding)
  // ends now, its stream with `status` (the caller passes UNAVAILABLE, so routers migrate the
  // requests), and its pages are freed. Returns at once; the engine thread finishes the streams.
  void FailAll(const Status& status);
  // When the engine loop last came round (it does at least every 200 ms when idle, and once per
  // decode step when busy).
  transport::Clock::time_point last_heartbeat() const;

  DecodeEngineStats stats() const;
  const kvstore::PagePool& pool() const { return *pool_; }
  const std::string& transport_address() const { return transport_->address(); }

 private:
  struct Reservation;
  struct Running;
  DecodeEngine(model::LanguageModel* lm, model::Model* model, model::TpGroup* group, const model::AttentionShape& shape,
               transport::Transport* transport, const DecodeEngineOptions& options);
  static StatusOr<std::unique_ptr<DecodeEngine>> Init(std::unique_ptr<DecodeEngine> e);
  // The rank backends as one sequence store: Import splits a whole-model cache by head.
  Status Import(uint64_t id, std::unique_ptr<kvstore::SequenceCache> cache, int budget_pages);
  StatusOr<SequenceKvStats> SeqStats(uint64_t id) const;
  Status SeqError(uint64_t id) const;
  DevicePageCacheStats CacheStats() const;
  void Loop();
  void Step();
  void Finish(Running& r, model::FinishReason reason, const Status& status);
  void Drop(uint64_t id);  // removes a reservation after its transfer ended; frees its pages
  // Cancels the transfer of a reservation this thread has claimed (started = true), waits for it
  // to end and drops it.
  void DropClaimed(uint64_t id);
  Status CheckParams(const Reservation& r, const DecodeParams& params) const;  // REQUIRES: mu_ held
  // Keeps a sequence that ended as a retained prefix when it can (engine thread, before Finish
  // frees it); returns whether it did.
  bool Retain(Running& r);
  // The cache of a reused prefix for reservation `r` (taken or copied); unpins the entry.
  StatusOr<std::unique_ptr<kvstore::SequenceCache>> ReusedCache(Reservation& r);
  // Per-sequence preconditions of the next forward pass (input token, context room).
  Status CheckStepInput(const Running& r) const;
  void ExpireReservations();
  void ReaperLoop();  // expires reservations once a second, off the engine thread

  model::LanguageModel* const lm_;     // the model or the group
  model::Model* const model_;          // null with a TpGroup
  model::TpGroup* const group_;        // null with one Model
  const model::AttentionShape shape_;  // the whole model's (all heads)
  transport::Transport* const transport_;
  const DecodeEngineOptions options_;
  std::unique_ptr<kvstore::PagePool> pool_;
  kernels::PinnedHostRegion pool_pinned_;     // the pool page-locked for the device's copies
  // Engine thread only: the backend Forward runs on (an IceCacheBackend, or a TpKvCache over one
  // per rank) and the rank backends inside it.
  std::unique_ptr<model::AttentionBackend> backend_;
  std::vector<IceCacheBackend*> ranks_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::shared_ptr<Reservation>> reserved_;  // guarded by mu_
  std::map<uint64_t, std::string> tokens_;  // guarded by mu_: every live sequence's token
  std::deque<std::unique_ptr<Running>> joining_;               // guarded by mu_
  std::vector<uint64_t> cancel_requests_;                      // guarded by mu_
  std::optional<Status> fail_all_;                             // guarded by mu_ (FailAll)
  int64_t committed_pages_ = 0;                                // guarded by mu_
  std::unique_ptr<PrefixCache> prefixes_;                      // guarded by mu_
  int64_t prefix_lookups_ = 0, prefix_hits_ = 0;               // guarded by mu_
  int64_t prefix_reused_tokens_ = 0, prefix_computed_tokens_ = 0;  // guarded by mu_
  int decoding_ = 0;                                           // guarded by mu_
  int64_t reservations_ = 0;                                   // guarded by mu_
  int64_t tokens_generated_ = 0;                               // guarded by mu_
  int64_t pages_fetched_ = 0;                                  // guarded by mu_
  double retrieval_seconds_ = 0;                               // guarded by mu_
  DevicePageCacheStats device_cache_stats_;                    // guarded by mu_ (copied after each step)
  bool stop_ = false;                                          // guarded by mu_
  bool draining_ = false;                                      // guarded by mu_
  std::atomic<int64_t> heartbeat_ns_{0};  // steady clock of the loop's last iteration
  std::atomic<bool> broken_{false};       // the TpGroup was aborted (set by the engine thread)

  std::map<uint64_t, std::unique_ptr<Running>> running_;  // engine thread only
  std::thread thread_;
  std::condition_variable reaper_cv_;  // wakes the reaper at shutdown (with mu_)
  std::thread reaper_;  // never blocks the engine thread on transport waits
};

}  // namespace icecache::decode
