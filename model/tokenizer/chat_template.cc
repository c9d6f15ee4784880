#include "model/tokenizer/chat_template.h"

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

bool Contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Python's str.strip() / lstrip() / rstrip() (no argument: Unicode white space).
std::string Strip(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t len;
    char32_t c = DecodeUtf8(s, b, &len);
    if (c == kInvalidCodePoint || !(IsWhiteSpace(c) || (c >= 0x1C && c <= 0x1F))) break;
    b += len;
  }
  while (right && e > b) {
    size_t cs = e - 1;
    while (cs > b && (static_cast<unsigned char>(s[cs]) & 0xC0) == 0x80) --cs;
    size_t len;
    char32_t c = DecodeUtf8(s, cs, &len);
    if (c == kInvalidCodePoint || !(IsWhiteSpace(c) || (c >= 0x1C && c <= 0x1F))) break;
    e = cs;
  }
  return std::string(s.substr(b, e - b));
}

// Python's strip('\n') family.
std::string StripNewlines(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && s[b] == '\n') ++b;
  while (right && e > b && s[e - 1] == '\n') --e;
  return std::string(s.substr(b, e - b));
}

// Undoes the escapes of a Jinja string literal that matter here.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char n = s[++i];
      out.push_back(n == 'n' ? '\n' : n == 't' ? '\t' : n);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string FormatLlama3(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
  std::string out = t.bos_token;
  size_t first = 0;
  auto header = [](const std::string& role) { return "<|start_header_id|>" + role + "<|end_header_id|>\n\n"; };
  if (t.llama31_system_header) {
    std::string system;
    if (!messages.empty() && messages[0].role == "system") {
      system = Strip(messages[0].content, true, true);
      first = 1;
    }
    out += header("system") + "Cutting Knowledge Date: December 2023\nToday Date: " + t.date_string + "\n\n" +
           system + "<|eot_id|>";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out += header(messages[i].role) + Strip(messages[i].content, true, true) + "<|eot_id|>";
  }
  if (gen) out += header("assistant");
  return out;
}

std::string FormatChatMl(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
  std::string out;
  if (!t.default_system.empty() && (messages.empty() || messages[0].role != "system")) {
    out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
  }
  for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::string FormatQwen3(const std::vector<ChatMessage>& messages, bool gen) {
  std::string out;
  const size_t n = messages.size();
  if (n > 0 && messages[0].role == "system") out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  // The last user turn that is not a tool response; assistant turns after it show their thinking.
  size_t last_query = n == 0 ? 0 : n - 1;
  for (size_t k = n; k-- > 0;) {
    const auto& m = messages[k];
    if (m.role == "user" && !(StartsWith(m.content, "<tool_response>") && EndsWith(m.content, "</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i != 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.content, reasoning;
      size_t close = content.rfind("</think>");
      if (close != std::string::npos) {
        std::string before = content.substr(0, content.find("</think>"));
        content = StripNewlines(content.substr(close + 8), true, false);
        before = StripNewlines(before, false, true);
        size_t open = before.rfind("<think>");
        reasoning = StripNewlines(open == std::string::npos ? before : before.substr(open + 7), true, false);
      }
      if (i > last_query && (i + 1 == n || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + StripNewlines(reasoning, true, true) + "\n</think>\n\n" +
               StripNewlines(content, true, false);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

ChatTemplate DetectChatTemplate(std::string_view text, std::string bos_token) {
  ChatTemplate t;
  t.bos_token = std::move(bos_token);
  if (Contains(text, "<|start_header_id|>") && Contains(text, "<|eot_id|>")) {
    t.format = ChatFormat::kLlama3;
    if (Contains(text, "Cutting Knowledge Date")) {
      t.llama31_system_header = true;
      t.date_string = "26 Jul 2024";
      size_t p = text.find("set date_string = \"");
      if (p != std::string_view::npos) {
        p += 19;
        size_t e = text.find('"', p);
        if (e != std::string_view::npos) t.date_string = std::string(text.substr(p, e - p));
      }
    }
    return t;
  }
  if (Contains(text, "<|im_start|>") && Contains(text, "<|im_end|>")) {
    t.format = ChatFormat::kChatMl;
    t.qwen3_thinking = Contains(text, "<think>") && Contains(text, "reasoning_content");
    // Qwen2.5 style: "{{- '<|im_start|>system\nYou are ...<|im_end|>\n' }}" in the no-system branch.
    // The newline is an escape in tokenizer_config.json's text and a real newline in GGUF
    // metadata (SmolLM2).
    for (const std::string_view marker : {std::string_view("'<|im_start|>system\\n"), std::string_view("'<|im_start|>system\n")}) {
      for (size_t p = text.find(marker); p != std::string_view::npos; p = text.find(marker, p + 1)) {
        size_t b = p + marker.size();
        if (b < text.size() && text[b] == '\'') continue;  // followed by "+ messages[0].content"
        size_t e = text.find("<|im_end|>", b);
        size_t quote = text.find('\'', b);
        if (e != std::string_view::npos && (quote == std::string_view::npos || e < quote)) {
          t.default_system = Unescape(text.substr(b, e - b));
          break;
        }
      }
      if (!t.default_system.empty()) break;
    }
  }
  return t;
}

StatusOr<std::string> FormatChat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  switch (tmpl.format) {
    case ChatFormat::kLlama3: return FormatLlama3(tmpl, messages, add_generation_prompt);
    case ChatFormat::kChatMl:
      if (tmpl.qwen3_thinking) return FormatQwen3(messages, add_generation_prompt);
      return FormatChatMl(tmpl, messages, add_generation_prompt);
    case ChatFormat::kNone: break;
  }
  return FailedPreconditionError("the tokenizer has no recognised chat template (Llama-3 or ChatML)");
}

}  // namespace icecache::tokenizer
