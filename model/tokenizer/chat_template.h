// Chat formatting by the model's own chat template: the `chat_template` text of
// tokenizer_config.json (or GGUF metadata `tokenizer.chat_template`) is compiled once by the
// Jinja-subset interpreter (jinja/template.h) and rendered per request with the variables
// transformers' apply_chat_template passes: messages (a list of {role, content}),
// add_generation_prompt, bos_token / eos_token (when the model defines them), tools = none,
// documents = none, plus caller-chosen extras (e.g. Qwen3's enable_thinking). The output is
// byte-identical to transformers' for the templates in tests/fixtures/chat_templates/
// (Llama-3/3.1/3.2, Qwen2/2.5/3, Mistral v0.1/v0.3, Phi-3, SmolLM2; see docs/tokenizer.md).
//
// Thread safety: a ChatTemplate is immutable after CompileChatTemplate; FormatChat may be called
// concurrently on one ChatTemplate.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer.h"

namespace icecache::tokenizer {

namespace jinja {
class Template;
}

struct ChatTemplate {
  // kNone: no template. kLlama3 / kChatMl: the template writes those families' turn markers
  // (their end-of-turn tokens end generation); kOther: any other template.
  ChatFormat format = ChatFormat::kNone;
  std::string source;
  std::optional<std::string> bos_token, eos_token;  // the model's bos/eos texts, when it has them
  std::shared_ptr<const jinja::Template> program;    // null: no template, or it did not compile
  Status compile_status;                             // why a non-empty source did not compile
};

// Compiles `source` (empty = the model has no template). A template that does not compile still
// gives a ChatTemplate (format kOther, program null): loading a model does not fail on it, and
// FormatChat returns the compile error.
ChatTemplate CompileChatTemplate(std::string source, std::optional<std::string> bos_token,
                                 std::optional<std::string> eos_token);

// The end-of-turn tokens the template writes (<|eot_id|>, <|eom_id|>, <|im_end|>, <|end|>,
// <end_of_turn>): generation stops at them too.
std::vector<std::string> EndOfTurnTokens(const ChatTemplate& tmpl);

// Renders messages. FAILED_PRECONDITION when there is no template; the compile error
// (UNIMPLEMENTED / INVALID_ARGUMENT naming the construct) when it did not compile;
// INVALID_ARGUMENT "chat template: <message> (raise_exception at line L, column C)" when the
// template rejects the conversation (e.g. roles that do not alternate); INVALID_ARGUMENT
// "chat template: line L, column C: ..." for other template errors (e.g. an empty conversation
// for templates that read messages[0]); RESOURCE_EXHAUSTED past the interpreter's limits.
StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);
// As above with extra template variables and a fixed clock (ChatRenderOptions, tokenizer.h).
// INVALID_ARGUMENT when extra_variables_json is not a JSON object or names a reserved variable
// (messages, add_generation_prompt, bos_token, eos_token, tools, documents).
StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatRenderOptions& options);

}  // namespace icecache::tokenizer
