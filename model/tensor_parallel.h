// A tensor-parallel group of one model: `size` rank Models (model/model.h,
// TensorParallelOptions), each with its own communicator rank and its own KV cache of its local
// heads, driven by one thread per rank inside this process. Rank 0 runs on the calling thread,
// ranks 1.. on threads the group owns. TpGroup is a LanguageModel, so the Generator drives it like
// a Model, with the backend from NewDenseKvCache:
//
//   ICE_ASSIGN_OR_RETURN(auto group, TpGroup::Load(dir, {.size = 2}));
//   auto cache = group->NewDenseKvCache({});
//   Generator gen(*group, *cache);
//
// Every rank computes the same logits (replicated lm_head; the all-reduces give every rank the
// same hidden state); logits() is rank 0's, on rank 0's device.
//
// CPU ranks share the cores: each rank's kernels run on kernels::CpuThreads() / size threads
// (at least 1; CpuThreads() as it was at Load), set per rank thread
// (kernels::SetCpuThreadsForThisThread), so a group uses as many threads as one Model does.
//
// Thread safety: as Model (one thread drives Forward; the cache's calls are serialised with it).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/dense_kv_cache.h"
#include "model/language_model.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace icecache::model {

struct TpGroupOptions {
  int size = 1;  // ranks (tensor_parallel_size)
  // Device of each rank. Empty: every rank on the CPU when `device` resolves to the CPU, else
  // ranks on cuda:0 .. cuda:size-1.
  std::vector<kernels::Device> devices;
  kernels::Device device;  // used when `devices` is empty (auto: CUDA when present)
};

class TpKvCache;

// Per-rank seconds of a TpGroup's steps ([ranks] each): the rank's Forward, and its collectives.
struct RankStepTimes {
  std::vector<double> step, collective;
  // This minus `before`, element-wise (a step's own times from two cumulative snapshots).
  RankStepTimes Since(const RankStepTimes& before) const;
};

class TpGroup final : public LanguageModel {
 public:
  // Creates the communicators (parallel::CreateCommunicators) and loads every rank's slices of
  // DIR (as Model::Load). INVALID_ARGUMENT for size < 1, a devices list of another length, or a
  // model the size does not divide (the message names the counts); errors of Model::Load.
  static StatusOr<std::unique_ptr<TpGroup>> Load(const std::string& dir, const TpGroupOptions& options);
  ~TpGroup() override;

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  kernels::Device device() const override { return ranks_[0]->device(); }
  const tokenizer::Tokenizer* tokenizer() const override { return ranks_[0]->tokenizer(); }
  int size() const { return static_cast<int>(ranks_.size()); }
  const Model& rank(int r) const { return *ranks_[r]; }
  // "cpu" or "nccl".
  std::string_view communicator_name() const { return comms_[0]->name(); }

  // A dense KV cache per rank (of its local heads, on its device; options.device is ignored),
  // behind one AttentionBackend whose sequence calls go to every rank. Only Forward of this group
  // may run a step on it.
  std::unique_ptr<TpKvCache> NewDenseKvCache(const DenseKvCacheOptions& options) const;
  // Any backends, one per rank (e.g. the decode worker's IceCacheBackend over the rank's own kv
  // heads' trees and pages), as one TpKvCache of this group. INVALID_ARGUMENT unless there is one
  // per rank, each of its rank's attention_shape() and device.
  StatusOr<std::unique_ptr<TpKvCache>> WrapBackends(std::vector<std::unique_ptr<AttentionBackend>> ranks) const;

  // Runs Model::Forward on every rank at once with `backend`, which must be a TpKvCache of this
  // group (INVALID_ARGUMENT otherwise). Returns rank 0's error, else the first other rank's.
  Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode) override;
  const float* logits() const override { return ranks_[0]->logits(); }
  int logits_rows() const { return ranks_[0]->logits_rows(); }

  // False once a failure inside a step's layers aborted the ranks' communicators: every later
  // Forward is FAILED_PRECONDITION at once (a serving worker must be restarted). Errors agreed
  // before the layers (a bad token id, a full cache) leave the group usable.
  bool usable() const;

  // Seconds rank r spent in collectives so far (Model::collective_seconds).
  double collective_seconds(int r) const { return ranks_[r]->collective_seconds(); }
  // Per rank, cumulative: Forward (the rank's whole step) and collective seconds. A step's own
  // times are RankTimes() after it minus RankTimes() before (RankStepTimes::Since).
  RankStepTimes RankTimes() const;

 private:
  TpGroup() = default;
  void RankLoop(int r);

  std::vector<std::unique_ptr<parallel::Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> ranks_;  // constant after Load
  std::vector<std::thread> threads_;           // ranks 1 .. size-1
  int rank_cpu_threads_ = 0;                   // per CPU rank thread; 0 = not CPU ranks (no override)

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  // State below is guarded by mu_: the current step, handed to the rank threads.
  uint64_t step_ = 0;
  bool stop_ = false;
  int pending_ = 0;
  std::span<const SequenceInput> inputs_;
  TpKvCache* cache_ = nullptr;
  LogitsMode mode_ = LogitsMode::kLastToken;
  std::vector<Status> results_;
};

// The per-rank attention backends of a TpGroup as one AttentionBackend: shape() is the whole model's,
// AddSequence/RemoveSequence go to every rank (all or none), SequenceLength is rank 0's.
// BeginStep/Attend/EndStep are not for direct use (FAILED_PRECONDITION; TpGroup::Forward drives
// the ranks' caches).
class TpKvCache final : public AttentionBackend {
 public:
  const AttentionShape& shape() const override { return shape_; }
  kernels::Device device() const override { return devices_[0]; }
  Status AddSequence(SequenceId id) override;
  Status RemoveSequence(SequenceId id) override;
  bool HasSequence(SequenceId id) const override { return ranks_[0]->HasSequence(id); }
  StatusOr<int> SequenceLength(SequenceId id) const override { return ranks_[0]->SequenceLength(id); }
  Status BeginStep(std::span<const StepSegment> segments) override;
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override;
  void EndStep(bool commit) override {}

  AttentionBackend& rank(int r) { return *ranks_[r]; }

 private:
  friend class TpGroup;
  TpKvCache() = default;

  const TpGroup* group_ = nullptr;
  AttentionShape shape_;
  std::vector<kernels::Device> devices_;
  std::vector<std::unique_ptr<AttentionBackend>> ranks_;
};

// A worker's model: one Model, or a TpGroup when options.size > 1 or rank devices are listed
// (`lm` points at whichever was loaded). The one place the prefill and decode workers choose.
struct WorkerModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<TpGroup> group;
  LanguageModel* lm = nullptr;
};
StatusOr<WorkerModel> LoadWorkerModel(const std::string& dir, const TpGroupOptions& options);

}  // namespace icecache::model
