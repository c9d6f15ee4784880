// CaptureBackend: the prefill worker's attention backend. Dense prefill attention that keeps
// every layer's K/V in fp32 (what SequenceCache::BuildLayers consumes) and tells a listener when
// a layer's K/V of a sequence is complete, so that the layer's trees can be built while the
// forward pass computes the next layers.
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

  explicit CaptureBackend(const model::AttentionShape& shape, LayerListener listener = nullptr)
      : shape_(shape), listener_(std::move(listener)) {}

  const model::AttentionShape& shape() const override { return shape_; }
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
  LayerListener listener_;
  std::unordered_map<model::SequenceId, Seq> seqs_;
  std::vector<std::pair<model::SequenceId, int>> step_;  // (sequence, tokens) of the current step
};

}  // namespace icecache::prefill
