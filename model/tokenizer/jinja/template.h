// A Jinja2-subset template engine for chat templates (tokenizer_config.json `chat_template`,
// GGUF `tokenizer.chat_template`). It renders what transformers' apply_chat_template renders:
// Jinja2 3.1 with trim_blocks, lstrip_blocks, loop controls, `raise_exception(msg)` and
// `strftime_now(fmt)` as globals and `tojson` as json.dumps(ensure_ascii=False).
//
// Supported: see parser.h (statements, expressions), builtins.h (filters, tests, methods) and the
// globals range(), namespace(), dict(), raise_exception(), strftime_now(). Anything else fails at
// Compile time with UNIMPLEMENTED or INVALID_ARGUMENT naming the construct and its line/column.
//
// Thread safety: a compiled Template is immutable; Render may be called concurrently.
//
//   auto t = Template::Compile("{% for m in messages %}{{ m.content | trim }}{% endfor %}");
//   ValueDict ctx;
//   ctx.Set("messages", ...);
//   StatusOr<std::string> text = (*t)->Render(ctx);
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "model/tokenizer/jinja/value.h"

namespace icecache::tokenizer::jinja {

struct Program;

// Bounds that keep a hostile template from hanging or exhausting memory.
struct RenderLimits {
  int64_t max_steps = 5'000'000;           // expression evaluations + loop iterations + copying work
  size_t max_output_bytes = size_t{64} << 20;  // total text produced, and the largest string/list built
  int max_call_depth = 64;                 // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // The time strftime_now() formats; unset = the current local time (what transformers uses).
  std::optional<std::tm> now;
};

class Template {
 public:
  // Lexes and parses `source`. Errors: INVALID_ARGUMENT (syntax, unknown filter/test) or
  // UNIMPLEMENTED (a Jinja feature outside the subset), "line L, column C: ...".
  static StatusOr<std::shared_ptr<const Template>> Compile(std::string_view source);

  // Renders with `context` as the template's variables. Errors: INVALID_ARGUMENT
  // "line L, column C: ..." for a runtime error (type error, attribute of an undefined value,
  // ...); INVALID_ARGUMENT "<message> (raise_exception at line L, column C)" when the template
  // calls raise_exception; RESOURCE_EXHAUSTED when a limit is hit.
  StatusOr<std::string> Render(const ValueDict& context, const RenderOptions& options = {}) const;

  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

 private:
  explicit Template(std::unique_ptr<Program> program);
  std::unique_ptr<Program> program_;
};

}  // namespace icecache::tokenizer::jinja
