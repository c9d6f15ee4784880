// The attention backend interface: where a sequence's KV cache lives and how attention over it is
// computed. The model's forward pass does everything else (projections, q/k norm, RoPE, MLP);
// a backend stores K/V and computes softmax(q·Kᵀ·scale)·V. Implementations: DenseKvCache
// (model/dense_kv_cache.h, exact dense paged attention) and, in kvstore/decode_worker, the
// IceCache sparse backend.
//
// PROTOCOL of one forward step (the model drives it; a backend may rely on it):
//   1. BeginStep(segments): the batch of this step. Segment i brings segments[i].num_tokens new
//      tokens of sequence segments[i].seq_id, at positions SequenceLength(seq_id) ...
//      SequenceLength(seq_id) + num_tokens - 1. Each sequence appears at most once per step.
//      A prefill is a segment with many tokens; a decode step is many segments with one token.
//      The backend validates (sequences exist, capacity) and reserves space; on error nothing
//      changed and the step does not happen.
//   2. Attend(layer, ...) once for every layer 0 .. num_layers-1, in increasing order. Tokens
//      are laid out segment after segment, in segment order ("step rows", T = sum of num_tokens):
//        q   [T, num_q_heads, head_dim]  post-RoPE (and post q-norm where the model has it)
//        k   [T, num_kv_heads, head_dim] post-RoPE (and post k-norm), keys of the new tokens
//        v   [T, num_kv_heads, head_dim] values of the new tokens
//        out [T, num_q_heads, head_dim]  written by the backend
//      q, k, v and out are memory of the backend's device() (the model's device).
//      The backend stores this layer's new K/V, then computes for every new token i of a
//      sequence causal attention over that sequence's tokens 0 .. position(i) of this layer
//      (earlier steps' tokens and the new tokens up to and including i), GQA-mapped (query head h
//      reads kv head h / (num_q_heads / num_kv_heads)), softmax scale `scale` from the shape.
//      A sparse backend may attend to a subset of the earlier tokens; it must always include
//      the new tokens themselves. q/k/v are only valid during the call.
//   3. EndStep(commit): commit == true makes the new tokens part of the sequences
//      (SequenceLength grows by num_tokens); commit == false (a layer failed) discards them.
//      Every BeginStep that returned OK is followed by exactly one EndStep.
//
// Sequences are identified by a caller-chosen id. AddSequence allocates per-sequence state
// (page tables, trees); RemoveSequence frees it. A backend must not be used by two forward
// steps at once; callers serialise all calls (not thread-safe unless an implementation says so).
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "kernels/backend.h"

namespace icecache::model {

using SequenceId = uint64_t;

struct AttentionShape {
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;  // divides num_q_heads
  int head_dim = 0;
  float scale = 0.f;     // 1 / sqrt(head_dim)
};

struct StepSegment {
  SequenceId seq_id = 0;
  int num_tokens = 0;  // >= 1
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  // The model shape this backend was built for.
  virtual const AttentionShape& shape() const = 0;
  // The device whose memory Attend's pointers are in, resolved (never auto).
  virtual kernels::Device device() const = 0;

  // ALREADY_EXISTS if the id is in use; RESOURCE_EXHAUSTED if no state can be allocated.
  virtual Status AddSequence(SequenceId id) = 0;
  // Frees the sequence's state. NOT_FOUND for an unknown id.
  virtual Status RemoveSequence(SequenceId id) = 0;
  virtual bool HasSequence(SequenceId id) const = 0;
  // Committed tokens of the sequence; NOT_FOUND for an unknown id.
  virtual StatusOr<int> SequenceLength(SequenceId id) const = 0;

  // See PROTOCOL above. NOT_FOUND (unknown sequence), INVALID_ARGUMENT (duplicate id, zero
  // tokens), RESOURCE_EXHAUSTED (no room for the new tokens).
  virtual Status BeginStep(std::span<const StepSegment> segments) = 0;
  virtual Status Attend(int layer, const float* q, const float* k, const float* v, float* out) = 0;
  virtual void EndStep(bool commit) = 0;
};

}  // namespace icecache::model
