// The generation engine: continuous batching of many sequences over one LanguageModel (a Model,
// or a TpGroup of tensor-parallel ranks) and one
// AttentionBackend. The CLI (`icecache generate --model`) and the benches drive it; the decode
// worker (decode_worker/decode_engine.h) and the prefill worker (prefill_worker/prefill_engine.h)
// run step loops of their own.
//
//   Generator gen(model, backend);
//   ICE_ASSIGN_OR_RETURN(SequenceId id, gen.Add(prompt_ids, params));
//   while (!gen.idle()) { std::vector<GenerationEvent> ev; ICE_RETURN_IF_ERROR(gen.Step(&ev)); ... }
//
// Each Step() runs ONE forward pass over: every decoding sequence (its last token), plus pending
// prompts (prefill), within options.max_step_tokens. Each sequence that got logits samples one
// token and yields one event. Sequences may be added or cancelled between steps. A finished
// sequence's backend state is freed at once.
//
// Not thread-safe: one thread drives a Generator (and owns the Model's forward).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/attention_backend.h"
#include "model/finish_rules.h"
#include "model/model.h"
#include "model/sampler.h"

namespace icecache::tokenizer {
class IncrementalDecoder;
}

namespace icecache::model {

struct GenerationEvent {
  SequenceId id = 0;
  int32_t token = -1;       // the token sampled this step
  std::string text_delta;   // text made final by this token (tokenizer present; stop strings cut)
  FinishReason finish = FinishReason::kNone;
  std::optional<TokenLogprobs> logprobs;  // set when the sequence's params.logprobs >= 0
};

struct GeneratorOptions {
  // Most tokens one forward step processes (decode tokens + prompt chunks); 0 = no limit.
  // Prompts longer than the remaining budget are prefilled in chunks over several steps.
  int max_step_tokens = 0;
  SequenceId first_id = 1;  // Add() hands out ids from here upwards, skipping ids in use
};

class Generator {
 public:
  // model and backend are not owned and must outlive the Generator. `tok` (may be nullptr)
  // turns tokens into text deltas and enables stop strings; defaults to model.tokenizer().
  Generator(LanguageModel& model, AttentionBackend& backend, const GeneratorOptions& options = {});
  Generator(LanguageModel& model, AttentionBackend& backend, const tokenizer::Tokenizer* tok, const GeneratorOptions& options);
  ~Generator();

  // Queues a prompt. INVALID_ARGUMENT for an empty prompt, ids outside the vocabulary, bad
  // params, or stop strings without a tokenizer; OUT_OF_RANGE if the prompt does not fit in
  // max_position_embeddings; errors of backend.AddSequence.
  StatusOr<SequenceId> Add(std::vector<int32_t> prompt, const SamplingParams& params);

  // Adopts a sequence whose prompt was already prefilled into the backend elsewhere (e.g. by a
  // prefill worker whose KV pages were shipped here): REQUIRES backend.HasSequence(id) with
  // SequenceLength(id) == prompt.size(), and `first_token` = the token sampled from the prefill's
  // last logits, which must not itself end the request (not a stop id; max_tokens > 1). It counts
  // as generated token 1 and its text as already delivered. Decoding starts at the next Step.
  // The Generator owns the sequence from then on (frees it in the backend when it finishes).
  // FAILED_PRECONDITION when those requirements do not hold; ALREADY_EXISTS for a known id.
  // On error the backend sequence stays as it was and remains the caller's.
  Status AddPrefilled(SequenceId id, std::vector<int32_t> prompt, int32_t first_token, const SamplingParams& params);

  // One forward step; appends one event per sequence that produced a token. On a forward error
  // the sequences of this step are left as they were (the step can be retried or they can be
  // cancelled).
  Status Step(std::vector<GenerationEvent>* events);

  // Drops a sequence (running or queued) and frees its state. NOT_FOUND if unknown.
  Status Cancel(SequenceId id);

  bool idle() const { return seqs_.empty(); }
  size_t num_sequences() const { return seqs_.size(); }
  // Tokens generated so far by a live sequence (NOT_FOUND when unknown or finished).
  StatusOr<std::vector<int32_t>> Generated(SequenceId id) const;

 private:
  struct Seq;
  StatusOr<std::unique_ptr<Seq>> NewSeq(std::vector<int32_t> prompt, const SamplingParams& params);
  Status Finish(SequenceId id);
  void EmitText(Seq& s, int32_t token, GenerationEvent* ev);

  LanguageModel& model_;
  AttentionBackend& backend_;
  const tokenizer::Tokenizer* tok_;
  GeneratorOptions options_;
  SequenceId next_id_;
  std::map<SequenceId, std::unique_ptr<Seq>> seqs_;  // ordered: older sequences first
};

}  // namespace icecache::model
