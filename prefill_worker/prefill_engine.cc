#include "prefill_worker/prefill_engine.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>

#include "common/logging.h"
#include "kvstore/page_pool.h"
#include "kvstore/sequence_cache.h"
#include "prefill_worker/capture_backend.h"
#include "transport/kv_shipping.h"

namespace icecache::prefill {

namespace {

// A send to the decode worker that did not finish by ucx.transfer_timeout_seconds means that
// worker is dead or unreachable (without peer failure detection a killed peer shows only as a
// timeout): UNAVAILABLE, which the router answers by reserving afresh and prefilling again,
// rather than DEADLINE_EXCEEDED, which reads as the client's own deadline.
Status PeerTimeoutIsUnavailable(Status s) {
  if (s.code() != StatusCode::kDeadlineExceeded) return s;
  return UnavailableError("the decode worker did not take the KV within ucx.transfer_timeout_seconds (dead or "
                          "unreachable): " + s.message());
}

}  // namespace
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

struct PrefillEngine::Pending {
  PrefillJob job;
  Clock::time_point enqueued;
  PrefillResult result;
  std::promise<StatusOr<PrefillResult>> done;
  // The start notice to the decode worker (transport::SendPrefillStarted), sent on a ship thread
  // as the batch starts; the shipment waits for it and counts it.
  std::shared_future<Status> notice;
};

// One sequence's build: its own page pool (pages it ships from), the cache being built layer by
// layer and the captured K/V it reads.
struct PrefillEngine::SeqBuild {
  std::shared_ptr<Pending> p;
  std::shared_ptr<CapturedKv> kv;  // the whole model's heads (with a TpGroup: gathered from rank_kv)
  std::vector<std::shared_ptr<CapturedKv>> rank_kv;  // TpGroup: [rank] each rank's own heads
  std::unique_ptr<std::atomic<int>[]> rank_ready;    // TpGroup: [rank] layers the rank completed
  int64_t n = 0;
  std::unique_ptr<kvstore::PagePool> pool;
  std::atomic<int> ready_layers{0};  // layers whose K/V is complete (set by the forward pass)
  // Held while building, so the forward pass never waits on it (it only bumps ready_layers).
  std::mutex build_mu;
  std::unique_ptr<kvstore::SequenceCache> cache;  // guarded by build_mu
  Status status;                                  // guarded by build_mu: first build error
  std::mutex time_mu;
  double build_seconds = 0;     // guarded by time_mu
  Clock::time_point build_end;  // guarded by time_mu
};

namespace {
model::AttentionShape WholeShape(const model::TpGroup& g) {
  model::AttentionShape s = g.rank(0).attention_shape();
  s.num_q_heads = g.config().num_heads;
  s.num_kv_heads = g.config().num_kv_heads;
  return s;
}
}  // namespace

PrefillEngine::PrefillEngine(model::Model* model, transport::Transport* transport, const PrefillEngineOptions& options)
    : PrefillEngine(model, nullptr, model->attention_shape(), transport, options) {}

PrefillEngine::PrefillEngine(model::TpGroup* group, transport::Transport* transport, const PrefillEngineOptions& options)
    : PrefillEngine(group, group, WholeShape(*group), transport, options) {}

PrefillEngine::PrefillEngine(model::LanguageModel* lm, model::TpGroup* group, const model::AttentionShape& shape,
                             transport::Transport* transport, const PrefillEngineOptions& options)
    : lm_(lm), group_(group), shape_(shape), transport_(transport), options_(options),
      ship_pool_(std::max(1, options.ship_threads)) {
  if (group_ != nullptr) {
    for (int r = 0; r < group_->size(); ++r) rank_kv_head0_.push_back(group_->rank(r).shard().kv_head0);
  }
  Beat();
  thread_ = std::thread([this] { EngineLoop(); });
}

PrefillEngine::~PrefillEngine() {
  std::deque<std::shared_ptr<Pending>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    orphans.swap(queue_);
  }
  cv_.notify_all();
  for (auto& p : orphans) p->done.set_value(UnavailableError("prefill worker is shutting down"));
  thread_.join();
  ship_pool_.Wait();
}

void PrefillEngine::StopAdmitting() {
  std::deque<std::shared_ptr<Pending>> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    refused.swap(queue_);
    for (auto& p : refused) queued_tokens_ -= static_cast<int64_t>(p->job.tokens.size());
  }
  for (auto& p : refused) {
    p->done.set_value(UnavailableError("prefill worker is draining (shutting down): prompt not started"));
  }
}

int64_t PrefillEngine::queued_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_tokens_;
}

std::chrono::steady_clock::time_point PrefillEngine::last_heartbeat() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::steady_clock::duration(heartbeat_ns_.load(std::memory_order_relaxed)));
}

int64_t PrefillEngine::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.completed;
}

PrefillEngineStats PrefillEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

StatusOr<PrefillResult> PrefillEngine::Run(PrefillJob job) {
  if (job.tokens.empty()) return InvalidArgumentError("prompt is empty");
  const int vocab = lm_->config().vocab_size;
  for (size_t i = 0; i < job.tokens.size(); ++i) {
    if (job.tokens[i] < 0 || job.tokens[i] >= vocab) {
      return InvalidArgumentError("token id " + std::to_string(job.tokens[i]) + " at prompt position " +
                                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (static_cast<int64_t>(job.tokens.size()) >= lm_->config().max_position) {
    return InvalidArgumentError("prompt of " + std::to_string(job.tokens.size()) +
                                " tokens does not fit the model's context of " +
                                std::to_string(lm_->config().max_position));
  }
  auto p = std::make_shared<Pending>();
  p->job = std::move(job);
  p->enqueued = Clock::now();
  auto future = p->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return UnavailableError("prefill worker is shutting down");
    if (draining_) return UnavailableError("prefill worker is draining (shutting down): not admitting prompts");
    if (broken_) {
      return UnavailableError("prefill worker's tensor-parallel group failed inside a step and must be restarted");
    }
    if (static_cast<int>(queue_.size()) >= options_.max_queued_requests) {
      return ResourceExhaustedError("prefill worker has " + std::to_string(queue_.size()) +
                                    " prompts queued (prefill.max_queued_requests)");
    }
    queued_tokens_ += static_cast<int64_t>(p->job.tokens.size());
    queue_.push_back(p);
  }
  cv_.notify_all();
  return future.get();
}

void PrefillEngine::EngineLoop() {
  if (options_.threads > 0) omp_set_num_threads(options_.threads);  // this thread's parallel regions
  for (;;) {
    std::vector<std::shared_ptr<Pending>> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_ || !queue_.empty(); })) Beat();
      Beat();
      if (stop_) return;
      // (the loop below may drop every queued job: an empty batch is skipped)
      int64_t tokens = 0;
      while (!queue_.empty()) {
        const auto& front = queue_.front();
        if (front->job.cancelled && front->job.cancelled()) {
          queued_tokens_ -= static_cast<int64_t>(front->job.tokens.size());
          front->done.set_value(CancelledError("prefill request cancelled while queued"));
          queue_.pop_front();
          continue;
        }
        int64_t n = static_cast<int64_t>(front->job.tokens.size());
        if (!batch.empty() && tokens + n > options_.max_batch_tokens) break;
        tokens += n;
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    if (!batch.empty()) RunBatch(std::move(batch));
  }
}

StatusOr<std::shared_ptr<PrefillEngine::SeqBuild>> PrefillEngine::NewSeqBuild(const std::shared_ptr<Pending>& p) {
  const auto& shape = shape_;
  auto b = std::make_shared<SeqBuild>();
  b->p = p;
  b->n = static_cast<int64_t>(p->job.tokens.size());
  const int ps = options_.page_size;
  // Enough for every layout: positional pages plus partly filled tree leaves (fewer than one
  // extra leaf per cell, and there are far fewer cells than tokens). Untouched pages cost no RAM.
  const int64_t per_head = 2 * ((b->n + ps - 1) / ps) + 8;
  kvstore::PagePoolOptions po;
  po.page_size = ps;
  po.head_dim = shape.head_dim;
  po.dtype = options_.kv_dtype;
  po.num_pages = per_head * shape.num_layers * shape.num_kv_heads;
  ICE_ASSIGN_OR_RETURN(b->pool, kvstore::PagePool::Create(po));
  kvstore::SequenceCacheOptions co;
  co.num_layers = shape.num_layers;
  co.num_kv_heads = shape.num_kv_heads;
  co.dense_layers = p->job.build_index ? options_.dense_layers : shape.num_layers;
  co.sink_pages = options_.sink_pages;
  co.window_pages = options_.window_pages;
  co.ice_group = options_.ice_group;
  co.dci = options_.dci;
  ICE_ASSIGN_OR_RETURN(b->cache, kvstore::SequenceCache::Create(co, b->pool.get()));
  ICE_RETURN_IF_ERROR(b->cache->BeginBuild(b->n));
  return b;
}

void PrefillEngine::BuildReadyLayers(SeqBuild& b) {
  std::lock_guard<std::mutex> lock(b.build_mu);
  if (!b.status.ok()) return;
  kvstore::SequenceCache& cache = *b.cache;
  const int first = cache.built_layers();
  const int ready = b.ready_layers.load();
  int end = first;  // one past the last layer that can be built now
  for (int l = first; l < ready; ++l) {
    if (cache.EndsGroup(l)) end = l + 1;
  }
  if (end == first) return;
  std::vector<const float*> k, v;
  const auto t0 = Clock::now();
  for (int l = first; l < end; ++l) {
    if (!b.rank_kv.empty()) GatherLayer(b, l);
    k.push_back(b.kv->k[l].data());
    v.push_back(b.kv->v[l].data());
  }
  b.status = cache.BuildLayers(first, end - first, k.data(), v.data());
  const auto t1 = Clock::now();
  std::lock_guard<std::mutex> time_lock(b.time_mu);
  b.build_end = t1;
  b.build_seconds += Seconds(t0, t1);
}

void PrefillEngine::GatherLayer(SeqBuild& b, int layer) const {
  const size_t hd = static_cast<size_t>(shape_.head_dim);
  const size_t kv = static_cast<size_t>(shape_.num_kv_heads);
  const size_t n = static_cast<size_t>(b.n);
  std::vector<float>& k = b.kv->k[layer];
  std::vector<float>& v = b.kv->v[layer];
  k.resize(n * kv * hd);
  v.resize(k.size());
  for (size_t r = 0; r < b.rank_kv.size(); ++r) {
    const size_t h0 = static_cast<size_t>(rank_kv_head0_[r]);
    const size_t nh = static_cast<size_t>(group_->rank(static_cast<int>(r)).attention_shape().num_kv_heads);
    if (r > 0 && h0 == static_cast<size_t>(rank_kv_head0_[r - 1])) continue;  // a replicated head, taken once
    const float* rk = b.rank_kv[r]->k[layer].data();
    const float* rv = b.rank_kv[r]->v[layer].data();
    for (size_t t = 0; t < n; ++t) {
      std::memcpy(k.data() + (t * kv + h0) * hd, rk + t * nh * hd, nh * hd * sizeof(float));
      std::memcpy(v.data() + (t * kv + h0) * hd, rv + t * nh * hd, nh * hd * sizeof(float));
    }
  }
}

void PrefillEngine::RunBatch(std::vector<std::shared_ptr<Pending>> batch) {
  const auto start = Clock::now();
  const int num_layers = shape_.num_layers;
  const int ranks = group_ != nullptr ? group_->size() : 1;
  std::vector<std::shared_ptr<SeqBuild>> builds(batch.size());
  // Runs inside the forward pass (on rank `rank`'s thread; `builds` is not resized meanwhile):
  // once every rank has completed `layer`, hands the finished layers to a ship thread.
  auto on_layer = [&](int rank, model::SequenceId id, int layer) {
    Beat();
    std::shared_ptr<SeqBuild> b = builds[id];
    if (!b) return;
    int ready = layer + 1;
    if (ranks > 1) {
      b->rank_ready[rank].store(layer + 1);
      for (int r = 0; r < ranks; ++r) ready = std::min(ready, b->rank_ready[r].load());
    }
    int seen = b->ready_layers.load();
    while (seen < ready && !b->ready_layers.compare_exchange_weak(seen, ready)) {
    }
    // EndsGroup reads only the cache's options, which never change. Two ranks may both see the
    // layer complete: BuildReadyLayers builds each layer once.
    if (ready > 0 && b->cache->EndsGroup(ready - 1)) ship_pool_.Submit([this, b] { BuildReadyLayers(*b); });
  };
  // The listener also keeps the heartbeat going through a long forward pass (with
  // overlap_tree_build off the engine beats only between batches).
  std::vector<CaptureBackend*> captures;  // [rank]
  std::unique_ptr<model::AttentionBackend> backend;
  std::vector<std::unique_ptr<model::AttentionBackend>> rank_backends;
  for (int r = 0; r < ranks; ++r) {
    const model::AttentionShape shape = group_ != nullptr ? group_->rank(r).attention_shape() : shape_;
    const kernels::Device device = group_ != nullptr ? group_->rank(r).device() : lm_->device();
    auto c = std::make_unique<CaptureBackend>(
        shape, device,
        options_.overlap_tree_build
            ? CaptureBackend::LayerListener([&on_layer, r](model::SequenceId id, int layer) { on_layer(r, id, layer); })
            : nullptr,
        options_.kv_dtype);
    captures.push_back(c.get());
    rank_backends.push_back(std::move(c));
  }
  if (group_ != nullptr) {
    auto wrapped = group_->WrapBackends(std::move(rank_backends));
    if (!wrapped.ok()) {  // of the ranks' shapes and devices by construction
      for (auto& p : batch) p->done.set_value(wrapped.status());
      return;
    }
    backend = std::move(*wrapped);
  } else {
    backend = std::move(rank_backends[0]);
  }
  // The decode worker's reservation clock starts now (docs/cluster.md): announce each prefill,
  // off this thread (a dead peer must not stall the forward pass).
  const auto notice_deadline = start + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.transfer_timeout_seconds));
  for (const auto& p : batch) {
    auto promise = std::make_shared<std::promise<Status>>();
    p->notice = promise->get_future().share();
    ship_pool_.Submit([this, p, promise, notice_deadline] {
      promise->set_value(transport::SendPrefillStarted(*transport_, p->job.peer, p->job.transfer_id, p->job.token,
                                                    notice_deadline));
    });
  }
  std::vector<model::SequenceInput> inputs;
  for (size_t i = 0; i < batch.size(); ++i) {
    backend->AddSequence(i).IgnoreError();
    for (CaptureBackend* c : captures) c->ExpectLength(i, static_cast<int>(batch[i]->job.tokens.size())).IgnoreError();
    inputs.push_back({static_cast<model::SequenceId>(i), batch[i]->job.tokens});
    // A sequence whose build cannot start (no memory for its pool) is answered now; it stays in
    // the batch (its prompt must outlive the forward pass) and is skipped afterwards.
    auto b = NewSeqBuild(batch[i]);
    if (!b.ok()) {
      batch[i]->done.set_value(b.status());
      continue;
    }
    if (group_ == nullptr) {
      (*b)->kv = captures[0]->kv(i);
    } else {
      (*b)->kv = std::make_shared<CapturedKv>();
      (*b)->kv->k.resize(num_layers);
      (*b)->kv->v.resize(num_layers);
      for (CaptureBackend* c : captures) (*b)->rank_kv.push_back(c->kv(i));
      (*b)->rank_ready = std::make_unique<std::atomic<int>[]>(ranks);
    }
    builds[i] = std::move(*b);
  }
  const bool observe = group_ != nullptr && ranks > 1 && options_.rank_times_observer;
  const model::RankStepTimes before = observe ? group_->RankTimes() : model::RankStepTimes{};
  Status st = lm_->Forward(inputs, *backend, model::LogitsMode::kLastToken);
  const auto computed = Clock::now();
  if (!st.ok() && group_ != nullptr && !group_->usable() && !broken_.exchange(true)) {
    ICE_LOG(ERROR) << "prefill: the tensor-parallel group failed inside a forward pass (" << st.ToString()
                   << "); refusing further prompts (restart the worker)";
  }
  if (observe) options_.rank_times_observer(group_->RankTimes().Since(before));
  int64_t batch_tokens = 0;
  for (auto& in : inputs) batch_tokens += static_cast<int64_t>(in.tokens.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_tokens_ -= batch_tokens;
  }
  const size_t vocab = static_cast<size_t>(lm_->config().vocab_size);
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = batch[i];
    if (!builds[i]) continue;
    if (!st.ok()) {
      p->done.set_value(st);
      continue;
    }
    model::Sampler sampler(p->job.sampling, lm_->device());
    auto token = sampler.Sample(std::span<const float>(lm_->logits() + i * vocab, vocab), p->job.tokens);
    if (!token.ok()) {
      p->done.set_value(token.status());
      continue;
    }
    p->result.first_token = *token;
    if (p->job.sampling.logprobs >= 0) p->result.first_logprobs = sampler.last_logprobs();
    p->result.queue_seconds = Seconds(p->enqueued, start);
    p->result.compute_seconds = Seconds(start, computed);
    std::shared_ptr<SeqBuild> b = builds[i];
    b->ready_layers = num_layers;
    ship_pool_.Submit([this, b, computed] {
      BuildReadyLayers(*b);
      {
        std::lock_guard<std::mutex> lock(b->time_mu);
        b->p->result.tree_build_total_seconds = b->build_seconds;
        // Builds that ended before the forward pass did were hidden entirely.
        b->p->result.tree_build_seconds = std::max(0.0, Seconds(computed, b->build_end));
      }
      FinishAndShip(b);
    });
  }
}

void PrefillEngine::FinishAndShip(const std::shared_ptr<SeqBuild>& b) {
  const std::shared_ptr<Pending>& p = b->p;
  auto fail = [&](const Status& s) { p->done.set_value(s); };
  {
    std::lock_guard<std::mutex> lock(b->build_mu);
    if (!b->status.ok()) return fail(b->status);
    if (Status s = b->cache->FinishBuild(); !s.ok()) return fail(s);
  }
  if (p->job.cancelled && p->job.cancelled()) return fail(CancelledError("prefill request cancelled before shipping"));
  const bool notice_sent = p->notice.valid();
  if (notice_sent) {
    if (Status n = p->notice.get(); !n.ok()) {
      return fail(PeerTimeoutIsUnavailable(n).WithContext("announcing the prefill start to the decode worker"));
    }
  }
  auto wire = b->cache->Serialize();
  if (!wire.ok()) return fail(wire.status());
  const auto t1 = Clock::now();
  const auto deadline = t1 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options_.transfer_timeout_seconds));
  auto shipped = transport::ShipSequence(*transport_, p->job.peer, p->job.transfer_id, p->job.token, *wire, *b->pool,
                                         options_.max_segment_bytes, deadline, notice_sent);
  const auto t2 = Clock::now();
  if (!shipped.ok()) {
    return fail(PeerTimeoutIsUnavailable(shipped.status()).WithContext("shipping the KV cache to the decode worker"));
  }
  p->result.transfer_seconds = Seconds(t1, t2);
  p->result.pages_shipped = shipped->pages;
  p->result.segments_shipped = shipped->segments;
  p->result.transfer_bytes = shipped->bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.completed;
    stats_.tree_build_seconds += p->result.tree_build_seconds;
    stats_.tree_build_total_seconds += p->result.tree_build_total_seconds;
    stats_.transfer_bytes += p->result.transfer_bytes;
    stats_.segments_shipped += p->result.segments_shipped;
  }
  p->done.set_value(p->result);
}

}  // namespace icecache::prefill
