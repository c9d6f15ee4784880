// Workloads "attention" and "gemv" of icecache-bench.
//
// attention: one decode step of one layer with the Llama-3.1-8B head layout (32 query heads,
// 8 KV heads, head_dim 128) over a paged KV cache: dense (every page of the context) against
// sparse (budget pages: 2 sink + 2 window + random others), plus the memory bandwidth this
// program measures itself, so dense time can be read as a fraction of the machine's bandwidth.
// Caches are flushed (a 64 MiB read, untimed) before every timed call: in a real decode step the
// previous layer's pages are not in cache either.
//
// gemv: y = x · Wᵀ with W of n×k in bf16/f16/f32 (Llama-3.1-8B shapes by default), our Matmul
// against OpenBLAS sgemv/sgemm on the same weights converted to fp32 beforehand.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/cpu_time.h"
#include "bench/workload.h"
#include "kernels/attention.h"
#include "kernels/backend.h"
#include "bench/blas_reference.h"
#include "kernels/device_buffer.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/simd_target.h"

namespace icecache::bench {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using kernels::DType;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

bool ParseBackend(const std::string& s, Backend* b) {
  if (s == "cpu") *b = Backend::kCpu;
  else if (s == "cuda") *b = Backend::kCuda;
  else if (s == "auto") *b = Backend::kAuto;
  else return false;
  return true;
}

// Deterministic pseudo-random values in [-1, 1), written as dtype t, in parallel.
void FillRandom(DType t, void* dst, size_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (long blk = 0; blk < static_cast<long>((n + 4095) / 4096); ++blk) {
    float tmp[4096];
    const size_t i0 = static_cast<size_t>(blk) * 4096;
    const size_t cnt = std::min<size_t>(4096, n - i0);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + i0 + 1;
    for (size_t i = 0; i < cnt; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      tmp[i] = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
    }
    kernels::ConvertFromF32(t, tmp, static_cast<char*>(dst) + i0 * kernels::DTypeSize(t), cnt);
  }
}

// Host read bandwidth: a parallel sum over 512 MiB (far larger than the caches), timed like the
// kernels (median of repeated calls), so contention on a shared machine affects both alike.
struct Timing {
  double wall_us = -1;  // median wall time of one call
  double cpu_us = -1;   // median process CPU time of one call divided by the CPU threads: what the
                        // call costs without contention from other processes (CPU backend only)
};
template <typename Fn, typename Before>
Timing MedianMicros(Backend backend, Fn fn, Before before, int min_iters, double min_seconds);

// Sum of n floats with independent vector accumulators per thread (a plain `omp simd` reduction
// compiles to a latency-bound chain here and reads at a fraction of the memory bandwidth).
float ParallelSum(const float* x, size_t n) {
  float total = 0;
#pragma omp parallel num_threads(kernels::CpuThreads()) reduction(+ : total)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t per = (n / nt + 63) / 64 * 64;
    const size_t b = std::min(n, per * t), e = std::min(n, b + per);
    float acc[64] = {};
    size_t i = b;
    for (; i + 64 <= e; i += 64) {
#pragma omp simd
      for (int j = 0; j < 64; ++j) acc[j] += x[i + j];
    }
    for (; i < e; ++i) acc[0] += x[i];
    for (float a : acc) total += a;
  }
  return total;
}

// Returns the wall-time bandwidth; *cpu_gbps the CPU-time one (see Timing).
double MeasureHostReadGBps(double* cpu_gbps) {
  const size_t n = (size_t{512} << 20) / sizeof(float);
  std::vector<float> buf(n);
#pragma omp parallel for schedule(static) num_threads(kernels::CpuThreads())
  for (long i = 0; i < static_cast<long>(n); ++i) buf[i] = static_cast<float>(i & 1023);
  volatile float sink = 0;
  const Timing t = MedianMicros(
      Backend::kCpu,
      [&] {
        sink = sink + ParallelSum(buf.data(), n);
        return Status::Ok();
      },
      [] {}, 5, 1.0);
  *cpu_gbps = n * sizeof(float) / t.cpu_us / 1e3;
  return n * sizeof(float) / t.wall_us / 1e3;
}

// Device bandwidth: a device-to-device copy (counted as read + write).
double MeasureDeviceGBps(size_t bytes) {
  auto a = DeviceBuffer::Allocate(Backend::kCuda, bytes);
  auto b = DeviceBuffer::Allocate(Backend::kCuda, bytes);
  if (!a.ok() || !b.ok()) return 0;
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = Clock::now();
    if (!b->CopyFrom(*a, bytes).ok()) return 0;
    const double s = Seconds(t0, Clock::now());
    if (pass > 0) best = std::max(best, 2.0 * bytes / s / 1e9);
  }
  return best;
}

// Evicts the CPU caches (untimed) so every timed call reads from memory.
struct CacheFlusher {
  std::vector<float> junk = std::vector<float>(16u << 20, 1.f);  // 64 MiB
  volatile float sink = 0;
  void operator()() {
    float s = 0;
#pragma omp parallel for simd reduction(+ : s) num_threads(kernels::CpuThreads())
    for (long i = 0; i < static_cast<long>(junk.size()); i += 16) s += junk[i];
    sink = sink + s;
  }
};

// Median wall time (µs) of fn() over at least min_iters calls and min_seconds, each preceded by
// `before` (untimed) and followed by a backend synchronize (timed).
template <typename Fn, typename Before>
Timing MedianMicros(Backend backend, Fn fn, Before before, int min_iters, double min_seconds) {
  std::vector<double> wall, cpu;
  Timing r;
  if (!fn().ok()) return r;  // warm-up
  (void)kernels::Synchronize(backend);
  const int threads = backend == Backend::kCpu ? kernels::CpuThreads() : 1;
  const auto start = Clock::now();
  while (static_cast<int>(wall.size()) < min_iters || Seconds(start, Clock::now()) < min_seconds) {
    before();
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    if (!fn().ok()) return r;
    if (!kernels::Synchronize(backend).ok()) return r;
    wall.push_back(Seconds(t0, Clock::now()) * 1e6);
    cpu.push_back((ProcessCpuSeconds() - c0) * 1e6 / threads);
    if (wall.size() > 10000) break;
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  r.wall_us = wall[wall.size() / 2];
  r.cpu_us = std::max(cpu[cpu.size() / 2], 1.0);
  return r;
}

// Uploads a host vector to the backend (host memory stays where it is on the CPU backend).
template <typename T>
StatusOr<DeviceBuffer> ToBackend(Backend b, const T* data, size_t bytes) {
  ICE_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Allocate(b, bytes));
  ICE_RETURN_IF_ERROR(buf.CopyFromHost(data, bytes));
  return buf;
}

struct PageLists {
  std::vector<int32_t> indptr = {0}, ids, valid;
  size_t slots = 0;
};

int Fail(const Status& s) {
  std::fprintf(stderr, "icecache-bench: %s\n", s.ToString().c_str());
  return 1;
}

// ------------------------------------------------------------------------------------------------

int RunAttention(int argc, char** argv) {
  long context = 32768;
  int budget = 16, page_size = 16, batch = 1, threads = 0;
  int hq = 32, hkv = 8, d = 128;  // Llama-3.1-8B; --heads Q/KV --head-dim D for other models
  DType dtype = DType::kBF16;
  Backend backend = Backend::kCpu;
  bool json = false, check_args = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "attention: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--context") context = std::atol(next().c_str());
    else if (a == "--budget-pages") budget = std::atoi(next().c_str());
    else if (a == "--page-size") page_size = std::atoi(next().c_str());
    else if (a == "--batch") batch = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--json") json = true;
    else if (a == "--check-args") check_args = true;
    else if (a == "--head-dim") d = std::atoi(next().c_str());
    else if (a == "--heads") {
      const std::string v = next();
      if (std::sscanf(v.c_str(), "%d/%d", &hq, &hkv) != 2) return std::fprintf(stderr, "attention: --heads Q/KV, e.g. 28/4\n"), 2;
    } else if (a == "--dtype") {
      if (auto t = kernels::ParseDType(next()); t.ok()) dtype = *t; else return std::fprintf(stderr, "attention: --dtype bf16|f16|f32\n"), 2;
    } else if (a == "--backend") {
      if (!ParseBackend(next(), &backend)) return std::fprintf(stderr, "attention: --backend cpu|cuda|auto\n"), 2;
    } else {
      std::fprintf(stderr,
                   "usage: icecache-bench attention --context N --budget-pages B --page-size P "
                   "[--batch 1] [--dtype bf16|f16|f32] [--heads 32/8] [--head-dim 128] [--backend cpu|cuda] [--threads T] [--json]\n"
                   "  [--check-args: parse and check the options, then exit 0 without touching a device]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (context <= 0 || budget < 4 || page_size <= 0 || batch <= 0) {
    std::fprintf(stderr, "attention: need context > 0, budget-pages >= 4, page-size > 0, batch > 0\n");
    return 2;
  }
  if (hkv <= 0 || hq <= 0 || hq % hkv != 0 || d <= 0) {
    std::fprintf(stderr, "attention: --heads Q/KV needs Q a positive multiple of KV, --head-dim > 0\n");
    return 2;
  }
  if (check_args) return std::printf("attention: options ok\n"), 0;
  if (threads > 0) kernels::SetCpuThreads(threads);
  backend = kernels::ResolveBackend(backend);
  if (auto probe = DeviceBuffer::Allocate(backend, 64); !probe.ok()) return Fail(probe.status());  // before GiBs of host data
  const int pages_per_list = static_cast<int>((context + page_size - 1) / page_size);
  const int lists = batch * hkv;
  const size_t pool_pages = static_cast<size_t>(lists) * pages_per_list;
  const size_t page_bytes = 2ull * page_size * d * kernels::DTypeSize(dtype);
  const int last_valid = static_cast<int>(context - static_cast<long>(pages_per_list - 1) * page_size);

  // Host pool with pages of one list scattered over the pool, as a page allocator leaves them.
  std::vector<char> host_pool(pool_pages * page_bytes);
  FillRandom(dtype, host_pool.data(), pool_pages * page_bytes / kernels::DTypeSize(dtype), 1);
  std::vector<int32_t> perm(pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(42);
  std::shuffle(perm.begin(), perm.end(), rng);

  PageLists dense, sparse;
  for (int l = 0; l < lists; ++l) {
    auto page_of = [&](int i) { return perm[static_cast<size_t>(l) * pages_per_list + i]; };
    auto valid_of = [&](int i) { return i == pages_per_list - 1 ? last_valid : page_size; };
    for (int i = 0; i < pages_per_list; ++i) {
      dense.ids.push_back(page_of(i));
      dense.valid.push_back(valid_of(i));
      dense.slots += valid_of(i);
    }
    dense.indptr.push_back(static_cast<int32_t>(dense.ids.size()));
    std::vector<int> chosen;
    if (budget >= pages_per_list) {
      chosen.resize(pages_per_list);
      std::iota(chosen.begin(), chosen.end(), 0);
    } else {
      chosen = {0, 1, pages_per_list - 2, pages_per_list - 1};  // sink and window
      std::vector<int> middle(pages_per_list - 4);
      std::iota(middle.begin(), middle.end(), 2);
      std::shuffle(middle.begin(), middle.end(), rng);
      chosen.insert(chosen.end(), middle.begin(), middle.begin() + (budget - 4));
    }
    for (int i : chosen) {
      sparse.ids.push_back(page_of(i));
      sparse.valid.push_back(valid_of(i));
      sparse.slots += valid_of(i);
    }
    sparse.indptr.push_back(static_cast<int32_t>(sparse.ids.size()));
  }

  std::vector<float> q(static_cast<size_t>(batch) * hq * d);
  FillRandom(DType::kF32, q.data(), q.size(), 2);
  auto pool = ToBackend(backend, host_pool.data(), host_pool.size());
  if (!pool.ok()) return Fail(pool.status());
  if (backend == Backend::kCuda) {
    host_pool.clear();
    host_pool.shrink_to_fit();
  }
  auto dq = ToBackend(backend, q.data(), q.size() * sizeof(float));
  auto dout = DeviceBuffer::Allocate(backend, q.size() * sizeof(float));
  if (!dq.ok() || !dout.ok()) return Fail(!dq.ok() ? dq.status() : dout.status());

  auto run_lists = [&](const PageLists& pl) -> Timing {
    auto indptr = ToBackend(backend, pl.indptr.data(), pl.indptr.size() * 4);
    auto ids = ToBackend(backend, pl.ids.data(), pl.ids.size() * 4);
    auto valid = ToBackend(backend, pl.valid.data(), pl.valid.size() * 4);
    if (!indptr.ok() || !ids.ok() || !valid.ok()) return Timing{};
    kernels::PagedDecodeAttentionParams p;
    p.q = dq->as<float>();
    p.pages = pool->data();
    p.kv_dtype = dtype;
    p.page_indptr = indptr->as<int32_t>();
    p.page_ids = ids->as<int32_t>();
    p.page_valid = valid->as<int32_t>();
    p.out = dout->as<float>();
    p.batch = batch;
    p.num_q_heads = hq;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.page_size = page_size;
    p.scale = 1.f / std::sqrt(static_cast<float>(d));
    CacheFlusher flush;
    auto before = [&] {
      if (backend == Backend::kCpu) flush();
    };
    return MedianMicros(backend, [&] { return kernels::PagedDecodeAttention(p, backend); }, before, 10, 1.0);
  };
  const Timing dense_t = run_lists(dense);
  const Timing sparse_t = run_lists(sparse);
  if (dense_t.wall_us < 0 || sparse_t.wall_us < 0) return Fail(InternalError("PagedDecodeAttention failed"));
  const double dense_us = dense_t.wall_us, sparse_us = sparse_t.wall_us;
  const bool cpu = backend == Backend::kCpu;

  const size_t elem = kernels::DTypeSize(dtype);
  const double dense_bytes = static_cast<double>(dense.slots) * 2 * d * elem;
  const double sparse_bytes = static_cast<double>(sparse.slots) * 2 * d * elem;
  const double dense_gbps = dense_bytes / dense_us / 1e3;
  double bw_cpu = 0;
  const double bw = cpu ? MeasureHostReadGBps(&bw_cpu) : MeasureDeviceGBps(size_t{2} << 30);
  nlohmann::json r = {
      {"workload", "attention"},
      {"backend", std::string(kernels::BackendName(backend))},
      {"threads", backend == Backend::kCpu ? kernels::CpuThreads() : 0},
      {"dtype", std::string(kernels::DTypeName(dtype))},
      {"context", context},
      {"page_size", page_size},
      {"budget_pages", budget},
      {"batch", batch},
      {"heads", std::to_string(hq) + "q/" + std::to_string(hkv) + "kv/d" + std::to_string(d)},
      {"dense_pages_per_head", pages_per_list},
      {"dense_us", dense_us},
      {"sparse_us", sparse_us},
      {"speedup", dense_us / sparse_us},
      {"dense_bytes_read", dense_bytes},
      {"sparse_bytes_read", sparse_bytes},
      {"dense_gbps", dense_gbps},
      {"sparse_gbps", sparse_bytes / sparse_us / 1e3},
      {"measured_bandwidth_gbps", bw},
      {"bandwidth_method", backend == Backend::kCuda ? "device-to-device copy (read+write)"
                                                     : "parallel read of 512 MiB (sum), median"},
      {"dense_bandwidth_fraction", bw > 0 ? dense_gbps / bw : 0.0},
  };
  if (cpu) {
    // The same figures from CPU time (see Timing): robust against other processes on the machine.
    const double dense_gbps_cpu = dense_bytes / dense_t.cpu_us / 1e3;
    r["dense_cpu_us"] = dense_t.cpu_us;
    r["sparse_cpu_us"] = sparse_t.cpu_us;
    r["speedup_cpu"] = dense_t.cpu_us / sparse_t.cpu_us;
    r["dense_gbps_cpu"] = dense_gbps_cpu;
    r["measured_bandwidth_gbps_cpu"] = bw_cpu;
    r["dense_bandwidth_fraction_cpu"] = bw_cpu > 0 ? dense_gbps_cpu / bw_cpu : 0.0;
  }
  if (json) {
    std::printf("%s\n", r.dump().c_str());
  } else {
    std::printf("attention decode step, Llama-3.1-8B heads (32q/8kv/128), %s KV, backend %s",
                std::string(kernels::DTypeName(dtype)).c_str(), std::string(kernels::BackendName(backend)).c_str());
    if (backend == Backend::kCpu) std::printf(" (%d threads)", kernels::CpuThreads());
    std::printf("\ncontext %ld tokens, page size %d, batch %d: dense %d pages/head, sparse %d pages/head\n",
                context, page_size, batch, pages_per_list, std::min(budget, pages_per_list));
    std::printf("  dense_us   %10.1f   (%.1f MB read, %.2f GB/s)\n", dense_us, dense_bytes / 1e6, dense_gbps);
    std::printf("  sparse_us  %10.1f   (%.2f MB read)\n", sparse_us, sparse_bytes / 1e6);
    std::printf("  speedup    %10.2fx\n", dense_us / sparse_us);
    std::printf("  measured bandwidth %.2f GB/s; dense reaches %.0f%% of it\n", bw,
                bw > 0 ? 100 * dense_gbps / bw : 0.0);
    if (cpu) {
      std::printf("  by CPU time: dense %.1f us, sparse %.1f us, speedup %.2fx, dense %.2f GB/s = %.0f%% of %.2f GB/s\n",
                  dense_t.cpu_us, sparse_t.cpu_us, dense_t.cpu_us / sparse_t.cpu_us,
                  r["dense_gbps_cpu"].get<double>(), 100 * r["dense_bandwidth_fraction_cpu"].get<double>(), bw_cpu);
    }
  }
  return 0;
}

// ------------------------------------------------------------------------------------------------

int RunGemv(int argc, char** argv) {
  int n = 14336, k = 4096, m = 1, threads = 0;
  DType dtype = DType::kBF16;
  Backend backend = Backend::kCpu;
  bool json = false, check_args = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gemv: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--n") n = std::atoi(next().c_str());
    else if (a == "--k") k = std::atoi(next().c_str());
    else if (a == "--m") m = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--json") json = true;
    else if (a == "--check-args") check_args = true;
    else if (a == "--dtype") {
      if (auto t = kernels::ParseWeightDType(next()); t.ok()) dtype = *t; else return std::fprintf(stderr, "gemv: %s\n", t.status().message().c_str()), 2;
    } else if (a == "--backend") {
      if (!ParseBackend(next(), &backend)) return std::fprintf(stderr, "gemv: --backend cpu|cuda|auto\n"), 2;
    } else {
      std::fprintf(stderr, "usage: icecache-bench gemv [--n 14336] [--k 4096] [--m 1] "
                           "[--dtype bf16|f16|f32|q8_0|q4_0|q4_1] [--backend cpu|cuda] [--threads T] [--json] [--check-args]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (n <= 0 || k <= 0 || m <= 0) return std::fprintf(stderr, "gemv: sizes must be positive\n"), 2;
  if (kernels::IsBlockQuantized(dtype) && k % kernels::kQuantBlockValues != 0) {
    return std::fprintf(stderr, "gemv: %s weights need k a multiple of 32\n", std::string(kernels::DTypeName(dtype)).c_str()), 2;
  }
  if (check_args) return std::printf("gemv: options ok\n"), 0;
  if (threads > 0) kernels::SetCpuThreads(threads);
  backend = kernels::ResolveBackend(backend);
  if (auto probe = DeviceBuffer::Allocate(backend, 64); !probe.ok()) return Fail(probe.status());
  const size_t welems = static_cast<size_t>(n) * k;
  std::vector<char> w(kernels::DTypeBytes(dtype, welems));
  if (kernels::IsBlockQuantized(dtype)) {
    std::vector<float> wf(welems);
    FillRandom(DType::kF32, wf.data(), welems, 3);
    kernels::ConvertFromF32(dtype, wf.data(), w.data(), welems);
  } else {
    FillRandom(dtype, w.data(), welems, 3);
  }
  std::vector<float> x(static_cast<size_t>(m) * k), y(static_cast<size_t>(m) * n);
  FillRandom(DType::kF32, x.data(), x.size(), 4);
  auto dw = ToBackend(backend, w.data(), w.size());
  auto dx = ToBackend(backend, x.data(), x.size() * sizeof(float));
  auto dy = DeviceBuffer::Allocate(backend, y.size() * sizeof(float));
  if (!dw.ok() || !dx.ok() || !dy.ok()) return Fail(InternalError("allocation failed"));
  kernels::MatmulParams p;
  p.x = dx->as<float>();
  p.w = dw->data();
  p.w_dtype = dtype;
  p.y = dy->as<float>();
  p.m = m;
  p.n = n;
  p.k = k;
  if (kernels::IsBlockQuantized(dtype)) p.quant_activations = kernels::BlockActivations();  // as a Linear layer sets it
  CacheFlusher flush;
  auto before = [&] {
    if (backend == Backend::kCpu) flush();
  };
  const Timing ours = MedianMicros(backend, [&] { return kernels::Matmul(p, backend); }, before, 10, 1.0);
  if (ours.wall_us < 0) return Fail(InternalError("Matmul failed"));
  const double ours_us = ours.wall_us;
  // The same call with bf16-rounded activations (MatmulParams::bf16_activations), in the same
  // run: its speed-up over fp32 activations and how far its outputs move (largest difference
  // relative to the largest |y|).
  Timing bf16x, bf16x_no_amx;
  double bf16x_rel_diff = 0;
  if (backend == Backend::kCpu && dtype == DType::kBF16 && m > 1) {
    std::vector<float> y32(y.size()), ybf(y.size());
    if (!kernels::Matmul(p, backend).ok()) return Fail(InternalError("Matmul failed"));
    std::memcpy(y32.data(), p.y, y.size() * sizeof(float));
    kernels::MatmulParams pb = p;
    pb.bf16_activations = true;
    bf16x = MedianMicros(backend, [&] { return kernels::Matmul(pb, backend); }, before, 10, 1.0);
    std::memcpy(ybf.data(), pb.y, y.size() * sizeof(float));
    // Where AMX serves the bf16 GEMM, the same call on the vdpbf16ps tiles too.
    if (kernels::AmxActive() && m > 16) {
      (void)kernels::SetAmxActive(false);
      bf16x_no_amx = MedianMicros(backend, [&] { return kernels::Matmul(pb, backend); }, before, 10, 1.0);
      (void)kernels::SetAmxActive(true);
    }
    double diff = 0, scale = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(y32[i] - ybf[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(y32[i])));
    }
    bf16x_rel_diff = scale > 0 ? diff / scale : 0;
  }

  // Block-quantised weights: the same weights dequantised to bf16 through the bf16 path, in the
  // same run (what icecache served before it kept GGUF blocks), and how far the outputs are from
  // the exact products of the stored weights (fp64; largest difference relative to the largest |y|).
  Timing as_bf16;
  double quant_rel_err = 0, mode_t_us[3] = {0, 0, 0}, mode_err[3] = {0, 0, 0};
  static const char* const kModeNames[3] = {"fp32", "int16", "int8"};
  if (backend == Backend::kCpu && kernels::IsBlockQuantized(dtype)) {
    std::vector<float> wf(welems);
    kernels::ConvertToF32(dtype, w.data(), wf.data(), welems);
    std::vector<uint16_t> wb(welems);
    kernels::ConvertFromF32(DType::kBF16, wf.data(), wb.data(), welems);
    // The exact products once (fp64), then each output's largest difference relative to max |y|.
    std::vector<double> exact(static_cast<size_t>(m) * n);
    double scale = 0;
    for (int r = 0; r < m; ++r) {
      for (int j = 0; j < n; ++j) {
        double e = 0;
        for (int i = 0; i < k; ++i) e += static_cast<double>(x[static_cast<size_t>(r) * k + i]) * wf[static_cast<size_t>(j) * k + i];
        exact[static_cast<size_t>(r) * n + j] = e;
        scale = std::max(scale, std::fabs(e));
      }
    }
    auto rel_err = [&](const float* y) {
      double d = 0;
      for (size_t i = 0; i < exact.size(); ++i) d = std::max(d, std::fabs(exact[i] - y[i]));
      return scale > 0 ? d / scale : 0.0;
    };
    if (!kernels::Matmul(p, backend).ok()) return Fail(InternalError("Matmul failed"));
    quant_rel_err = rel_err(p.y);
    // Each activation mode of the same call, its time and its error (the serving one is `ours`).
    for (int mode = 0; mode < 3; ++mode) {
      kernels::MatmulParams pm = p;
      pm.quant_activations = static_cast<kernels::QuantActivations>(mode);
      mode_t_us[mode] = MedianMicros(backend, [&] { return kernels::Matmul(pm, backend); }, before, 10, 1.0).wall_us;
      mode_err[mode] = rel_err(pm.y);
    }
    kernels::MatmulParams pb = p;
    pb.w = wb.data();
    pb.w_dtype = DType::kBF16;
    pb.bf16_activations = kernels::UseBf16Activations();
    as_bf16 = MedianMicros(backend, [&] { return kernels::Matmul(pb, backend); }, before, 10, 1.0);
  }

  Timing blas;
  if (backend == Backend::kCpu && OpenBlasAvailable()) {
    std::vector<float> wf(welems);
    kernels::ConvertToF32(dtype, w.data(), wf.data(), welems);
    std::vector<float> yb(y.size());
    blas = MedianMicros(
        Backend::kCpu,
        [&] { return OpenBlasMatmulF32(x.data(), wf.data(), yb.data(), m, n, k, kernels::CpuThreads()); },
        before, 10, 1.0);
  }
  const double blas_us = blas.wall_us;
  const double wbytes = static_cast<double>(w.size());
  const double gbps = wbytes / ours_us / 1e3;
  const double gflops = 2.0 * m * n * static_cast<double>(k) / ours_us / 1e3;
  double bw_cpu = 0;
  const double bw = backend == Backend::kCpu ? MeasureHostReadGBps(&bw_cpu) : MeasureDeviceGBps(size_t{2} << 30);
  nlohmann::json r = {
      {"workload", "gemv"},
      {"backend", std::string(kernels::BackendName(backend))},
      {"threads", backend == Backend::kCpu ? kernels::CpuThreads() : 0},
      {"dtype", std::string(kernels::DTypeName(dtype))},
      {"m", m}, {"n", n}, {"k", k},
      {"ours_us", ours_us},
      {"ours_weight_gbps", gbps},
      {"ours_gflops", gflops},
      {"measured_bandwidth_gbps", bw},
      {"bandwidth_fraction", bw > 0 ? gbps / bw : 0.0},
      {"openblas_f32_us", blas_us},
      {"openblas_f32_gflops", blas_us > 0 ? 2.0 * m * n * static_cast<double>(k) / blas_us / 1e3 : 0.0},
      {"speedup_vs_openblas", blas_us > 0 ? blas_us / ours_us : 0.0},
      {"bf16_activations_us", bf16x.wall_us > 0 ? bf16x.wall_us : 0.0},
      {"bf16_activations_speedup", bf16x.wall_us > 0 ? ours_us / bf16x.wall_us : 0.0},
      {"bf16_activations_max_rel_diff", bf16x_rel_diff},
      {"bf16_activations_amx", bf16x.wall_us > 0 && kernels::AmxActive() && m > 16},
      {"bf16_activations_no_amx_us", bf16x_no_amx.wall_us > 0 ? bf16x_no_amx.wall_us : 0.0},
      {"same_weights_bf16_us", as_bf16.wall_us > 0 ? as_bf16.wall_us : 0.0},
      {"speedup_vs_bf16", as_bf16.wall_us > 0 ? as_bf16.wall_us / ours_us : 0.0},
      {"max_rel_err_vs_exact", quant_rel_err},
      {"quant_activations", kernels::IsBlockQuantized(dtype) ? kModeNames[static_cast<int>(p.quant_activations)] : ""},
      {"fp32_activations_us", mode_t_us[0]}, {"fp32_activations_max_rel_err", mode_err[0]},
      {"int16_activations_us", mode_t_us[1]}, {"int16_activations_max_rel_err", mode_err[1]},
      {"int8_activations_us", mode_t_us[2]}, {"int8_activations_max_rel_err", mode_err[2]},
  };
  if (backend == Backend::kCpu) {
    r["ours_cpu_us"] = ours.cpu_us;
    r["ours_weight_gbps_cpu"] = wbytes / ours.cpu_us / 1e3;
    r["measured_bandwidth_gbps_cpu"] = bw_cpu;
    r["bandwidth_fraction_cpu"] = bw_cpu > 0 ? wbytes / ours.cpu_us / 1e3 / bw_cpu : 0.0;
    r["openblas_f32_cpu_us"] = blas.cpu_us;
    r["speedup_vs_openblas_cpu"] = blas.cpu_us > 0 ? blas.cpu_us / ours.cpu_us : 0.0;
    r["speedup_vs_bf16_cpu"] = as_bf16.cpu_us > 0 ? as_bf16.cpu_us / ours.cpu_us : 0.0;
  }
  if (json) {
    std::printf("%s\n", r.dump().c_str());
  } else {
    std::printf("matmul m=%d n=%d k=%d, %s weights%s%s, backend %s", m, n, k,
                std::string(kernels::DTypeName(dtype)).c_str(), kernels::IsBlockQuantized(dtype) ? " with activations " : "",
                kernels::IsBlockQuantized(dtype) ? kModeNames[static_cast<int>(p.quant_activations)] : "",
                std::string(kernels::BackendName(backend)).c_str());
    if (backend == Backend::kCpu) std::printf(" (%d threads)", kernels::CpuThreads());
    std::printf("\n  ours       %10.1f us  %7.2f GB/s of weights  %8.1f GFLOP/s\n", ours_us, gbps, gflops);
    if (blas_us > 0) {
      std::printf("  openblas   %10.1f us  (fp32 weights converted beforehand)  %8.1f GFLOP/s\n", blas_us,
                  2.0 * m * n * static_cast<double>(k) / blas_us / 1e3);
      std::printf("  ours vs openblas: %.2fx\n", blas_us / ours_us);
    }
    if (bf16x.wall_us > 0) {
      std::printf("  bf16 activations %4.1f us  %8.1f GFLOP/s  %.2fx fp32 activations (CPU time %.2fx); "
                  "max |diff| / max |y| %.2g\n",
                  bf16x.wall_us, 2.0 * m * n * static_cast<double>(k) / bf16x.wall_us / 1e3,
                  ours_us / bf16x.wall_us, bf16x.cpu_us > 0 ? ours.cpu_us / bf16x.cpu_us : 0.0, bf16x_rel_diff);
      if (bf16x_no_amx.wall_us > 0) {
        std::printf("    of which AMX tiles; on vdpbf16ps instead %.1f us (AMX %.2fx of it)\n", bf16x_no_amx.wall_us,
                    bf16x_no_amx.wall_us / bf16x.wall_us);
      }
    }
    if (as_bf16.wall_us > 0) {
      std::printf("  the same weights as bf16 %.1f us: %s %.2fx faster (CPU time %.2fx); max |y - exact| / max |y| %.2g\n"
                  "  each activation mode of the same call:\n",
                  as_bf16.wall_us, std::string(kernels::DTypeName(dtype)).c_str(), as_bf16.wall_us / ours_us,
                  as_bf16.cpu_us / ours.cpu_us, quant_rel_err);
      for (int mode = 0; mode < 3; ++mode) {
        std::printf("  %-5s activations %8.1f us (%.2fx bf16); max |y - exact| / max |y| %.2g\n", kModeNames[mode],
                    mode_t_us[mode], as_bf16.wall_us / mode_t_us[mode], mode_err[mode]);
      }
    }
    std::printf("  measured bandwidth %.2f GB/s; weights stream at %.0f%% of it\n", bw,
                bw > 0 ? 100 * gbps / bw : 0.0);
    if (backend == Backend::kCpu) {
      std::printf("  by CPU time: ours %.1f us (%.2f GB/s = %.0f%% of %.2f GB/s), openblas %.1f us, ours vs openblas %.2fx\n",
                  ours.cpu_us, r["ours_weight_gbps_cpu"].get<double>(),
                  100 * r["bandwidth_fraction_cpu"].get<double>(), bw_cpu, blas.cpu_us,
                  r["speedup_vs_openblas_cpu"].get<double>());
    }
  }
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("attention", "paged decode attention: dense vs sparse pages, Llama-3.1-8B heads", RunAttention);
ICE_BENCH_WORKLOAD("gemv", "Matmul/GEMV on bf16/f16/f32 weights vs OpenBLAS and memory bandwidth", RunGemv);

}  // namespace icecache::bench
