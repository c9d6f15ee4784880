#include "decode_worker/decode_engine.h"

#include <omp.h>

#include <algorithm>
#include <optional>

#include "common/logging.h"
#include "common/secure_random.h"
#include "kvstore/sequence_cache.h"
#include "model/finish_rules.h"
#include "model/tokenizer/tokenizer.h"
#include "transport/kv_shipping.h"

namespace icecache::decode {

using Clock = std::chrono::steady_clock;

bool TokenStream::Next(DecodeUpdate* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !updates_.empty(); })) return false;
  *out = std::move(updates_.front());
  updates_.pop_front();
  while (!out->done && !updates_.empty()) {
    DecodeUpdate& next = updates_.front();
    out->tokens.insert(out->tokens.end(), next.tokens.begin(), next.tokens.end());
    out->logprobs.insert(out->logprobs.end(), std::make_move_iterator(next.logprobs.begin()),
                         std::make_move_iterator(next.logprobs.end()));
    out->done = next.done;
    out->finish = next.finish;
    out->status = next.status;
    out->pages_fetched = next.pages_fetched;
    out->retrieval_seconds = next.retrieval_seconds;
    updates_.pop_front();
  }
  return true;
}

void TokenStream::Push(DecodeUpdate update) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_.push_back(std::move(update));
  }
  cv_.notify_all();
}

namespace {
DecodeUpdate ShutdownUpdate() {
  DecodeUpdate u;
  u.done = true;
  u.status = UnavailableError("decode worker shut down");
  return u;
}
}  // namespace

struct DecodeEngine::Reservation {
  uint64_t id = 0;
  std::string token;
  int prompt_tokens = 0;
  int max_tokens = 0;
  int64_t committed_pages = 0;
  int budget_pages = 0;
  Clock::time_point created;
  std::chrono::duration<double> prefill_wait{0};  // how long to wait for the prefill's start notice
  bool started = false;
  // Filled by the transport's sink on its progress thread; read after Wait() returns (null for a
  // reused prefix: nothing is shipped).
  std::unique_ptr<transport::KvReceiver> kv;
  // The prefix cache (PrefixRequest): the sequence's tokens and salt, and the retained entry it
  // reuses (pinned until Start takes or copies it, or the reservation is dropped).
  std::vector<int32_t> tokens;
  std::string salt;
  RetainedPrefix* reuse = nullptr;  // guarded by mu_
  int64_t reuse_tokens = 0;
};

struct DecodeEngine::Running {
  uint64_t id = 0;
  int64_t committed_pages = 0;
  std::unique_ptr<kvstore::SequenceCache> cache;  // moved into the backend when joining
  int budget_pages = 0;
  DecodeParams params;
  std::unique_ptr<model::Sampler> sampler;
  bool logprobs = false;  // sampling.logprobs >= 0: updates carry each token's logprobs
  std::optional<model::TokenStops> stops;  // the request's finish rules (model/finish_rules.h)
  std::vector<int32_t> generated;  // output tokens so far: prior_tokens, then first_token onwards
  size_t prior = 0;                // how many of them are prior_tokens (not counted by max_tokens)
  int32_t last = -1;               // next input token
  std::shared_ptr<TokenStream> stream;
  // The prefix cache: the tokens whose KV the sequence holds (empty: not retained when it ends),
  // its salt and whether it has trees; the uncached tokens of a reused prefix still to feed
  // (feed[fed] is the next input while fed < feed.size(); fed = feed.size() + 1 once output token 1
  // was sampled from the last one's logits).
  std::vector<int32_t> kv_tokens;
  std::string salt;
  bool indexed = false;
  std::vector<int32_t> feed;
  size_t fed = 0;
};

DecodeEngine::DecodeEngine(model::LanguageModel* lm, model::Model* model, model::TpGroup* group,
                           const model::AttentionShape& shape, transport::Transport* transport,
                           const DecodeEngineOptions& options)
    : lm_(lm), model_(model), group_(group), shape_(shape), transport_(transport), options_(options) {}

StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(model::Model* model, transport::Transport* transport,
                                                             const DecodeEngineOptions& options) {
  return Init(std::unique_ptr<DecodeEngine>(
      new DecodeEngine(model, model, nullptr, model->attention_shape(), transport, options)));
}

StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Create(model::TpGroup* group, transport::Transport* transport,
                                                             const DecodeEngineOptions& options) {
  const model::ModelConfig& c = group->config();
  if (c.num_kv_heads % group->size() != 0 && group->size() % c.num_kv_heads != 0) {
    return InvalidArgumentError("the decode worker splits kv heads across tensor-parallel ranks or replicates them: " +
                                std::to_string(c.num_kv_heads) + " kv heads neither divide into nor replicate onto " +
                                std::to_string(group->size()) + " ranks (use a tensor_parallel_size that divides " +
                                std::to_string(c.num_kv_heads) + " or is a multiple of it)");
  }
  model::AttentionShape shape = group->rank(0).attention_shape();
  shape.num_q_heads = c.num_heads;
  shape.num_kv_heads = c.num_kv_heads;
  return Init(std::unique_ptr<DecodeEngine>(new DecodeEngine(group, nullptr, group, shape, transport, options)));
}

StatusOr<std::unique_ptr<DecodeEngine>> DecodeEngine::Init(std::unique_ptr<DecodeEngine> e) {
  const DecodeEngineOptions& options = e->options_;
  kvstore::PagePoolOptions po;
  po.page_size = options.page_size;
  po.head_dim = e->shape_.head_dim;
  po.dtype = options.kv_dtype;
  po.num_pages = options.pool_pages;
  ICE_ASSIGN_OR_RETURN(e->pool_, kvstore::PagePool::Create(po));
  const kernels::Device device = e->lm_->device();
  ICE_ASSIGN_OR_RETURN(e->pool_pinned_, kernels::PinnedHostRegion::Register(device.backend, e->pool_->base(),
                                                                             e->pool_->capacity_bytes()));
  IceCacheBackendOptions bo;
  bo.device_cache_pages = options.device_cache_pages;
  if (e->group_ == nullptr) {
    bo.device = device;
    ICE_ASSIGN_OR_RETURN(std::unique_ptr<IceCacheBackend> b,
                         IceCacheBackend::Create(e->model_->attention_shape(), e->pool_.get(), bo));
    e->ranks_.push_back(b.get());
    e->backend_ = std::move(b);
  } else {
    std::vector<std::unique_ptr<model::AttentionBackend>> ranks;
    for (int r = 0; r < e->group_->size(); ++r) {
      const model::Model& m = e->group_->rank(r);
      bo.device = m.device();
      ICE_RETURN_IF_ERROR(kernels::UseDevice(bo.device));  // the rank's device buffers on its device
      auto b = IceCacheBackend::Create(m.attention_shape(), e->pool_.get(), bo);
      if (!b.ok()) {
        kernels::UseDevice(device).IgnoreError();
        return b.status().WithContext("rank " + std::to_string(r));
      }
      e->ranks_.push_back(b->get());
      ranks.push_back(std::move(*b));
    }
    ICE_RETURN_IF_ERROR(kernels::UseDevice(device));
    ICE_ASSIGN_OR_RETURN(e->backend_, e->group_->WrapBackends(std::move(ranks)));
  }
  e->prefixes_ = std::make_unique<PrefixCache>(options.page_size);
  e->device_cache_stats_ = e->CacheStats();
  e->heartbeat_ns_ = Clock::now().time_since_epoch().count();
  e->thread_ = std::thread([raw = e.get()] { raw->Loop(); });
  e->reaper_ = std::thread([raw = e.get()] { raw->ReaperLoop(); });
  return e;
}

DecodeEngine::~DecodeEngine() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& [id, r] : reserved_) ids.push_back(id);
  }
  cv_.notify_all();
  reaper_cv_.notify_all();
  thread_.join();
  reaper_.join();
  for (auto& [id, r] : running_) {
    backend_->RemoveSequence(id).IgnoreError();  // every rank's part
    r->stream->Push(ShutdownUpdate());
  }
  for (auto& r : joining_) {
    r->stream->Push(ShutdownUpdate());
  }
  running_.clear();
  joining_.clear();
  for (uint64_t id : ids) {
    transport_->Cancel(id);
    Drop(id);
  }
}

int64_t DecodeEngine::PagesNeeded(int prompt_tokens, int max_tokens, int budget_pages) const {
  const auto& shape = shape_;  // every kv head, whichever rank holds it
  const int64_t ps = options_.page_size;
  const int64_t tokens = static_cast<int64_t>(std::max(prompt_tokens, 0)) + std::max(max_tokens, 0);
  // Positional pages for every token, plus slack for partly filled tree leaves (about one extra
  // leaf per cell; cells are ~1-2% of tokens) and the window's partial page.
  int64_t per_head = (tokens + ps - 1) / ps + 2;
  if (budget_pages != 0) per_head += per_head / 4 + 2;
  // Replicated kv heads (more ranks than kv heads): every rank holds its own copy of its head.
  const int64_t copies = std::max<int64_t>(1, static_cast<int64_t>(ranks_.size()) / shape.num_kv_heads);
  return per_head * shape.num_layers * shape.num_kv_heads * copies;
}

StatusOr<Admission> DecodeEngine::Reserve(int prompt_tokens, int max_tokens, int budget_pages,
                                          double prefill_wait_seconds, const PrefixRequest* prefix) {
  if (prompt_tokens < 1 || max_tokens < 1) return InvalidArgumentError("prompt_tokens and max_tokens must be >= 1");
  const int64_t tokens = static_cast<int64_t>(prompt_tokens) + max_tokens;
  const int64_t need = PagesNeeded(prompt_tokens, max_tokens, budget_pages);
  ICE_ASSIGN_OR_RETURN(std::string token, SecureRandomToken(16));
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return UnavailableError("decode worker is shutting down");
  if (draining_) return UnavailableError("decode worker is draining (shutting down): not admitting sequences");
  if (broken_) {
    return UnavailableError("decode worker's tensor-parallel group failed inside a step and must be restarted");
  }
  if (static_cast<int>(reserved_.size()) + decoding_ >= options_.max_sequences) {
    return ResourceExhaustedError("decode worker is at its limit of " + std::to_string(options_.max_sequences) +
                                  " sequences");
  }
  // Retained prefixes give their pages back before anyone is refused.
  const int64_t retained = prefixes_->stats().pages;
  if (committed_pages_ + need + retained > pool_->capacity_pages()) {
    prefixes_->Evict(committed_pages_ + need + retained - pool_->capacity_pages());
  }
  if (committed_pages_ + need + prefixes_->stats().pages > pool_->capacity_pages()) {
    return ResourceExhaustedError("decode worker KV pool cannot hold " + std::to_string(tokens) + " tokens (" +
                                  std::to_string(need) + " pages needed, " +
                                  std::to_string(pool_->capacity_pages() - committed_pages_) + " uncommitted of " +
                                  std::to_string(pool_->capacity_pages()) + ")");
  }
  auto r = std::make_shared<Reservation>();
  do {
    ICE_ASSIGN_OR_RETURN(r->id, SecureRandomId());
  } while (tokens_.count(r->id) != 0);
  r->token = token;
  r->prompt_tokens = prompt_tokens;
  r->max_tokens = max_tokens;
  r->committed_pages = need;
  r->budget_pages = budget_pages;
  r->created = Clock::now();
  r->prefill_wait = std::chrono::duration<double>(
      prefill_wait_seconds > 0 ? prefill_wait_seconds : options_.reservation_timeout_seconds);
  if (prefix != nullptr && !prefix->tokens.empty() && options_.prefix_cache && ranks_.size() == 1 &&
      static_cast<int>(prefix->tokens.size()) == prompt_tokens) {
    r->tokens = prefix->tokens;
    r->salt = prefix->salt;
    ++prefix_lookups_;
    // At least the last token is computed here: its logits give output token 1.
    const std::span<const int32_t> lookup(prefix->tokens.data(), prefix->tokens.size() - 1);
    const PrefixMatch m = prefixes_->Find(r->salt, lookup, /*indexed=*/budget_pages != 0);
    const int64_t uncached = static_cast<int64_t>(prefix->tokens.size()) - m.tokens;
    if (m.entry != nullptr && m.tokens >= options_.page_size && uncached <= prefix->local_max_tokens) {
      prefixes_->Pin(m.entry);
      r->reuse = m.entry;
      r->reuse_tokens = m.tokens;
    }
  }
  if (r->reuse == nullptr) {
    // The sink runs on the transport's progress thread; `r` stays alive until Drop, which happens
    // only after the transfer has ended (Wait returned), so no lock is needed for its buffers.
    r->kv = std::make_unique<transport::KvReceiver>(pool_.get(), token);
    Status expect = transport_->ExpectScatter(r->id, token, r->kv->Sink());
    if (!expect.ok()) return expect;
  }
  committed_pages_ += need;
  ++reservations_;
  reserved_[r->id] = r;
  tokens_[r->id] = token;
  return Admission{r->id, std::move(token), r->reuse_tokens};
}

void DecodeEngine::Drop(uint64_t id) {
  std::shared_ptr<Reservation> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reserved_.find(id);
    if (it == reserved_.end()) return;
    r = it->second;
    reserved_.erase(it);
    tokens_.erase(id);
    committed_pages_ -= r->committed_pages;
    if (r->reuse != nullptr) prefixes_->Unpin(r->reuse);
    r->reuse = nullptr;
  }
  if (r->kv) r->kv->Release();
}

Status DecodeEngine::CheckParams(const Reservation& r, const DecodeParams& params) const {
  ICE_RETURN_IF_ERROR(model::ValidateSamplingParams(params.sampling));
  const int vocab = lm_->config().vocab_size;
  if (r.reuse != nullptr) {
    if (params.first_token != -1 || !params.prior_tokens.empty() || params.sampler_draws_done != 0) {
      return InvalidArgumentError("sequence " + std::to_string(r.id) +
                                  " reuses a retained prefix: its first token is computed here (first_token -1, "
                                  "no prior tokens)");
    }
  } else if (params.first_token < 0 || params.first_token >= vocab) {
    return InvalidArgumentError("first_token " + std::to_string(params.first_token) + " is outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
  }
  if (static_cast<int64_t>(params.prior_tokens.size()) > lm_->config().max_position) {
    return InvalidArgumentError(std::to_string(params.prior_tokens.size()) + " prior_tokens exceed the model's " +
                                std::to_string(lm_->config().max_position) + " positions");
  }
  for (size_t i = 0; i < params.prior_tokens.size(); ++i) {
    if (params.prior_tokens[i] < 0 || params.prior_tokens[i] >= vocab) {
      return InvalidArgumentError("prior_tokens[" + std::to_string(i) + "] = " + std::to_string(params.prior_tokens[i]) +
                                  " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (params.sampler_draws_done < 0) {
    return InvalidArgumentError("sampler_draws_done " + std::to_string(params.sampler_draws_done) + " is negative");
  }
  if (params.sampling.max_tokens > r.max_tokens) {
    return InvalidArgumentError("max_tokens " + std::to_string(params.sampling.max_tokens) + " exceeds the " +
                                std::to_string(r.max_tokens) + " reserved for sequence " + std::to_string(r.id));
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<TokenStream>> DecodeEngine::Start(uint64_t id, std::string_view token,
                                                           const DecodeParams& params,
                                                           transport::Clock::time_point kv_deadline) {
  std::shared_ptr<Reservation> r;
  Status bad_params;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reserved_.find(id);
    if (it == reserved_.end()) return NotFoundError("sequence " + std::to_string(id) + " is not reserved here");
    if (!ConstantTimeEqual(it->second->token, token)) {
      return Status(StatusCode::kPermissionDenied, "sequence " + std::to_string(id) + ": wrong reservation token");
    }
    if (it->second->started) return FailedPreconditionError("sequence " + std::to_string(id) + " already started");
    it->second->started = true;
    r = it->second;
    bad_params = CheckParams(*r, params);
  }
  if (!bad_params.ok()) {
    // The caller owns this reservation and cannot decode it: free it now, not at expiry.
    DropClaimed(id);
    return bad_params;
  }
  StatusOr<std::unique_ptr<kvstore::SequenceCache>> cache{std::unique_ptr<kvstore::SequenceCache>()};
  if (r->reuse != nullptr) {
    cache = ReusedCache(*r);
    if (!cache.ok()) {
      Drop(id);
      return cache.status().WithContext("reused prefix");
    }
  } else {
    Status arrived = transport_->Wait(id, kv_deadline);
    if (!arrived.ok()) {
      Drop(id);
      return arrived.WithContext("waiting for the prefilled KV cache");
    }
    cache = r->kv->Import();
    if (!cache.ok()) {
      Drop(id);
      return cache.status().WithContext("shipped KV cache");
    }
  }
  auto run = std::make_unique<Running>();
  if (!r->tokens.empty()) {
    run->kv_tokens = r->tokens;
    run->salt = r->salt;
    run->indexed = r->budget_pages != 0;
    if (r->reuse_tokens > 0) {
      run->kv_tokens.resize(static_cast<size_t>(r->reuse_tokens));
      run->feed.assign(r->tokens.begin() + r->reuse_tokens, r->tokens.end());
    }
  }
  run->id = id;
  run->cache = std::move(*cache);
  run->budget_pages = r->budget_pages;
  run->params = params;
  run->sampler = std::make_unique<model::Sampler>(params.sampling, lm_->device());
  if (params.sampler_draws_done > 0) run->sampler->SkipDraws(static_cast<uint64_t>(params.sampler_draws_done));
  run->logprobs = params.sampling.logprobs >= 0;
  std::vector<int32_t> eos = lm_->config().eos_ids;  // as the generator: config and tokenizer EOS
  if (const auto* tok = lm_->tokenizer()) {
    const std::vector<int32_t> tok_eos = tok->eos_ids();  // returned by value
    eos.insert(eos.end(), tok_eos.begin(), tok_eos.end());
  }
  run->stops.emplace(params.sampling.stop_ids, eos, params.sampling.ignore_eos, params.sampling.max_tokens,
                     lm_->config().max_position);
  run->generated = params.prior_tokens;
  run->prior = params.prior_tokens.size();
  if (run->feed.empty()) {
    run->generated.push_back(params.first_token);
    run->last = params.first_token;
  } else {
    run->last = run->feed[0];
    run->fed = 1;
  }
  run->stream = std::make_shared<TokenStream>();
  auto stream = run->stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The cache now owns the pages (Import handed them over); the reservation keeps only the accounting.
    run->committed_pages = r->committed_pages;
    reserved_.erase(id);
    joining_.push_back(std::move(run));
    ++decoding_;
  }
  cv_.notify_all();
  return stream;
}

StatusOr<std::unique_ptr<kvstore::SequenceCache>> DecodeEngine::ReusedCache(Reservation& r) {
  RetainedPrefix* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = r.reuse;
    // The whole retained sequence, held by no other reservation: it becomes this one's.
    if (e->pins == 1 && r.reuse_tokens == static_cast<int64_t>(e->tokens.size())) {
      r.reuse = nullptr;
      ++prefix_hits_;
      prefix_reused_tokens_ += r.reuse_tokens;
      return prefixes_->Take(e);
    }
  }
  // Shared with others, or longer than what this request shares: a copy of the shared prefix
  // (the entry is pinned, so it stays while it is read; const reads of a cache may run
  // concurrently with the engine thread's).
  auto copy = e->cache->ClonePrefix(r.reuse_tokens);
  std::lock_guard<std::mutex> lock(mu_);
  prefixes_->Unpin(e);
  r.reuse = nullptr;
  if (copy.ok()) {
    ++prefix_hits_;
    prefix_reused_tokens_ += r.reuse_tokens;
  }
  return copy;
}

bool DecodeEngine::Retain(Running& r) {
  if (r.kv_tokens.empty() || !options_.prefix_cache || ranks_.size() != 1 || !backend_->HasSequence(r.id)) return false;
  auto len = backend_->SequenceLength(r.id);
  if (!len.ok() || *len != static_cast<int64_t>(r.kv_tokens.size()) || *len < options_.page_size) return false;
  auto cache = ranks_[0]->ReleaseSequence(r.id);
  if (!cache.ok()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  prefixes_->Add(std::move(r.salt), std::move(r.kv_tokens), std::move(*cache), r.indexed);
  return true;
}

void DecodeEngine::DropClaimed(uint64_t id) {
  transport_->Cancel(id);
  // After Cancel, Wait returns as soon as no write into the reservation's pages is in flight.
  transport_->Wait(id, Clock::now() + std::chrono::seconds(30)).IgnoreError();
  Drop(id);
}

Status DecodeEngine::Release(uint64_t id, std::string_view token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(id);
    if (it == tokens_.end()) return NotFoundError("sequence " + std::to_string(id) + " is not live here");
    if (!ConstantTimeEqual(it->second, token)) {
      return Status(StatusCode::kPermissionDenied, "sequence " + std::to_string(id) + ": wrong reservation token");
    }
  }
  Cancel(id);
  return Status::Ok();
}

void DecodeEngine::Cancel(uint64_t id) {
  bool reserved = false;
  bool claimed = false;  // this call owns the reservation's cleanup (no Start is waiting on it)
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reserved_.find(id);
    if (it != reserved_.end()) {
      reserved = true;
      if (!it->second->started) {
        it->second->started = true;
        claimed = true;
      }
    } else {
      cancel_requests_.push_back(id);
    }
  }
  if (reserved) {
    // A Start() blocked in Wait sees CANCELLED and drops the reservation itself.
    if (claimed) {
      DropClaimed(id);
    } else {
      transport_->Cancel(id);
    }
  }
  cv_.notify_all();
}

void DecodeEngine::StopAdmitting() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

void DecodeEngine::FailAll(const Status& status) {
  std::vector<uint64_t> reserved;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_all_ = status;
    for (auto& [id, r] : reserved_) reserved.push_back(id);
  }
  // Reservations (a Start waiting for KV sees CANCELLED and drops its own); the engine thread
  // ends the joining and running ones.
  for (uint64_t id : reserved) Cancel(id);
  cv_.notify_all();
}

transport::Clock::time_point DecodeEngine::last_heartbeat() const {
  return transport::Clock::time_point(transport::Clock::duration(heartbeat_ns_.load(std::memory_order_relaxed)));
}

DecodeEngineStats DecodeEngine::stats() const {
  DecodeEngineStats s;
  s.total_pages = pool_->capacity_pages();
  s.page_bytes = static_cast<int64_t>(pool_->page_bytes());
  std::lock_guard<std::mutex> lock(mu_);
  s.used_pages = pool_->used_pages() - prefixes_->stats().pages;
  s.committed_pages = committed_pages_;
  s.decoding_sequences = decoding_;
  s.active_sequences = decoding_ + static_cast<int>(reserved_.size());
  s.reservations = reservations_;
  s.tokens_generated = tokens_generated_;
  s.pages_fetched = pages_fetched_;
  s.retrieval_seconds = retrieval_seconds_;
  s.device_cache = device_cache_stats_;
  const PrefixCacheStats p = prefixes_->stats();
  s.retained_pages = p.pages;
  s.retained_entries = p.entries;
  s.prefix_evictions = p.evictions;
  s.prefix_lookups = prefix_lookups_;
  s.prefix_hits = prefix_hits_;
  s.prefix_reused_tokens = prefix_reused_tokens_;
  s.prefix_computed_tokens = prefix_computed_tokens_;
  if (group_ != nullptr) {
    for (int r = 0; r < group_->size(); ++r) s.device_weight_bytes += group_->rank(r).device_weight_bytes();
  } else {
    s.device_weight_bytes = model_->device_weight_bytes();
  }
  return s;
}

void DecodeEngine::ExpireReservations() {
  std::vector<uint64_t> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto limit = std::chrono::duration<double>(options_.reservation_timeout_seconds);
    const auto now = Clock::now();
    for (auto& [id, r] : reserved_) {
      if (r->started) continue;
      // The clock runs from the prefill's start notice (queue time does not count); before it
      // arrives, the reservation waits at most its prefill_wait.
      const int64_t notice = r->kv ? r->kv->prefill_started_ns() : 0;  // none for a reused prefix
      const bool expired_now = notice != 0 ? now - Clock::time_point(Clock::duration(notice)) > limit
                                           : now - r->created > r->prefill_wait;
      if (expired_now) expired.push_back(id);
    }
  }
  for (uint64_t id : expired) {
    ICE_LOG(WARNING) << "sequence " << id << " was reserved but never started (no prefill start within its wait, "
                        "or no Decode within the reservation timeout of its prefill start); dropping it";
    Cancel(id);
  }
}

void DecodeEngine::ReaperLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!reaper_cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; })) {
    lock.unlock();
    ExpireReservations();
    lock.lock();
  }
}

void DecodeEngine::Finish(Running& r, model::FinishReason reason, const Status& status) {
  DecodeUpdate last;
  last.done = true;
  last.finish = reason;
  last.status = status;
  if (backend_->HasSequence(r.id)) {
    auto st = SeqStats(r.id);
    if (st.ok()) {
      last.pages_fetched = st->pages_fetched;
      last.retrieval_seconds = st->retrieval_seconds;
    }
    // A sequence that finished, or that its client cancelled, holds valid KV for its tokens;
    // one that failed, or that a drain or shutdown ends, does not stay.
    const bool intact = (status.ok() && reason != model::FinishReason::kNone && r.feed.size() <= r.fed) ||
                        status.code() == StatusCode::kCancelled;
    bool keep = false;
    if (intact) {
      std::lock_guard<std::mutex> lock(mu_);
      keep = !stop_ && !draining_ && !fail_all_;
    }
    if (!(keep && Retain(r))) backend_->RemoveSequence(r.id).IgnoreError();
  }
  r.cache.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    committed_pages_ -= r.committed_pages;
    tokens_.erase(r.id);
    --decoding_;
    pages_fetched_ += last.pages_fetched;
    retrieval_seconds_ += last.retrieval_seconds;
  }
  r.stream->Push(std::move(last));
}

void DecodeEngine::Loop() {
  if (options_.threads > 0) omp_set_num_threads(options_.threads);  // this thread's parallel regions
  for (;;) {
    heartbeat_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    std::deque<std::unique_ptr<Running>> joining;
    std::vector<uint64_t> cancels;
    std::optional<Status> fail_all;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
        return stop_ || !joining_.empty() || !cancel_requests_.empty() || !running_.empty() || fail_all_;
      });
      if (stop_) return;
      joining.swap(joining_);
      cancels.swap(cancel_requests_);
      fail_all.swap(fail_all_);
    }
    if (fail_all) {
      for (auto& r : joining) Finish(*r, model::FinishReason::kNone, *fail_all);
      joining.clear();
      for (auto& [id, r] : running_) Finish(*r, model::FinishReason::kNone, *fail_all);
      running_.clear();
    }
    for (auto& r : joining) {
      uint64_t id = r->id;
      Status imported = Import(id, std::move(r->cache), r->budget_pages);
      if (!imported.ok()) {
        Finish(*r, model::FinishReason::kNone, imported);
        continue;
      }
      running_[id] = std::move(r);
      Running& run = *running_[id];
      if (!run.feed.empty()) {
        // The uncached tokens of a reused prefix attend exactly (kFull) until the last is fed.
        if (Status full = ranks_[0]->SetMode(id, kvstore::RetrievalMode::kFull); !full.ok()) {
          Finish(run, model::FinishReason::kNone, full);
          running_.erase(id);
        }
        continue;
      }
      // The first token came from prefill: it may already end the sequence.
      auto len = backend_->SequenceLength(id);
      const model::FinishReason first = run.stops->After(run.last, 1, len.ok() ? *len + 1 : 0);
      if (first != model::FinishReason::kNone) {
        Finish(run, first, Status::Ok());
        running_.erase(id);
      }
    }
    for (uint64_t id : cancels) {
      auto it = running_.find(id);
      if (it == running_.end()) continue;
      Finish(*it->second, model::FinishReason::kNone, CancelledError("sequence cancelled"));
      running_.erase(it);
    }
    if (!running_.empty()) Step();
  }
}

Status DecodeEngine::CheckStepInput(const Running& r) const {
  const auto& c = lm_->config();
  if (r.last < 0 || r.last >= c.vocab_size) {
    return InvalidArgumentError("input token " + std::to_string(r.last) + " of sequence " + std::to_string(r.id) +
                                " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
  ICE_ASSIGN_OR_RETURN(int len, backend_->SequenceLength(r.id));
  if (len + 1 > c.max_position) {
    return OutOfRangeError("sequence " + std::to_string(r.id) + " has reached the model's context of " +
                           std::to_string(c.max_position));
  }
  return Status::Ok();
}

void DecodeEngine::Step() {
  // Checks that would fail the whole batch's forward pass are made per sequence first, so that
  // one bad sequence ends alone and the others keep decoding.
  std::vector<uint64_t> bad;
  for (auto& [id, r] : running_) {
    if (Status s = CheckStepInput(*r); !s.ok()) {
      Finish(*r, model::FinishReason::kNone, s);
      bad.push_back(id);
    }
  }
  for (uint64_t id : bad) running_.erase(id);
  if (running_.empty()) return;
  std::vector<model::SequenceInput> inputs;
  std::vector<Running*> order;
  for (auto& [id, r] : running_) {
    inputs.push_back({id, std::span<const int32_t>(&r->last, 1)});
    order.push_back(r.get());
  }
  const bool observe = group_ != nullptr && group_->size() > 1 && options_.rank_times_observer;
  const model::RankStepTimes before = observe ? group_->RankTimes() : model::RankStepTimes{};
  Status st = lm_->Forward(inputs, *backend_, model::LogitsMode::kLastToken);
  if (!st.ok() && group_ != nullptr && !group_->usable() && !broken_.exchange(true)) {
    ICE_LOG(ERROR) << "decode: the tensor-parallel group failed inside a step (" << st.ToString()
                   << "); failing every sequence, not admitting more (restart the worker)";
  }
  if (observe) options_.rank_times_observer(group_->RankTimes().Since(before));
  std::vector<uint64_t> finished;
  const size_t vocab = static_cast<size_t>(lm_->config().vocab_size);
  int64_t produced = 0;
  int64_t computed = 0;  // uncached tokens of reused prefixes fed this step
  for (size_t i = 0; i < order.size(); ++i) {
    Running& r = *order[i];
    Status seq_status = st.ok() ? SeqError(r.id) : st;
    if (!seq_status.ok()) {
      Finish(r, model::FinishReason::kNone, seq_status);
      finished.push_back(r.id);
      continue;
    }
    if (!r.kv_tokens.empty()) r.kv_tokens.push_back(r.last);  // its KV is in the cache now
    if (r.fed > 0 && r.fed <= r.feed.size()) {
      ++computed;
      if (r.fed < r.feed.size()) {
        r.last = r.feed[r.fed++];  // no token is sampled until the last one is fed
        continue;
      }
      r.fed = r.feed.size() + 1;  // fed: output token 1 is sampled from these logits
      if (Status back = ranks_[0]->SetMode(r.id, kvstore::RetrievalMode::kSparse); !back.ok()) {
        Finish(r, model::FinishReason::kNone, back);
        finished.push_back(r.id);
        continue;
      }
    }
    // The decode worker's context is the generated tokens (a migrated stream's earlier ones,
    // then first_token onwards): the penalties all count over those.
    auto token = r.sampler->Sample(std::span<const float>(lm_->logits() + i * vocab, vocab), r.generated,
                                   r.generated.size());
    if (!token.ok()) {
      Finish(r, model::FinishReason::kNone, token.status());
      finished.push_back(r.id);
      continue;
    }
    r.generated.push_back(*token);
    r.last = *token;
    ++produced;
    DecodeUpdate update;
    update.tokens.push_back(*token);
    if (r.logprobs) update.logprobs.push_back(r.sampler->last_logprobs());
    r.stream->Push(std::move(update));
    if (!r.feed.empty() && r.generated.size() == r.prior + 1) {
      // Output token 1 of a reused prefix was drawn here, where a prefill worker's own sampler
      // would have drawn it: token 2 takes the first draw of a fresh one, as after a prefill, so
      // a seeded stream is the same whether its prefix was reused or prefilled.
      r.sampler = std::make_unique<model::Sampler>(r.params.sampling, lm_->device());
    }
    // The sequence holds its fed tokens plus this one, which has not been fed yet.
    auto len = backend_->SequenceLength(r.id);
    const model::FinishReason reason =
        r.stops->After(*token, static_cast<int>(r.generated.size() - r.prior), len.ok() ? *len + 1 : 0);
    if (reason == model::FinishReason::kNone) continue;
    Finish(r, reason, Status::Ok());
    finished.push_back(r.id);
  }
  for (uint64_t id : finished) running_.erase(id);
  std::lock_guard<std::mutex> lock(mu_);
  tokens_generated_ += produced;
  prefix_computed_tokens_ += computed;
  device_cache_stats_ = CacheStats();
}

Status DecodeEngine::Import(uint64_t id, std::unique_ptr<kvstore::SequenceCache> cache, int budget_pages) {
  kvstore::RetrievalPolicy policy;
  policy.budget_pages = budget_pages;
  policy.estimate_rest = options_.rest_estimate;
  policy.rest_cells = options_.rest_cells;
  if (ranks_.size() == 1) return ranks_[0]->Import(id, std::move(cache), policy);
  if (cache != nullptr && cache->options().num_kv_heads != shape_.num_kv_heads) {
    return InvalidArgumentError("shipped KV cache has " + std::to_string(cache->options().num_kv_heads) +
                                " kv heads; the model has " + std::to_string(shape_.num_kv_heads));
  }
  ICE_ASSIGN_OR_RETURN(auto parts, kvstore::SequenceCache::SplitByHead(std::move(cache), static_cast<int>(ranks_.size())));
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Status st = ranks_[r]->Import(id, std::move(parts[r]), policy);
    if (!st.ok()) {
      for (size_t j = 0; j < r; ++j) ranks_[j]->RemoveSequence(id).IgnoreError();
      return st.WithContext("tensor-parallel rank " + std::to_string(r));
    }  // the parts not imported free their pages as `parts` goes
  }
  return Status::Ok();
}

StatusOr<SequenceKvStats> DecodeEngine::SeqStats(uint64_t id) const {
  SequenceKvStats total;
  for (const IceCacheBackend* b : ranks_) {
    ICE_ASSIGN_OR_RETURN(SequenceKvStats s, b->Stats(id));
    total.pages_fetched += s.pages_fetched;  // pages of every head, as with one rank
    total.retrieval_seconds = std::max(total.retrieval_seconds, s.retrieval_seconds);  // ranks select at once
  }
  return total;
}

Status DecodeEngine::SeqError(uint64_t id) const {
  for (const IceCacheBackend* b : ranks_) {
    if (Status s = b->SequenceError(id); !s.ok()) return s;
  }
  return Status::Ok();
}

DevicePageCacheStats DecodeEngine::CacheStats() const {
  DevicePageCacheStats total;
  for (const IceCacheBackend* b : ranks_) {
    const DevicePageCacheStats s = b->device_cache_stats();
    total.hits += s.hits;
    total.misses += s.misses;
    total.h2d_bytes += s.h2d_bytes;
    total.slots += s.slots;
    total.bytes += s.bytes;
  }
  return total;
}

}  // namespace icecache::decode
