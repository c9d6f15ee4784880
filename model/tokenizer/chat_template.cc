#include "model/tokenizer/chat_template.h"

#include <algorithm>

#include "model/tokenizer/jinja/template.h"

namespace icecache::tokenizer {
namespace {

bool Contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

Status WithPrefix(const Status& s) { return Status(s.code(), "chat template: " + s.message()); }

}  // namespace

ChatTemplate CompileChatTemplate(std::string source, std::optional<std::string> bos_token,
                                 std::optional<std::string> eos_token) {
  ChatTemplate t;
  t.bos_token = std::move(bos_token);
  t.eos_token = std::move(eos_token);
  t.source = std::move(source);
  if (t.source.empty()) return t;
  if (Contains(t.source, "<|start_header_id|>") && Contains(t.source, "<|eot_id|>")) {
    t.format = ChatFormat::kLlama3;
  } else if (Contains(t.source, "<|im_start|>") && Contains(t.source, "<|im_end|>")) {
    t.format = ChatFormat::kChatMl;
  } else {
    t.format = ChatFormat::kOther;
  }
  auto program = jinja::Template::Compile(t.source);
  if (program.ok()) {
    t.program = std::move(program).value();
  } else {
    t.compile_status = WithPrefix(program.status());
  }
  return t;
}

std::vector<std::string> EndOfTurnTokens(const ChatTemplate& tmpl) {
  std::vector<std::string> out;
  for (const char* tok : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"}) {
    if (Contains(tmpl.source, tok)) out.emplace_back(tok);
  }
  return out;
}

StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  return FormatChat(tmpl, messages, add_generation_prompt, ChatRenderOptions{});
}

StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const ChatRenderOptions& options) {
  if (tmpl.format == ChatFormat::kNone) {
    return FailedPreconditionError("the tokenizer has no chat template (tokenizer_config.json chat_template or GGUF "
                                   "tokenizer.chat_template)");
  }
  if (!tmpl.program) return tmpl.compile_status;
  using jinja::Value;
  jinja::ValueDict ctx;
  if (!options.extra_variables_json.empty()) {
    auto extra = jinja::ValueFromJson(options.extra_variables_json);
    if (!extra.ok() || !extra->is_dict()) {
      return InvalidArgumentError("chat template variables: expected a JSON object, got '" +
                                  options.extra_variables_json.substr(0, 80) + "'");
    }
    for (const auto& [k, v] : extra->as_dict().items) {
      static const char* kReserved[] = {"messages", "add_generation_prompt", "bos_token", "eos_token", "tools",
                                        "documents"};
      if (std::any_of(std::begin(kReserved), std::end(kReserved), [&](const char* r) { return k == r; })) {
        return InvalidArgumentError("chat template variables: '" + k + "' is set by the server and cannot be overridden");
      }
      ctx.Set(k, v);
    }
  }
  jinja::ValueList list;
  list.reserve(messages.size());
  for (const auto& m : messages) {
    jinja::ValueDict d;
    d.items.reserve(2);
    d.items.emplace_back("role", Value::String(m.role));
    d.items.emplace_back("content", Value::String(m.content));
    list.push_back(Value::Dict(std::move(d)));
  }
  ctx.Set("messages", Value::List(std::move(list)));
  ctx.Set("add_generation_prompt", Value::Bool(add_generation_prompt));
  ctx.Set("tools", Value::None());
  ctx.Set("documents", Value::None());
  if (tmpl.bos_token) ctx.Set("bos_token", Value::String(*tmpl.bos_token));
  if (tmpl.eos_token) ctx.Set("eos_token", Value::String(*tmpl.eos_token));
  jinja::RenderOptions render;
  render.now = options.now;
  auto text = tmpl.program->Render(ctx, render);
  if (!text.ok()) return WithPrefix(text.status());
  return text;
}

}  // namespace icecache::tokenizer
