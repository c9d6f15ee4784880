#include "prefill_worker/capture_backend.h"

#include "kernels/attention.h"
#include "kernels/matmul.h"

namespace icecache::prefill {

Status CaptureBackend::AddSequence(model::SequenceId id) {
  if (seqs_.count(id)) return AlreadyExistsError("sequence exists");
  Seq s;
  s.kv = std::make_shared<CapturedKv>();
  s.kv->k.resize(shape_.num_layers);
  s.kv->v.resize(shape_.num_layers);
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status CaptureBackend::RemoveSequence(model::SequenceId id) {
  return seqs_.erase(id) ? Status::Ok() : NotFoundError("sequence not found");
}

StatusOr<int> CaptureBackend::SequenceLength(model::SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence not found");
  return it->second.length;
}

Status CaptureBackend::ExpectLength(model::SequenceId id, int tokens) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("sequence not found");
  it->second.expected = tokens;
  return Status::Ok();
}

Status CaptureBackend::BeginStep(std::span<const model::StepSegment> segments) {
  step_.clear();
  for (const auto& seg : segments) {
    if (!seqs_.count(seg.seq_id)) return NotFoundError("sequence not found");
    if (seg.num_tokens < 1) return InvalidArgumentError("empty segment");
    step_.push_back({seg.seq_id, seg.num_tokens});
  }
  return Status::Ok();
}

Status CaptureBackend::Attend(int layer, const float* q, const float* k, const float* v, float* out) {
  const size_t kv_row = static_cast<size_t>(shape_.num_kv_heads) * shape_.head_dim;
  const size_t q_row = static_cast<size_t>(shape_.num_q_heads) * shape_.head_dim;
  size_t row = 0;
  for (auto& [id, n] : step_) {
    Seq& s = seqs_.at(id);
    auto& ks = s.kv->k[layer];
    auto& vs = s.kv->v[layer];
    const size_t before = ks.size();
    const size_t bytes = static_cast<size_t>(n) * kv_row * sizeof(float);
    ks.resize(before + static_cast<size_t>(n) * kv_row);
    vs.resize(ks.size());
    ICE_RETURN_IF_ERROR(kernels::CopyToHost(device_.backend, ks.data() + before, k + row * kv_row, bytes));
    ICE_RETURN_IF_ERROR(kernels::CopyToHost(device_.backend, vs.data() + before, v + row * kv_row, bytes));
    kernels::PrefillAttentionParams p;
    p.q = q + row * q_row;
    if (s.length == 0) {
      p.k = k + row * kv_row;
      p.v = v + row * kv_row;
    } else {
      const size_t all = ks.size() * sizeof(float);
      ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, all, &history_k_));
      ICE_RETURN_IF_ERROR(kernels::DeviceBuffer::Reserve(device_.backend, all, &history_v_));
      ICE_RETURN_IF_ERROR(history_k_.CopyFromHost(ks.data(), all));
      ICE_RETURN_IF_ERROR(history_v_.CopyFromHost(vs.data(), all));
      p.k = history_k_.as<float>();
      p.v = history_v_.as<float>();
    }
    p.out = out + row * q_row;
    p.q_len = n;
    p.kv_len = s.length + n;
    p.num_q_heads = shape_.num_q_heads;
    p.num_kv_heads = shape_.num_kv_heads;
    p.head_dim = shape_.head_dim;
    p.scale = shape_.scale;
    p.bf16 = kernels::UseBf16Attention(kv_dtype_);  // bf16 products on AMX (attention.h)
    ICE_RETURN_IF_ERROR(kernels::PrefillAttention(p, device_.backend));
    if (listener_ && s.expected > 0 && s.length + n == s.expected) listener_(id, layer);
    row += n;
  }
  return Status::Ok();
}

void CaptureBackend::EndStep(bool commit) {
  for (auto& [id, n] : step_) {
    Seq& s = seqs_.at(id);
    if (commit) {
      s.length += n;
    } else if (!listener_) {
      const size_t keep = static_cast<size_t>(s.length) * shape_.num_kv_heads * shape_.head_dim;
      for (auto& k : s.kv->k) k.resize(keep);
      for (auto& v : s.kv->v) v.resize(keep);
    }
  }
  step_.clear();
}

}  // namespace icecache::prefill
