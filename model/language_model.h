// What the generation engine (model/generator.h) needs of a model: its config, device and
// tokenizer, and a forward step that leaves logits in device memory. Implemented by Model (one
// device, model/model.h) and TpGroup (tensor-parallel ranks, model/tensor_parallel.h).
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "kernels/backend.h"
#include "model/attention_backend.h"
#include "model/config.h"

namespace icecache::tokenizer {
class Tokenizer;
}

namespace icecache::model {

enum class LogitsMode {
  kLastToken,  // one row per input sequence: the logits after its last new token
  kAllTokens,  // one row per new token, in input order
};

// New tokens of one sequence for one forward step.
struct SequenceInput {
  SequenceId seq_id = 0;
  std::span<const int32_t> tokens;  // >= 1 token
};

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  // The whole model's config (also for a tensor-parallel rank).
  virtual const ModelConfig& config() const = 0;
  // Where logits() lives (never auto).
  virtual kernels::Device device() const = 0;
  // nullptr when the model has no tokenizer.
  virtual const tokenizer::Tokenizer* tokenizer() const = 0;
  // One forward step over `inputs` with `backend` (see Model::Forward for the contract).
  virtual Status Forward(std::span<const SequenceInput> inputs, AttentionBackend& backend, LogitsMode mode) = 0;
  // The last Forward's logits, [rows, vocab_size] in device() memory; valid until the next Forward.
  virtual const float* logits() const = 0;
};

}  // namespace icecache::model
