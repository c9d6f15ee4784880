// CaptureBackend: the prefill worker's attention backend. Dense prefill attention on the model's
// device that copies every layer's K/V to host memory in fp32 (what SequenceCache::BuildLayers
// consumes) and tells a listener when a layer's K/V of a sequence is complete, so that the
// layer's trees can be built on host threads while the forward pass computes the next layers.
// A segment that continues a sequence (chunked prefill) attends over its earlier K/V, uploaded
// from the host copy.
//
// K/V of a sequence live in a shared CapturedKv ([layer] -> [n, num_kv_heads, head_dim] fp32),
// which the listener may hand to other threads: once a layer is reported complete its vector is
// never written again (a failed step with a listener leaves the stored K/V as they are; the
// engine drops the whole batch then).
//
// Not thread-safe (the AttentionBackend contract); the listener runs on the forward pass's thread.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/dtype.h"
#include "model/attention_backend.h"

namespace icecache::prefill {

struct CapturedKv {
  std::vector<std::vector<float>> k, v;  // [layer]
};

class CaptureBackend final : public model::AttentionBackend {
 public:
  // Called after Attend(layer) stored the last of a sequence's `expected_length` tokens for
  // `layer` (see ExpectLength).
  using LayerListener = std::function<void(model::SequenceId id, int layer)>;

  // `device`: the model's device (resolved here). `kv_dtype`: the type the pages are built and
  // shipped in (bf16 KV lets prefill attention use bf16 products: kernels::UseBf16Attention).
  CaptureBackend(const model::AttentionShape& shape, kernels::Device device, LayerListener listener = nullptr,
                 kernels::DType kv_dtype = kernels::DType::kF32)
      : shape_(shape), device_(kernels::ResolveDevice(device)), listener_(std::move(listener)), kv_dtype_(kv_dtype) {}

  const model::AttentionShape& shape() const override { return shape_; }
  kernels::Device device() const override { return device_; }
  Status AddSequence(model::SequenceId id) override;
  Status RemoveSequence(model::SequenceId id) override;
  bool HasSequence(model::SequenceId id) const override { return seqs_.count(id) > 0; }
  StatusOr<int> SequenceLength(model::SequenceId id) const override;
  Status BeginStep(std::span<const model::StepSegment> segments) override;
  Status Attend(int layer, const float* q, const float* k, const float* v, float* out) override;
  void EndStep(bool commit) override;

  // The listener fires for sequence `id` once it holds `tokens` tokens in a layer (0: never).
  Status ExpectLength(model::SequenceId id, int tokens);
  // The sequence's K/V (shared; see the file comment). REQUIRES HasSequence(id).
  std::shared_ptr<CapturedKv> kv(model::SequenceId id) const { return seqs_.at(id).kv; }

 private:
  struct Seq {
    int length = 0;
    int expected = 0;
    std::shared_ptr<CapturedKv> kv;
  };
  model::AttentionShape shape_;
  kernels::Device device_;
  LayerListener listener_;
  kernels::DType kv_dtype_ = kernels::DType::kF32;
  kernels::DeviceBuffer history_k_, history_v_;  // a continued segment's K/V on the device
  std::unordered_map<model::SequenceId, Seq> seqs_;
  std::vector<std::pair<model::SequenceId, int>> step_;  // (sequence, tokens) of the current step
};

}  // namespace icecache::prefill
