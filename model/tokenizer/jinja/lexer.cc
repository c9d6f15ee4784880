#include "model/tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Normalise line endings; drop one trailing newline (keep_trailing_newline=False).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t start = pos;
      while (true) {
        start = src_.find('{', start);
        if (start == std::string::npos || start + 1 >= n) {
          start = std::string::npos;
          break;
        }
        char k = src_[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        Emit(TokenType::kData, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[start + 1];
      const char sign = start + 2 < n && (src_[start + 2] == '-' || src_[start + 2] == '+') ? src_[start + 2] : 0;
      std::string_view text(src_.data() + pos, start - pos);
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && IsSpace(text[e - 1])) --e;
        text = text.substr(0, e);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool all_space = l_pos < text.size();
          for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && IsSpace(text[i]);
          if (all_space) text = text.substr(0, l_pos);
        }
      }
      if (!text.empty()) Emit(TokenType::kData, std::string(text), pos);
      size_t p = start + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", p);
        if (end == std::string::npos) return Error(start, "unterminated comment (missing '#}')");
        size_t q = end + 2;
        if (end > p && src_[end - 1] == '-') {
          while (q < n && IsSpace(src_[q])) ++q;
        } else if (!(end > p && src_[end - 1] == '+') && q < n && src_[q] == '\n') {
          ++q;
        }
        line_starting = q > 0 && src_[q - 1] == '\n';
        pos = q;
        continue;
      }
      const bool block = kind == '%';
      Emit(block ? TokenType::kBlockBegin : TokenType::kVarBegin, block ? "{%" : "{{", start);
      ICE_ASSIGN_OR_RETURN(pos, LexTag(p, block, start));
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    Emit(TokenType::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  // Lexes the inside of a tag starting at p; returns the position after its end (and after the
  // white space the end marker removes).
  StatusOr<size_t> LexTag(size_t p, bool block, size_t tag_start) {
    const size_t n = src_.size();
    int depth = 0;
    while (true) {
      while (p < n && IsSpace(src_[p])) ++p;
      if (p >= n) return Error(tag_start, block ? "unterminated block tag (missing '%}')" : "unterminated '{{' (missing '}}')");
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        char c = src_[p];
        bool signed_end = (c == '-' || (block && c == '+')) && src_.compare(p + 1, 2, close) == 0;
        if (signed_end || src_.compare(p, 2, close) == 0) {
          Emit(block ? TokenType::kBlockEnd : TokenType::kVarEnd, close, p);
          size_t q = p + (signed_end ? 3 : 2);
          if (signed_end && c == '-') {
            while (q < n && IsSpace(src_[q])) ++q;
          } else if (block && !signed_end && q < n && src_[q] == '\n') {
            ++q;  // trim_blocks
          }
          return q;
        }
      }
      char c = src_[p];
      if (IsNameStart(c)) {
        size_t b = p;
        while (p < n && IsNameChar(src_[p])) ++p;
        Emit(TokenType::kName, src_.substr(b, p - b), b);
      } else if (IsDigit(c)) {
        ICE_ASSIGN_OR_RETURN(p, LexNumber(p));
      } else if (c == '\'' || c == '"') {
        ICE_ASSIGN_OR_RETURN(p, LexString(p));
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : kTwo) {
          if (src_.compare(p, 2, t) == 0) op = t;
        }
        if (op.empty()) {
          if (!std::strchr("+-*/%~<>=.,:|()[]{}", c)) {
            return Error(p, std::string("unexpected character '") + c + "' in tag");
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) return Error(p, "unbalanced '" + op + "'");
          --depth;
        }
        Emit(TokenType::kOp, op, p);
        p += op.size();
      }
    }
  }

  StatusOr<size_t> LexNumber(size_t p) {
    const size_t n = src_.size(), b = p;
    auto digits = [&] {
      while (p < n && (IsDigit(src_[p]) || (src_[p] == '_' && p + 1 < n && IsDigit(src_[p + 1])))) ++p;
    };
    digits();
    bool is_float = false;
    if (p + 1 < n && src_[p] == '.' && IsDigit(src_[p + 1])) {
      is_float = true;
      ++p;
      digits();
    }
    if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < n && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < n && IsDigit(src_[q])) {
        is_float = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = b; i < p; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t;
    t.text = text;
    Locate(b, &t);
    if (is_float) {
      t.type = TokenType::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = TokenType::kInt;
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == ERANGE) return Error(b, "integer literal " + text + " is out of range");
      t.int_value = v;
    }
    tokens_.push_back(std::move(t));
    return p;
  }

  // Python's unicode-escape decoding of a string literal's body.
  StatusOr<size_t> LexString(size_t p) {
    const size_t n = src_.size(), b = p;
    const char quote = src_[p++];
    std::string out;
    while (true) {
      if (p >= n) return Error(b, "unterminated string literal");
      char c = src_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\' || p + 1 >= n) {
        out.push_back(c);
        ++p;
        continue;
      }
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n': break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t i = 0; i < len; ++i) {
            int h = p + i < n ? HexValue(src_[p + i]) : -1;
            if (h < 0) return Error(p - 2, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          p += len;
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return Error(p - len - 2, "escape names an invalid code point");
          }
          AppendUtf8(static_cast<char32_t>(cp), &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && p < n && src_[p] >= '0' && src_[p] <= '7'; ++i) cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            AppendUtf8(static_cast<char32_t>(cp), &out);
          } else {
            out.push_back('\\');  // unknown escapes stay as written
            out.push_back(e);
          }
      }
    }
    Emit(TokenType::kString, std::move(out), b);
    return p;
  }

  void Locate(size_t offset, Token* t) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    t->line = static_cast<int>(line);
    t->column = static_cast<int>(offset - line_starts_[line - 1] + 1);
  }

  void Emit(TokenType type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    Locate(offset, &t);
    tokens_.push_back(std::move(t));
  }

  Status Error(size_t offset, const std::string& what) const {
    Token t;
    Locate(offset, &t);
    return InvalidArgumentError("line " + std::to_string(t.line) + ", column " + std::to_string(t.column) + ": " + what);
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace icecache::tokenizer::jinja
