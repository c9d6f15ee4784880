// Lexer of the Jinja-subset interpreter: template text -> tokens, with the whitespace handling of
// the environment Hugging Face transformers renders chat templates in (trim_blocks=True,
// lstrip_blocks=True, keep_trailing_newline=False):
//   * line endings are normalised to "\n" and one trailing newline of the source is dropped;
//   * `{%- ` / `{{- ` / `{#- ` strip all white space before the tag, ` -%}` / ` -}}` / ` -#}` after it;
//   * trim_blocks: the first newline after a block tag or comment is removed (`+%}` keeps it);
//   * lstrip_blocks: spaces and tabs from the start of a line up to a block tag or comment are
//     removed (`{%+` keeps them); variable tags `{{` are not affected.
// Comments are dropped. Pure function; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace icecache::tokenizer::jinja {

enum class TokenType { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  TokenType type = TokenType::kEof;
  std::string text;       // data, name, operator, or a string literal's unescaped value
  int64_t int_value = 0;  // kInt
  double float_value = 0; // kFloat
  int line = 1, column = 1;  // of the token's first character (1-based; columns count bytes)
};

// INVALID_ARGUMENT "line L, column C: ..." for an unterminated tag, comment or string, or a
// character that starts no token.
StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace icecache::tokenizer::jinja
