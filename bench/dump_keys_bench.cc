// icecache-bench dump-keys: real keys and decode-time queries of a model on a text, for
// `icecache-bench retrieval --keys-file/--queries-file` (scripts/real-key-retrieval.sh runs it per
// layer and head).
//
// The text is tokenized (bos where the tokenizer asks) and cut to --context tokens. Tokens
// [0, N-Q) are prefilled densely; then the last Q tokens are fed one at a time (teacher-forced)
// and each step's queries are recorded. Written to --out DIR, per layer l and kv head g:
//   keys_L{l}_H{g}.npy     [N-Q, head_dim] fp32  post-RoPE keys (after k-norm if any) of the prefix
//   queries_L{l}_H{g}.npy  [Q * group, head_dim] fp32  post-RoPE queries of the group's query heads
//                          (step-major: step s, head j of the group is row s * group + j)
//   meta.json              model shape, N, Q, text
// The queries of decode step s attend to the prefix and to the s tokens fed before them; the
// files hold the prefix only, which is what the retrieval bench indexes (the newest tokens sit in
// the window pages in serving).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/workload.h"
#include "model/dense_kv_cache.h"
#include "model/model.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::bench {
namespace {

constexpr const char* kUsage =
    "usage: icecache-bench dump-keys --model DIR|FILE.gguf --text FILE --out DIR [--context 8192] [--queries 32]\n";

// Forwards to a DenseKvCache and, while `record` is set, keeps every Attend's q.
class RecordingBackend final : public model::AttentionBackend {
 public:
  explicit RecordingBackend(model::DenseKvCache* inner) : inner_(inner), q_(inner->shape().num_layers) {}
  bool record = false;
  const std::vector<float>& q(int layer) const { return q_[layer]; }  // [rows, num_q_heads, head_dim]

  const model::AttentionShape& shape() const override { return inner_->shape(); }
  kernels::Device device() const override { return inner_->device(); }
  Status AddSequence(model::SequenceId id) override { return inner_->AddSequence(id); }
  Status RemoveSequence(model::SequenceId id) override { return inner_->RemoveSequence(id); }
  bool HasSequence(model::SequenceId id) const override { return inner_->HasSequence(id); }
  StatusOr<int> SequenceLength(model::SequenceId id) const override { return inner_->SequenceLength(id); }
  Status BeginStep(std::span<const model::StepSegment> segments) override {
    rows_ = 0;
    for (const auto& s : segments) rows_ += s.num_tokens;
    return inner_->BeginStep(segments);
  }
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    if (record) {
      const auto& sh = inner_->shape();
      q_[layer].insert(q_[layer].end(), q, q + static_cast<size_t>(rows_) * sh.num_q_heads * sh.head_dim);
    }
    return inner_->Attend(layer, q, k, v, out);
  }
  void EndStep(bool commit) override { inner_->EndStep(commit); }

 private:
  model::DenseKvCache* inner_;
  std::vector<std::vector<float>> q_;
  int rows_ = 0;
};

Status WriteNpy(const std::string& path, const std::vector<float>& data, int64_t rows, int cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) return InternalError("cannot write " + path);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&hlen), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!f) return InternalError("short write to " + path);
  return Status::Ok();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "dump-keys: %s\n", s.ToString().c_str());
  return 1;
}

int RunDumpKeys(int argc, char** argv) {
  std::string dir, text_path, out_dir;
  int context = 8192, queries = 32;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const bool has = i + 1 < argc;
    if (f == "--model" && has) dir = argv[++i];
    else if (f == "--text" && has) text_path = argv[++i];
    else if (f == "--out" && has) out_dir = argv[++i];
    else if (f == "--context" && has) context = std::atoi(argv[++i]);
    else if (f == "--queries" && has) queries = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "dump-keys: bad argument '%s'\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (dir.empty() || text_path.empty() || out_dir.empty() || queries < 1 || context <= queries) {
    std::fprintf(stderr, "dump-keys: --model, --text and --out are required; --context must exceed --queries >= 1\n%s",
                 kUsage);
    return 2;
  }
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail(NotFoundError("cannot read " + text_path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto model = model::Model::Load(dir);
  if (!model.ok()) return Fail(model.status());
  model::Model& m = **model;
  if (m.tokenizer() == nullptr) return Fail(FailedPreconditionError(dir + " has no tokenizer"));
  auto ids = m.tokenizer()->Encode(ss.str(), /*add_special_tokens=*/true);
  if (!ids.ok()) return Fail(ids.status());
  if (static_cast<int>(ids->size()) < context)
    return Fail(InvalidArgumentError(text_path + " has " + std::to_string(ids->size()) + " tokens, fewer than --context " +
                                     std::to_string(context)));
  if (context > m.config().max_position)
    return Fail(InvalidArgumentError("--context exceeds the model's max_position_embeddings " +
                                     std::to_string(m.config().max_position)));
  ids->resize(context);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail(InternalError("cannot create " + out_dir + ": " + ec.message()));
  const auto shape = m.attention_shape();
  model::DenseKvCache dense(shape);
  RecordingBackend be(&dense);
  const int64_t n = context - queries;
  std::vector<float> logits;
  Status st = be.AddSequence(0);
  model::SequenceInput prefill{0, std::span<const int32_t>(ids->data(), n)};
  if (st.ok()) st = m.Forward({&prefill, 1}, be, model::LogitsMode::kLastToken, &logits);
  be.record = true;
  for (int64_t t = n; st.ok() && t < context; ++t) {
    model::SequenceInput step{0, std::span<const int32_t>(ids->data() + t, 1)};
    st = m.Forward({&step, 1}, be, model::LogitsMode::kLastToken, &logits);
  }
  if (!st.ok()) return Fail(st);
  const int d = shape.head_dim, nkv = shape.num_kv_heads, nq = shape.num_q_heads, group = nq / nkv;
  const size_t row = static_cast<size_t>(nkv) * d;
  std::vector<float> k(static_cast<size_t>(context) * row), v(k.size()), head_k, head_q;
  for (int l = 0; l < shape.num_layers; ++l) {
    st = dense.ReadLayerKv(0, l, k.data(), v.data());
    if (!st.ok()) return Fail(st);
    const std::vector<float>& q = be.q(l);  // [queries, nq, d]
    for (int g = 0; g < nkv; ++g) {
      head_k.resize(static_cast<size_t>(n) * d);
      for (int64_t t = 0; t < n; ++t)
        std::copy_n(&k[t * row + static_cast<size_t>(g) * d], d, &head_k[static_cast<size_t>(t) * d]);
      head_q.resize(static_cast<size_t>(queries) * group * d);
      for (int s = 0; s < queries; ++s)
        for (int j = 0; j < group; ++j)
          std::copy_n(&q[(static_cast<size_t>(s) * nq + static_cast<size_t>(g) * group + j) * d], d,
                      &head_q[(static_cast<size_t>(s) * group + j) * d]);
      const std::string suffix = "_L" + std::to_string(l) + "_H" + std::to_string(g) + ".npy";
      st = WriteNpy(out_dir + "/keys" + suffix, head_k, n, d);
      if (st.ok()) st = WriteNpy(out_dir + "/queries" + suffix, head_q, static_cast<int64_t>(queries) * group, d);
      if (!st.ok()) return Fail(st);
    }
  }
  nlohmann::json meta = {{"model", dir},           {"text", text_path},       {"context", context},
                         {"prefix_tokens", n},     {"decode_steps", queries}, {"num_layers", shape.num_layers},
                         {"num_kv_heads", nkv},    {"num_q_heads", nq},       {"head_dim", d}};
  std::ofstream(out_dir + "/meta.json") << meta.dump(2) << "\n";
  std::printf("dump-keys: %d layers x %d kv heads: keys [%lld, %d], queries [%d, %d] in %s\n", shape.num_layers, nkv,
              static_cast<long long>(n), d, queries * group, d, out_dir.c_str());
  return 0;
}

}  // namespace

ICE_BENCH_WORKLOAD("dump-keys", "write a model's post-RoPE keys and decode-time queries per (layer, kv head) as .npy",
                   RunDumpKeys);

}  // namespace icecache::bench
