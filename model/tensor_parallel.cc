#include "model/tensor_parallel.h"

#include <algorithm>
#include <string>

namespace icecache::model {

StatusOr<std::unique_ptr<TpGroup>> TpGroup::Load(const std::string& dir, const TpGroupOptions& options) {
  const int n = options.size;
  if (n < 1) return InvalidArgumentError("tensor_parallel_size must be >= 1, got " + std::to_string(n));
  std::vector<kernels::Device> devices = options.devices;
  if (devices.empty()) {
    const kernels::Device d = kernels::ResolveDevice(options.device);
    for (int r = 0; r < n; ++r) {
      devices.push_back(d.backend == kernels::Backend::kCpu ? d : kernels::Device{kernels::Backend::kCuda, d.index + r});
    }
  }
  if (static_cast<int>(devices.size()) != n) {
    return InvalidArgumentError("tensor_parallel_size " + std::to_string(n) + " with " +
                                std::to_string(devices.size()) + " devices (one per rank)");
  }
  for (auto& d : devices) d = kernels::ResolveDevice(d);
  std::unique_ptr<TpGroup> g(new TpGroup());
  ICE_ASSIGN_OR_RETURN(g->comms_, parallel::CreateCommunicators(devices));
  for (int r = 0; r < n; ++r) {
    ModelLoadOptions lo;
    lo.device = devices[r];
    lo.tensor_parallel = {r, n, g->comms_[r].get()};
    ICE_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Model::Load(dir, lo));
    g->ranks_.push_back(std::move(m));
  }
  ICE_RETURN_IF_ERROR(kernels::UseDevice(devices[0]));
  if (devices[0].backend == kernels::Backend::kCpu && n > 1) {
    g->rank_cpu_threads_ = std::max(1, kernels::CpuThreads() / n);
  }
  g->results_.resize(n);
  for (int r = 1; r < n; ++r) g->threads_.emplace_back([p = g.get(), r] { p->RankLoop(r); });
  return g;
}

TpGroup::~TpGroup() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void TpGroup::RankLoop(int r) {
  kernels::SetCpuThreadsForThisThread(rank_cpu_threads_);
  uint64_t seen = 0;
  for (;;) {
    std::span<const SequenceInput> inputs;
    TpKvCache* cache = nullptr;
    LogitsMode mode;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || step_ != seen; });
      if (stop_) return;
      seen = step_;
      inputs = inputs_;
      cache = cache_;
      mode = mode_;
    }
    Status st = ranks_[r]->Forward(inputs, cache->rank(r), mode);
    std::lock_guard<std::mutex> lock(mu_);
    results_[r] = std::move(st);
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

std::unique_ptr<TpKvCache> TpGroup::NewDenseKvCache(const DenseKvCacheOptions& options) const {
  std::vector<std::unique_ptr<AttentionBackend>> ranks;
  for (const auto& m : ranks_) {
    DenseKvCacheOptions o = options;
    o.device = m->device();
    ranks.push_back(std::make_unique<DenseKvCache>(m->attention_shape(), o));
  }
  return std::move(WrapBackends(std::move(ranks)).value());  // of the ranks' shapes by construction
}

StatusOr<std::unique_ptr<TpKvCache>> TpGroup::WrapBackends(std::vector<std::unique_ptr<AttentionBackend>> ranks) const {
  if (static_cast<int>(ranks.size()) != size()) {
    return InvalidArgumentError("WrapBackends: " + std::to_string(ranks.size()) + " backends for " +
                                std::to_string(size()) + " ranks");
  }
  std::unique_ptr<TpKvCache> c(new TpKvCache());
  c->group_ = this;
  c->shape_ = ranks_[0]->attention_shape();
  c->shape_.num_q_heads = config().num_heads;
  c->shape_.num_kv_heads = config().num_kv_heads;
  for (int r = 0; r < size(); ++r) {
    const AttentionShape want = ranks_[r]->attention_shape();
    const AttentionShape& have = ranks[r] ? ranks[r]->shape() : want;
    if (ranks[r] == nullptr || have.num_layers != want.num_layers || have.num_q_heads != want.num_q_heads ||
        have.num_kv_heads != want.num_kv_heads || have.head_dim != want.head_dim ||
        !(ranks[r]->device() == ranks_[r]->device())) {
      return InvalidArgumentError("WrapBackends: rank " + std::to_string(r) + "'s backend is not of the rank's shape (" +
                                  std::to_string(want.num_q_heads) + " q heads, " + std::to_string(want.num_kv_heads) +
                                  " kv heads) on " + kernels::DeviceName(ranks_[r]->device()));
    }
    c->devices_.push_back(ranks_[r]->device());
  }
  c->ranks_ = std::move(ranks);
  return c;
}

Status TpGroup::Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode) {
  auto* cache = dynamic_cast<TpKvCache*>(&backend);
  if (cache == nullptr || cache->group_ != this) {
    return InvalidArgumentError("a tensor-parallel model runs on a TpKvCache of its own group (TpGroup::NewDenseKvCache or WrapBackends)");
  }
  const int n = size();
  if (!usable()) {
    return FailedPreconditionError("the tensor-parallel group was aborted by a failure inside an earlier step; "
                                   "load it again (restart the worker)");
  }
  if (n > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    inputs_ = inputs;
    cache_ = cache;
    mode_ = mode;
    pending_ = n - 1;
    ++step_;
  }
  work_cv_.notify_all();
  const int saved_threads = kernels::SetCpuThreadsForThisThread(rank_cpu_threads_);
  Status st0 = ranks_[0]->Forward(inputs, cache->rank(0), mode);
  kernels::SetCpuThreadsForThisThread(saved_threads);
  if (n == 1) return st0;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (!st0.ok()) return st0;
  for (int r = 1; r < n; ++r) {
    if (!results_[r].ok()) return results_[r];
  }
  return Status::Ok();
}

RankStepTimes TpGroup::RankTimes() const {
  RankStepTimes t;
  for (const auto& m : ranks_) {
    t.step.push_back(m->forward_seconds());
    t.collective.push_back(m->collective_seconds());
  }
  return t;
}

RankStepTimes RankStepTimes::Since(const RankStepTimes& before) const {
  RankStepTimes d = *this;
  for (size_t r = 0; r < d.step.size() && r < before.step.size(); ++r) d.step[r] -= before.step[r];
  for (size_t r = 0; r < d.collective.size() && r < before.collective.size(); ++r) d.collective[r] -= before.collective[r];
  return d;
}

bool TpGroup::usable() const {
  for (const auto& m : ranks_) {
    if (m->aborted_group()) return false;
  }
  return true;
}

Status TpKvCache::AddSequence(SequenceId id) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Status st = kernels::UseDevice(devices_[r]);
    if (st.ok()) st = ranks_[r]->AddSequence(id);
    if (!st.ok()) {
      for (size_t j = 0; j < r; ++j) {
        kernels::UseDevice(devices_[j]).IgnoreError();
        ranks_[j]->RemoveSequence(id).IgnoreError();
      }
      kernels::UseDevice(devices_[0]).IgnoreError();
      return st;
    }
  }
  return kernels::UseDevice(devices_[0]);
}

Status TpKvCache::RemoveSequence(SequenceId id) {
  Status first;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Status st = kernels::UseDevice(devices_[r]);
    if (st.ok()) st = ranks_[r]->RemoveSequence(id);
    if (!st.ok() && first.ok()) first = st;
  }
  kernels::UseDevice(devices_[0]).IgnoreError();
  return first;
}

Status TpKvCache::BeginStep(std::span<const StepSegment>) {
  return FailedPreconditionError("TpKvCache: steps run through TpGroup::Forward, not BeginStep");
}

Status TpKvCache::Attend(int, const float*, const float*, const float*, float*) {
  return FailedPreconditionError("TpKvCache: steps run through TpGroup::Forward, not Attend");
}

StatusOr<WorkerModel> LoadWorkerModel(const std::string& dir, const TpGroupOptions& options) {
  WorkerModel w;
  if (options.size > 1 || !options.devices.empty()) {
    ICE_ASSIGN_OR_RETURN(w.group, TpGroup::Load(dir, options));
    w.lm = w.group.get();
  } else {
    ModelLoadOptions lo;
    lo.device = options.device;
    ICE_ASSIGN_OR_RETURN(w.model, Model::Load(dir, lo));
    w.lm = w.model.get();
  }
  return w;
}

}  // namespace icecache::model
