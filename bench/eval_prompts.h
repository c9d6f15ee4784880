// Prompts of the accuracy benchmark: read from a jsonl file (tools/train/passkey_lib.py writes
// eval_prompts.jsonl for the passkey model) or generated for any model with a tokenizer:
//   passkey  "The pass key is K. Remember it. K is the pass key." hidden at depth% of repeated
//            filler sentences; asked "What is the pass key?";
//   needle   "The secret number of the CITY office is N." hidden at depth% of real text (a file,
//            e.g. the repository's docs, split into lines; repeated when shorter than the context);
//            asked for it. Depth is measured in tokens of the text.
// Generated prompts are one user message in the model's chat template (plain text when the
// tokenizer has none), with the assistant's answer begun ("The pass key is") so that the answer
// is the next tokens. A trial is correct when the greedy continuation, as text, starts with the
// answer (" K", compared without leading spaces and not followed by another digit).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::bench {

struct EvalPrompt {
  std::string task;
  int context = 0, depth = 0;
  std::vector<int32_t> ids;     // the whole prompt (bos and chat template included)
  std::vector<int32_t> answer;  // jsonl prompts: the exact answer ids; generated: the answer's ids as tokenized alone
  std::string answer_text;      // generated prompts: the answer as text (empty: compare `answer` ids)
};

// jsonl with task, context, depth, prompt_ids, answer_ids per line. INVALID_ARGUMENT naming the line.
StatusOr<std::vector<EvalPrompt>> LoadEvalPrompts(const std::string& path);

// `trials` prompts per (context, depth) of `task` ("passkey" or "needle"; needle needs `haystack`
// text). context: target prompt length in tokens (the prompt lands within a few tokens of it).
// Deterministic in `seed`.
StatusOr<std::vector<EvalPrompt>> MakeEvalPrompts(const tokenizer::Tokenizer& tok, const std::string& task,
                                                  const std::string& haystack, const std::vector<int>& contexts,
                                                  const std::vector<int>& depths, int trials, uint64_t seed);

// True when `text` (a greedy continuation) gives `answer` as described above.
bool AnswerMatches(const std::string& text, const std::string& answer);

}  // namespace icecache::bench
