#include "model/generator.h"

#include <algorithm>
#include <limits>

#include "model/tokenizer/tokenizer.h"

namespace icecache::model {

struct Generator::Seq {
  Seq(const SamplingParams& p, kernels::Device device, TokenStops token_stops)
      : params(p), sampler(p, device), stops(std::move(token_stops)), stop_strings(p.stop_strings) {}
  SamplingParams params;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt + generated
  size_t prompt_len = 0;
  size_t fed = 0;               // tokens already in the backend
  int generated = 0;
  TokenStops stops;             // stop ids, EOS, max_tokens, context (model/finish_rules.h)
  StopStrings stop_strings;     // over the decoded text
  std::unique_ptr<tokenizer::IncrementalDecoder> decoder;
};

Generator::Generator(LanguageModel& model, AttentionBackend& backend, const GeneratorOptions& options)
    : Generator(model, backend, model.tokenizer(), options) {}

Generator::Generator(LanguageModel& model, AttentionBackend& backend, const tokenizer::Tokenizer* tok,
                     const GeneratorOptions& options)
    : model_(model), backend_(backend), tok_(tok), options_(options), next_id_(options.first_id) {}

Generator::~Generator() {
  for (auto& [id, s] : seqs_) backend_.RemoveSequence(id).IgnoreError();
}

StatusOr<std::unique_ptr<Generator::Seq>> Generator::NewSeq(std::vector<int32_t> prompt,
                                                              const SamplingParams& params) {
  const ModelConfig& c = model_.config();
  ICE_RETURN_IF_ERROR(ValidateSamplingParams(params));
  if (prompt.empty()) return InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      return InvalidArgumentError("prompt token id " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
    }
  }
  if (static_cast<int64_t>(prompt.size()) > c.max_position) {
    return OutOfRangeError("the prompt has " + std::to_string(prompt.size()) +
                           " tokens, more than max_position_embeddings " + std::to_string(c.max_position));
  }
  if (!params.stop_strings.empty() && tok_ == nullptr) {
    return InvalidArgumentError("stop strings need a tokenizer, and this model directory has no tokenizer.json");
  }
  std::vector<int32_t> eos = c.eos_ids;
#if ICECACHE_HAVE_TOKENIZER
  if (tok_ != nullptr) {
    const std::vector<int32_t> tok_eos = tok_->eos_ids();  // returned by value
    eos.insert(eos.end(), tok_eos.begin(), tok_eos.end());
  }
#endif
  auto s = std::make_unique<Seq>(params, model_.device(),
                                 TokenStops(params.stop_ids, eos, params.ignore_eos, params.max_tokens, c.max_position));
  s->prompt_len = prompt.size();
  s->tokens = std::move(prompt);
#if ICECACHE_HAVE_TOKENIZER
  if (tok_ != nullptr) s->decoder = std::make_unique<tokenizer::IncrementalDecoder>(*tok_, true);
#endif
  return s;
}

StatusOr<SequenceId> Generator::Add(std::vector<int32_t> prompt, const SamplingParams& params) {
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<Seq> s, NewSeq(std::move(prompt), params));
  while (seqs_.count(next_id_) || backend_.HasSequence(next_id_)) ++next_id_;
  const SequenceId id = next_id_;
  ICE_RETURN_IF_ERROR(backend_.AddSequence(id));
  ++next_id_;
  seqs_.emplace(id, std::move(s));
  return id;
}

Status Generator::AddPrefilled(SequenceId id, std::vector<int32_t> prompt, int32_t first_token,
                               const SamplingParams& params) {
  if (seqs_.count(id)) return AlreadyExistsError("sequence " + std::to_string(id) + " is already generating");
  const size_t prompt_len = prompt.size();
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<Seq> s, NewSeq(std::move(prompt), params));
  auto len = backend_.SequenceLength(id);
  if (!len.ok() || static_cast<size_t>(*len) != prompt_len) {
    return FailedPreconditionError("sequence " + std::to_string(id) + " must already hold the " +
                                   std::to_string(prompt_len) + "-token prompt in the attention backend");
  }
  if (first_token < 0 || first_token >= model_.config().vocab_size) {
    return InvalidArgumentError("first token id " + std::to_string(first_token) + " is outside the vocabulary");
  }
  if (params.max_tokens <= 1 || s->stops.IsStop(first_token)) {
    return FailedPreconditionError("the first token already ends this request; there is nothing to decode");
  }
  if (static_cast<int64_t>(prompt_len) + 1 > model_.config().max_position) {
    return OutOfRangeError("no room to decode after a " + std::to_string(prompt_len) + "-token prompt");
  }
  s->fed = prompt_len;
  s->tokens.push_back(first_token);
  s->generated = 1;
  GenerationEvent ignored;
  EmitText(*s, first_token, &ignored);
  if (ignored.finish != FinishReason::kNone) {
    return FailedPreconditionError("the first token already completes a stop string; there is nothing to decode");
  }
  s->stop_strings.Flush();  // the caller has the first token's text already
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status Generator::Cancel(SequenceId id) {
  if (!seqs_.count(id)) return NotFoundError("no sequence " + std::to_string(id));
  return Finish(id);
}

Status Generator::Finish(SequenceId id) {
  seqs_.erase(id);
  return backend_.RemoveSequence(id);
}

StatusOr<std::vector<int32_t>> Generator::Generated(SequenceId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return NotFoundError("no sequence " + std::to_string(id));
  const Seq& s = *it->second;
  return std::vector<int32_t>(s.tokens.begin() + static_cast<std::ptrdiff_t>(s.prompt_len), s.tokens.end());
}

void Generator::EmitText(Seq& s, int32_t token, GenerationEvent* ev) {
#if ICECACHE_HAVE_TOKENIZER
  if (!s.decoder) return;
  auto delta = s.decoder->Push(token);
  std::string piece = delta.ok() ? *delta : std::string();
  if (ev->finish != FinishReason::kNone) piece += s.decoder->Flush();
  ev->text_delta = s.stop_strings.Push(piece);
  if (s.stop_strings.stopped()) {
    ev->finish = FinishReason::kStop;
  } else if (ev->finish != FinishReason::kNone) {
    ev->text_delta += s.stop_strings.Flush();
  }
#endif
}

Status Generator::Step(std::vector<GenerationEvent>* events) {
  if (seqs_.empty()) return Status::Ok();
  int budget = options_.max_step_tokens > 0 ? options_.max_step_tokens : std::numeric_limits<int>::max();
  std::vector<SequenceInput> inputs;
  std::vector<Seq*> order;
  std::vector<SequenceId> ids;
  // Decoding sequences first (one token each), then prompt chunks.
  for (int pass = 0; pass < 2 && budget > 0; ++pass) {
    for (auto& [id, sp] : seqs_) {
      Seq& s = *sp;
      const size_t pending = s.tokens.size() - s.fed;
      const bool decoding = s.fed >= s.prompt_len;
      if (pending == 0 || decoding != (pass == 0) || budget <= 0) continue;
      const size_t n = std::min<size_t>(pending, static_cast<size_t>(budget));
      inputs.push_back({id, std::span<const int32_t>(s.tokens.data() + s.fed, n)});
      order.push_back(&s);
      ids.push_back(id);
      budget -= static_cast<int>(n);
    }
  }
  if (inputs.empty()) return Status::Ok();
  ICE_RETURN_IF_ERROR(model_.Forward(inputs, backend_, LogitsMode::kLastToken));
  const int vocab = model_.config().vocab_size;
  std::vector<SequenceId> finished;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Seq& s = *order[i];
    s.fed += inputs[i].tokens.size();
    if (s.fed < s.tokens.size()) continue;  // prompt chunk: more to feed before sampling
    std::span<const float> row(model_.logits() + i * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    ICE_ASSIGN_OR_RETURN(int32_t token, s.sampler.Sample(row, s.tokens, static_cast<size_t>(s.generated)));
    s.tokens.push_back(token);
    ++s.generated;
    GenerationEvent ev;
    ev.id = ids[i];
    ev.token = token;
    if (s.params.logprobs >= 0) ev.logprobs = s.sampler.last_logprobs();
    ev.finish = s.stops.After(token, s.generated, static_cast<int64_t>(s.tokens.size()));
    EmitText(s, token, &ev);
    if (ev.finish != FinishReason::kNone) finished.push_back(ev.id);
    events->push_back(std::move(ev));
  }
  for (SequenceId id : finished) ICE_RETURN_IF_ERROR(Finish(id));
  return Status::Ok();
}

}  // namespace icecache::model
