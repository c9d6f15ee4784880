#include "prefill_worker/prefill_engine.h"

#include <omp.h>

#include <chrono>
#include <future>
#include <unordered_map>

#include "common/logging.h"
#include "kernels/attention.h"
#include "kvstore/page_pool.h"
#include "kvstore/sequence_cache.h"

namespace icecache::prefill {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Dense prefill attention that keeps every layer's K/V in fp32 ([n, num_kv_heads, head_dim] per
// layer and sequence), which is what SequenceCache::Build consumes. Chunked prompts work (a
// later segment attends over the stored earlier tokens), though the engine sends whole prompts.
class CaptureBackend final : public model::AttentionBackend {
 public:
  explicit CaptureBackend(const model::AttentionShape& shape) : shape_(shape) {}

  struct Seq {
    int length = 0;
    std::vector<std::vector<float>> k, v;  // [layer]
  };

  const model::AttentionShape& shape() const override { return shape_; }
  Status AddSequence(model::SequenceId id) override {
    if (seqs_.count(id)) return AlreadyExistsError("sequence exists");
    Seq s;
    s.k.resize(shape_.num_layers);
    s.v.resize(shape_.num_layers);
    seqs_.emplace(id, std::move(s));
    return Status::Ok();
  }
  Status RemoveSequence(model::SequenceId id) override {
    return seqs_.erase(id) ? Status::Ok() : NotFoundError("sequence not found");
  }
  bool HasSequence(model::SequenceId id) const override { return seqs_.count(id) > 0; }
  StatusOr<int> SequenceLength(model::SequenceId id) const override {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) return NotFoundError("sequence not found");
    return it->second.length;
  }
  Status BeginStep(std::span<const model::StepSegment> segments) override {
    step_.clear();
    for (const auto& seg : segments) {
      auto it = seqs_.find(seg.seq_id);
      if (it == seqs_.end()) return NotFoundError("sequence not found");
      if (seg.num_tokens < 1) return InvalidArgumentError("empty segment");
      step_.push_back({&it->second, seg.num_tokens});
    }
    return Status::Ok();
  }
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const size_t kv_row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
    const size_t q_row = static_cast<size_t>(shape_.num_q_heads) * shape_.head_dim;
    size_t row = 0;
    for (auto& [s, n] : step_) {
      auto& ks = s->k[layer];
      auto& vs = s->v[layer];
      ks.insert(ks.end(), k + row * kv_row, k + (row + n) * kv_row);
      vs.insert(vs.end(), v + row * kv_row, v + (row + n) * kv_row);
      kernels::PrefillAttentionParams p;
      p.q = q + row * q_row;
      p.k = ks.data();
      p.v = vs.data();
      p.out = out + row * q_row;
      p.q_len = n;
      p.kv_len = s->length + n;
      p.num_q_heads = shape_.num_q_heads;
      p.num_kv_heads = shape_.num_kv_heads;
      p.head_dim = shape_.head_dim;
      p.scale = shape_.scale;
      ICE_RETURN_IF_ERROR(kernels::PrefillAttention(p));
      row += n;
    }
    return Status::Ok();
  }
  void EndStep(bool commit) override {
    for (auto& [s, n] : step_) {
      if (commit) {
        s->length += n;
      } else {
        for (auto& k : s->k) k.resize(static_cast<size_t>(s->length) * shape_.num_kv_heads * shape_.head_dim);
        for (auto& v : s->v) v.resize(static_cast<size_t>(s->length) * shape_.num_kv_heads * shape_.head_dim);
      }
    }
    step_.clear();
  }
  Seq& seq(model::SequenceId id) { return seqs_.at(id); }

 private:
  model::AttentionShape shape_;
  std::unordered_map<model::SequenceId, Seq> seqs_;
  std::vector<std::pair<Seq*, int>> step_;
};

}  // namespace

struct PrefillEngine::Pending {
  PrefillJob job;
  Clock::time_point enqueued;
  PrefillResult result;
  std::promise<StatusOr<PrefillResult>> done;
};

PrefillEngine::PrefillEngine(model::Model* model, transport::Transport* transport, const PrefillEngineOptions& options)
    : model_(model), transport_(transport), options_(options), ship_pool_(std::max(1, options.ship_threads)) {
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

int64_t PrefillEngine::queued_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_tokens_;
}

int64_t PrefillEngine::completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_;
}

StatusOr<PrefillResult> PrefillEngine::Run(PrefillJob job) {
  if (job.tokens.empty()) return InvalidArgumentError("prompt is empty");
  const int vocab = model_->config().vocab_size;
  for (size_t i = 0; i < job.tokens.size(); ++i) {
    if (job.tokens[i] < 0 || job.tokens[i] >= vocab) {
      return InvalidArgumentError("token id " + std::to_string(job.tokens[i]) + " at prompt position " +
                                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (static_cast<int64_t>(job.tokens.size()) >= model_->config().max_position) {
    return InvalidArgumentError("prompt of " + std::to_string(job.tokens.size()) +
                                " tokens does not fit the model's context of " +
                                std::to_string(model_->config().max_position));
  }
  auto p = std::make_shared<Pending>();
  p->job = std::move(job);
  p->enqueued = Clock::now();
  auto future = p->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return UnavailableError("prefill worker is shutting down");
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
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      int64_t tokens = 0;
      while (!queue_.empty()) {
        int64_t n = static_cast<int64_t>(queue_.front()->job.tokens.size());
        if (!batch.empty() && tokens + n > options_.max_batch_tokens) break;
        tokens += n;
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    RunBatch(std::move(batch));
  }
}

void PrefillEngine::RunBatch(std::vector<std::shared_ptr<Pending>> batch) {
  const auto start = Clock::now();
  CaptureBackend backend(model_->attention_shape());
  std::vector<model::SequenceInput> inputs;
  for (size_t i = 0; i < batch.size(); ++i) {
    backend.AddSequence(i).IgnoreError();
    inputs.push_back({static_cast<model::SequenceId>(i), batch[i]->job.tokens});
  }
  std::vector<float> logits;
  Status st = model_->Forward(inputs, backend, model::LogitsMode::kLastToken, &logits);
  const auto computed = Clock::now();
  int64_t batch_tokens = 0;
  for (auto& p : batch) batch_tokens += static_cast<int64_t>(p->job.tokens.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_tokens_ -= batch_tokens;
  }
  const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = batch[i];
    if (!st.ok()) {
      p->done.set_value(st);
      continue;
    }
    model::Sampler sampler(p->job.sampling);
    auto token = sampler.Sample(std::span<const float>(logits.data() + i * vocab, vocab), p->job.tokens);
    if (!token.ok()) {
      p->done.set_value(token.status());
      continue;
    }
    p->result.first_token = *token;
    p->result.queue_seconds = Seconds(p->enqueued, start);
    p->result.compute_seconds = Seconds(start, computed);
    auto& seq = backend.seq(i);
    ship_pool_.Submit([this, p, k = std::move(seq.k), v = std::move(seq.v)]() mutable {
      BuildAndShip(p, std::move(k), std::move(v));
    });
  }
}

void PrefillEngine::BuildAndShip(const std::shared_ptr<Pending>& p, std::vector<std::vector<float>> k,
                                 std::vector<std::vector<float>> v) {
  auto fail = [&](const Status& s) {
    p->done.set_value(s);
  };
  const auto shape = model_->attention_shape();
  const int64_t n = static_cast<int64_t>(p->job.tokens.size());
  const int ps = options_.page_size;
  // Enough for every layout: positional pages plus partly filled tree leaves (fewer than one
  // extra leaf per cell, and there are far fewer cells than tokens). Untouched pages cost no RAM.
  const int64_t per_head = 2 * ((n + ps - 1) / ps) + 8;
  kvstore::PagePoolOptions po;
  po.page_size = ps;
  po.head_dim = shape.head_dim;
  po.dtype = kernels::DType::kF32;
  po.num_pages = per_head * shape.num_layers * shape.num_kv_heads;
  auto pool = kvstore::PagePool::Create(po);
  if (!pool.ok()) return fail(pool.status());

  const auto t0 = Clock::now();
  kvstore::SequenceCacheOptions co;
  co.num_layers = shape.num_layers;
  co.num_kv_heads = shape.num_kv_heads;
  co.dense_layers = p->job.build_index ? options_.dense_layers : shape.num_layers;
  co.sink_pages = options_.sink_pages;
  co.window_pages = options_.window_pages;
  co.ice_group = options_.ice_group;
  co.dci = options_.dci;
  auto cache = kvstore::SequenceCache::Create(co, pool->get());
  if (!cache.ok()) return fail(cache.status());
  std::vector<const float*> kp, vp;
  for (int l = 0; l < shape.num_layers; ++l) {
    kp.push_back(k[l].data());
    vp.push_back(v[l].data());
  }
  Status built = (*cache)->Build(kp.data(), vp.data(), n);
  if (!built.ok()) return fail(built);
  auto wire = (*cache)->Serialize();
  if (!wire.ok()) return fail(wire.status());
  const auto t1 = Clock::now();

  std::vector<transport::Segment> segments;
  segments.reserve(wire->pages.size() + 1);
  segments.push_back({0, wire->metadata.data(), wire->metadata.size()});
  const size_t page_bytes = (*pool)->page_bytes();
  for (size_t i = 0; i < wire->pages.size(); ++i) {
    segments.push_back({static_cast<uint32_t>(i + 1), (*pool)->PageK(wire->pages[i]), page_bytes});
  }
  const auto deadline = t1 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options_.transfer_timeout_seconds));
  Status sent = transport_->Send(p->job.peer, p->job.transfer_id, segments, deadline);
  if (sent.ok()) {
    sent = transport_->Finish(p->job.peer, p->job.transfer_id, static_cast<uint32_t>(segments.size()), deadline);
  }
  const auto t2 = Clock::now();
  if (!sent.ok()) return fail(sent.WithContext("shipping the KV cache to the decode worker"));
  p->result.tree_build_seconds = Seconds(t0, t1);
  p->result.transfer_seconds = Seconds(t1, t2);
  p->result.pages_shipped = static_cast<int64_t>(wire->pages.size());
  p->result.transfer_bytes = static_cast<int64_t>(wire->metadata.size() + wire->pages.size() * page_bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++completed_;
  }
  p->done.set_value(p->result);
}

}  // namespace icecache::prefill
