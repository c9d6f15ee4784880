// The CPU communicator: ranks are threads sharing host memory. Each collective is a few
// rendezvous on a shared, abortable barrier; between them the ranks read each other's posted
// buffers directly.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "parallel/communicator.h"

namespace icecache::parallel {
namespace {

// Collectives move plain elements (f32, f16, bf16) only.
Status CheckPlain(kernels::DType t) {
  if (!kernels::IsBlockQuantized(t)) return Status::Ok();
  return InvalidArgumentError("CPU communicator: collectives take f32, f16 or bf16 elements, not " +
                              std::string(kernels::DTypeName(t)));
}

// What every rank posts before the first rendezvous of a collective.
struct Post {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t count = 0;
  kernels::DType dtype = kernels::DType::kF32;
  int op = 0;
  int root = 0;
};

enum Op : int { kAllReduce = 1, kAllGather = 2, kBroadcast = 3, kBarrier = 4 };

class CpuGroup {
 public:
  explicit CpuGroup(int n) : n_(n), posts_{std::vector<Post>(n), std::vector<Post>(n)}, scratch_(n) {}

  int size() const { return n_; }

  // Barrier for all n ranks. ABORTED once Abort() was called.
  Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return Aborted();
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    cv_.wait(lock, [&] { return aborted_ || generation_ != gen; });
    if (generation_ != gen) return Status::Ok();
    return Aborted();
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

  // Rank r's post for its collective number `seq` (two sets, alternating: a rank can start
  // collective seq + 1 while a slower one still reads the posts of seq, but not seq + 2).
  Post& post(uint64_t seq, int r) { return posts_[seq & 1][r]; }
  std::vector<float>& scratch(int r) { return scratch_[r]; }

  // After the first rendezvous: every rank checks that all posts agree (so all ranks return the
  // same error).
  Status CheckPosts(uint64_t seq) const {
    const std::vector<Post>& posts = posts_[seq & 1];
    const Post& p0 = posts[0];
    for (int r = 1; r < n_; ++r) {
      const Post& p = posts[r];
      if (p.op != p0.op || p.count != p0.count || p.dtype != p0.dtype || p.root != p0.root) {
        return InvalidArgumentError("CPU communicator: ranks called different collectives (rank 0: op " +
                                    std::to_string(p0.op) + ", " + std::to_string(p0.count) + " x " +
                                    std::string(kernels::DTypeName(p0.dtype)) + "; rank " + std::to_string(r) +
                                    ": op " + std::to_string(p.op) + ", " + std::to_string(p.count) + " x " +
                                    std::string(kernels::DTypeName(p.dtype)) + ")");
      }
    }
    return Status::Ok();
  }

 private:
  static Status Aborted() { return AbortedError("communicator group was aborted (another rank failed)"); }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;         // guarded by mu_
  uint64_t generation_ = 0;  // guarded by mu_
  bool aborted_ = false;     // guarded by mu_
  // Slot r is written by rank r only, before a rendezvous, and read by all after it.
  std::vector<Post> posts_[2];
  std::vector<std::vector<float>> scratch_;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  kernels::Device device() const override { return {kernels::Backend::kCpu, 0}; }
  std::string_view name() const override { return "cpu"; }

  Status AllReduceSum(void* buf, size_t count, kernels::DType dtype) override {
    ICE_RETURN_IF_ERROR(CheckPlain(dtype));
    ICE_RETURN_IF_ERROR(Begin({buf, buf, count, dtype, kAllReduce, 0}));
    const int n = size();
    if (n == 1 || count == 0) return Status::Ok();
    // Rank r sums its chunk [lo, hi) of every rank's buffer (fp32, rank order) into its scratch;
    // after the second rendezvous every rank copies every chunk into its own buffer.
    const size_t lo = Chunk(count, rank_), hi = Chunk(count, rank_ + 1);
    std::vector<float>& acc = group_->scratch(rank_);
    acc.assign(hi - lo, 0.f);
    const size_t es = kernels::DTypeSize(dtype);
    constexpr size_t kBlock = 4096;
    std::vector<float> tmp(dtype == kernels::DType::kF32 ? 0 : kBlock);
    for (int j = 0; j < n; ++j) {
      const auto* src = static_cast<const unsigned char*>(group_->post(seq_, j).src) + lo * es;
      if (dtype == kernels::DType::kF32) {
        const float* s = reinterpret_cast<const float*>(src);
        if (j == 0) {
          // A rank's chunk is empty when count < n: acc.data() is then null, which memcpy may not get.
          if (hi > lo) std::memcpy(acc.data(), s, (hi - lo) * sizeof(float));
        } else {
          for (size_t i = 0; i < hi - lo; ++i) acc[i] += s[i];
        }
        continue;
      }
      for (size_t b = 0; b < hi - lo; b += kBlock) {
        const size_t m = std::min(kBlock, hi - lo - b);
        kernels::ConvertToF32(dtype, src + b * es, tmp.data(), m);
        float* a = acc.data() + b;
        if (j == 0) {
          std::memcpy(a, tmp.data(), m * sizeof(float));
        } else {
          for (size_t i = 0; i < m; ++i) a[i] += tmp[i];
        }
      }
    }
    ICE_RETURN_IF_ERROR(group_->Wait());
    auto* dst = static_cast<unsigned char*>(buf);
    for (int j = 0; j < n; ++j) {
      const size_t jlo = Chunk(count, j), jhi = Chunk(count, j + 1);
      if (jhi == jlo) continue;  // an empty chunk (count < n): its scratch may be an empty vector
      const std::vector<float>& part = group_->scratch(j);
      if (dtype == kernels::DType::kF32) {
        std::memcpy(dst + jlo * es, part.data(), (jhi - jlo) * sizeof(float));
      } else {
        kernels::ConvertFromF32(dtype, part.data(), dst + jlo * es, jhi - jlo);
      }
    }
    return group_->Wait();  // scratch areas may be reused after this
  }

  Status AllGather(const void* send, void* recv, size_t count, kernels::DType dtype) override {
    ICE_RETURN_IF_ERROR(CheckPlain(dtype));
    ICE_RETURN_IF_ERROR(Begin({send, recv, count, dtype, kAllGather, 0}));
    const size_t bytes = count * kernels::DTypeSize(dtype);
    auto* dst = static_cast<unsigned char*>(recv);
    for (int j = 0; j < size(); ++j) {
      const void* src = group_->post(seq_, j).src;
      if (src != dst + j * bytes && bytes > 0) std::memcpy(dst + j * bytes, src, bytes);
    }
    return group_->Wait();  // the senders' buffers may be changed after this
  }

  Status Broadcast(void* buf, size_t count, kernels::DType dtype, int root) override {
    ICE_RETURN_IF_ERROR(CheckPlain(dtype));
    ICE_RETURN_IF_ERROR(Begin({buf, buf, count, dtype, kBroadcast, root}));  // all ranks agree on root
    if (root < 0 || root >= size()) {
      return InvalidArgumentError("Broadcast: root " + std::to_string(root) + " is not a rank of a group of " +
                                  std::to_string(size()));
    }
    const size_t bytes = count * kernels::DTypeSize(dtype);
    if (rank_ != root && bytes > 0) std::memcpy(buf, group_->post(seq_, root).src, bytes);
    return group_->Wait();
  }

  Status Barrier() override { return Begin({nullptr, nullptr, 0, kernels::DType::kF32, kBarrier, 0}); }

  void Abort() override { group_->Abort(); }

 private:
  // Posts this rank's arguments, meets the others and checks that all agree.
  Status Begin(const Post& p) {
    ++seq_;
    group_->post(seq_, rank_) = p;
    ICE_RETURN_IF_ERROR(group_->Wait());
    return group_->CheckPosts(seq_);
  }

  size_t Chunk(size_t count, int r) const { return count * static_cast<size_t>(r) / static_cast<size_t>(size()); }

  std::shared_ptr<CpuGroup> group_;
  const int rank_;
  uint64_t seq_ = 0;  // collectives this rank has begun
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateCpuCommunicators(int n) {
  if (n < 1) return InvalidArgumentError("a communicator group needs at least 1 rank, got " + std::to_string(n));
  auto group = std::make_shared<CpuGroup>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<CpuCommunicator>(group, r));
  return out;
}

}  // namespace icecache::parallel
