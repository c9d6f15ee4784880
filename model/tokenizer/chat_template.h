// Chat formatting without a Jinja engine: the chat_template text of tokenizer_config.json is
// recognised as one of the known families and reproduced in C++.
//   * Llama-3 (<|start_header_id|> ... <|eot_id|>), including the Llama-3.1 variant that always
//     writes a system header with "Cutting Knowledge Date" / "Today Date".
//   * ChatML (<|im_start|> ... <|im_end|>), with the default system prompt of Qwen2.5-style
//     templates and the <think> handling of Qwen3 templates.
// Tools, tool calls and images are not supported. Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::tokenizer {

struct ChatTemplate {
  ChatFormat format = ChatFormat::kNone;
  bool llama31_system_header = false;  // Llama-3.1: system header with dates is always written
  std::string date_string;             // Llama-3.1 "Today Date"
  bool qwen3_thinking = false;         // Qwen3: <think> blocks on the final assistant turn
  std::string default_system;          // ChatML: system prompt used when none is given
  std::string bos_token;               // Llama-3 starts with it
};

// Recognises the family of `template_text`; format kNone when it is none of the known ones.
ChatTemplate DetectChatTemplate(std::string_view template_text, std::string bos_token);

// FAILED_PRECONDITION for kNone.
StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

}  // namespace icecache::tokenizer
