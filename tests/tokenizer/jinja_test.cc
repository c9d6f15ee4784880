// The Jinja-subset interpreter (model/tokenizer/jinja/) on its own: snippets covering literals,
// operators, subscripts and slices, string methods, filters, tests, statements, scoping and
// whitespace control against Python Jinja2 (tests/fixtures/chat_templates/snippets.json, written
// by tests/tokenizer/gen_chat_reference.py from jinja_snippets.py), then errors with their
// positions and the bounds that stop hostile templates.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/jinja/template.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer::jinja {
namespace {

using Json = nlohmann::ordered_json;  // keeps the context's key order

RenderOptions FixedClock() {
  RenderOptions o;
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 1;
  tm.tm_mday = 3;
  tm.tm_hour = 10;
  tm.tm_min = 30;
  tm.tm_wday = 1;
  tm.tm_yday = 33;
  o.now = tm;
  return o;
}

StatusOr<std::string> Render(std::string_view source, const ValueDict& ctx = {}, const RenderOptions& o = {}) {
  auto t = Template::Compile(source);
  if (!t.ok()) return t.status();
  return (*t)->Render(ctx, o);
}

TEST(JinjaTest, SnippetsMatchJinja2) {
  Json ref = Json::parse(testing::ReadFile(testing::SourcePath("tests/fixtures/chat_templates/snippets.json")));
  auto ctx = ValueFromJson(ref["context"].dump());
  ASSERT_TRUE(ctx.ok() && ctx->is_dict());
  int texts = 0, errors = 0;
  for (const auto& s : ref["snippets"]) {
    const std::string src = s["template"];
    auto out = Render(src, ctx->as_dict(), FixedClock());
    if (s.contains("text")) {
      ASSERT_TRUE(out.ok()) << src << "\n-> " << out.status().ToString();
      EXPECT_EQ(*out, s["text"].get<std::string>()) << src;
      ++texts;
    } else {
      EXPECT_FALSE(out.ok()) << src << " rendered '" << *out << "' but Jinja2 failed: " << s["error"];
      ++errors;
    }
  }
  EXPECT_GE(texts, 75);
  EXPECT_GE(errors, 10);
}

TEST(JinjaTest, RaiseExceptionGivesTheTemplateMessage) {
  auto r = Render("line one\n{% if true %}{{ raise_exception('Roles must alternate') }}{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "Roles must alternate (raise_exception at line 2, column 17)");
}

TEST(JinjaTest, CompileErrorsNameTheConstructAndPosition) {
  struct Case {
    const char* source;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {"ok\n{{ x | frobnicate }}", StatusCode::kUnimplemented, "line 2, column 8: the filter 'frobnicate' is not supported"},
      {"{{ x is frob }}", StatusCode::kUnimplemented, "line 1, column 9: the test 'frob' is not supported"},
      {"{% include 'a.jinja' %}", StatusCode::kUnimplemented, "line 1, column 4: '{% include %}' is not supported"},
      {"{% extends 'a' %}", StatusCode::kUnimplemented, "'{% extends %}' is not supported"},
      {"{% for x in xs recursive %}{% endfor %}", StatusCode::kUnimplemented, "a recursive for loop is not supported"},
      {"{{ f(*args) }}", StatusCode::kUnimplemented, "'*args' / '**kwargs' in a call is not supported"},
      {"{% if x %}never closed", StatusCode::kInvalidArgument, "missing '{% elif %}'"},
      {"{% endfor %}", StatusCode::kInvalidArgument, "line 1, column 4: unexpected '{% endfor %}'"},
      {"{% frobnicate %}", StatusCode::kInvalidArgument, "unknown tag 'frobnicate'"},
      {"a\n  {{ 1 + }}", StatusCode::kInvalidArgument, "line 2, column 10: unexpected '}}' in expression"},
      {"{{ 'unterminated }}", StatusCode::kInvalidArgument, "line 1, column 4: unterminated string literal"},
      {"{{ x ", StatusCode::kInvalidArgument, "unterminated '{{'"},
      {"{# never closed", StatusCode::kInvalidArgument, "unterminated comment"},
      {"{{ x ! y }}", StatusCode::kInvalidArgument, "unexpected character '!'"},
      {"{% break %}", StatusCode::kInvalidArgument, "'{% break %}' outside a loop"},
      {"{{ 99999999999999999999 }}", StatusCode::kInvalidArgument, "out of range"},
  };
  for (const auto& c : cases) {
    auto t = Template::Compile(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), c.code) << c.source << ": " << t.status().ToString();
    EXPECT_NE(t.status().message().find(c.message), std::string::npos) << c.source << ": " << t.status().message();
  }
}

TEST(JinjaTest, RuntimeErrorsCarryThePosition) {
  ValueDict ctx;
  ctx.Set("messages", Value::List({}));
  auto r = Render("{{- 'x' }}\n{%- if messages[0]['role'] == 'system' %}{% endif %}", ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("line 2, column ", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find("no element 0"), std::string::npos) << r.status().message();

  r = Render("{{ 'a' + 1 }}");
  EXPECT_EQ(r.status().message(), "line 1, column 8: unsupported operand type(s) for +: 'str' and 'int'");
  r = Render("{{ [1].append(2) }}");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);  // immutable, as the sandbox
}

TEST(JinjaTest, GenerationTagRendersItsBody) {
  EXPECT_EQ(*Render("a{% generation %}b{{ 1 }}{% endgeneration %}c"), "ab1c");
}

TEST(JinjaTest, HostileTemplatesHitTheBounds) {
  RenderOptions o;
  o.limits.max_steps = 1'000'000;
  o.limits.max_output_bytes = 1 << 20;
  // 10^15 iterations: the work bound stops it.
  auto r = Render("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                  "{% endfor %}{% endfor %}{% endfor %}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("work limit"), std::string::npos);
  // A string that doubles every iteration: the size bound stops it.
  r = Render("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Output past the limit.
  r = Render("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  r = Render("{{ 'z' * 1000000000000 }}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // A list that doubles: bounded by size and work.
  r = Render("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Unbounded recursion.
  r = Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // range() past Jinja's sandbox limit.
  r = Render("{{ range(1000000) | length }}", {}, o);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Operations whose cost grows with their operands are charged by size: comparing, searching and
  // indexing long strings in a loop, and long lists.
  for (const char* src : {"{% set a = 'x' * 500000 %}{% set b = 'x' * 500000 %}{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
                          "{% set a = 'x' * 500000 %}{% for i in range(100000) %}{% if 'y' in a %}{% endif %}{% endfor %}",
                          "{% set a = 'x' * 500000 %}{% for i in range(100000) %}{{ a[i] }}{% endfor %}",
                          "{% set a = 'x' * 500000 %}{% for i in range(100000) %}{{ a | length }}{% endfor %}",
                          "{{ [0] * 100000000 }}", "{{ ([0] * 10000) * 10000 }}"}) {
    r = Render(src, {}, o);
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << src << ": " << r.status().ToString();
  }
  // Values nested ever deeper, through lists, dicts or namespaces, stop at the depth bound.
  for (const char* src : {"{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
                          "{% set ns = namespace(d=none) %}{% for i in range(100000) %}{% set ns.d = dict(x=ns.d) %}{% endfor %}",
                          "{% set ns = namespace(n=none) %}{% for i in range(100000) %}{% set ns.n = namespace(x=ns.n) %}{% endfor %}"}) {
    r = Render(src, {}, o);
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << src << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find("nested deeper"), std::string::npos) << r.status().message();
  }
  // A namespace that holds itself renders and is freed (LeakSanitizer checks the latter).
  EXPECT_EQ(*Render("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns.me | length }}{{ 'x' * 0 }}{{ '' * 1000000000000 }}"), "1");
  EXPECT_EQ(ValueFromJson(std::string(1000, '[') + std::string(1000, ']')).status().code(), StatusCode::kInvalidArgument);
  // Deep nesting is refused at compile time instead of overflowing the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(Template::Compile(deep).status().code(), StatusCode::kInvalidArgument);
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if true %}";
  EXPECT_EQ(Template::Compile(deep_ifs).status().code(), StatusCode::kInvalidArgument);
  std::string nots = "{{ " + [] { std::string s; for (int i = 0; i < 5000; ++i) s += "not "; return s; }() + "1 }}";
  EXPECT_EQ(Template::Compile(nots).status().code(), StatusCode::kInvalidArgument);
}

// Byte-mutated and truncated versions of a real template never crash the compiler or renderer.
TEST(JinjaTest, MutatedTemplatesNeverCrash) {
  const std::string base = testing::ReadFile(testing::SourcePath("tests/fixtures/chat_templates/qwen3.jinja"));
  auto ctx_json = ValueFromJson(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
      "content": "<think>x</think>y"}], "add_generation_prompt": true, "tools": null})");
  ASSERT_TRUE(ctx_json.ok());
  RenderOptions o;
  o.limits.max_steps = 200'000;
  uint64_t seed = 12345;
  auto next = [&] {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return seed >> 33;
  };
  const char kChars[] = "{}%#-+()[]|.,:'\"~=<>!*/ \nabcifnotsetendforin0123";
  int compiled = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string s = base;
    int edits = 1 + static_cast<int>(next() % 4);
    for (int k = 0; k < edits; ++k) {
      size_t pos = next() % s.size();
      switch (next() % 3) {
        case 0: s[pos] = kChars[next() % (sizeof(kChars) - 1)]; break;
        case 1: s.erase(pos, 1 + next() % 8); break;
        default: s.insert(pos, 1, kChars[next() % (sizeof(kChars) - 1)]);
      }
    }
    if (i % 10 == 0) s.resize(next() % s.size());
    auto t = Template::Compile(s);
    if (!t.ok()) continue;
    ++compiled;
    auto r = (*t)->Render(ctx_json->as_dict(), o);
    (void)r;
  }
  EXPECT_GT(compiled, 100);  // many mutants still compile and are rendered
}

TEST(JinjaTest, PythonFloatAndStringRepr) {
  EXPECT_EQ(FloatRepr(1e16), "1e+16");
  EXPECT_EQ(FloatRepr(1.5e-5), "1.5e-05");
  EXPECT_EQ(FloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(FloatRepr(0.0001), "0.0001");
  EXPECT_EQ(FloatRepr(-2.0), "-2.0");
  EXPECT_EQ(Repr(Value::String("a'b")), "\"a'b\"");
  EXPECT_EQ(Repr(Value::String("a'b\"c\n")), "'a\\'b\"c\\n'");
  EXPECT_EQ(Repr(Value::Tuple({Value::Int(1)})), "(1,)");
}

}  // namespace
}  // namespace icecache::tokenizer::jinja
