#include "model/tokenizer/jinja/string_ops.h"

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer::jinja {
namespace {

bool IsPySpace(char32_t c) { return c != kInvalidCodePoint && (IsWhiteSpace(c) || (c >= 0x1C && c <= 0x1F)); }

// Code point ending at byte e (exclusive) and its start.
char32_t DecodeBefore(std::string_view s, size_t b, size_t e, size_t* start) {
  size_t cs = e - 1;
  while (cs > b && (static_cast<unsigned char>(s[cs]) & 0xC0) == 0x80 && e - cs < 4) --cs;
  size_t len;
  char32_t c = DecodeUtf8(s, cs, &len);
  if (c == kInvalidCodePoint || cs + len != e) {
    *start = e - 1;
    return kInvalidCodePoint;
  }
  *start = cs;
  return c;
}

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

size_t Utf8Length(std::string_view s, size_t i) {
  size_t len;
  DecodeUtf8(s, i, &len);
  return len == 0 ? 1 : len;
}

std::string StripWhitespace(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t len;
    char32_t c = DecodeUtf8(s, b, &len);
    if (!IsPySpace(c)) break;
    b += len;
  }
  while (right && e > b) {
    size_t cs;
    char32_t c = DecodeBefore(s, b, e, &cs);
    if (!IsPySpace(c)) break;
    e = cs;
  }
  return std::string(s.substr(b, e - b));
}

std::string StripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  auto member = [&](std::string_view cp) {
    for (size_t i = 0; i < chars.size();) {
      size_t len = Utf8Length(chars, i);
      if (chars.substr(i, len) == cp) return true;
      i += len;
    }
    return false;
  };
  size_t b = 0, e = s.size();
  while (left && b < e) {
    size_t len = Utf8Length(s, b);
    if (!member(s.substr(b, len))) break;
    b += len;
  }
  while (right && e > b) {
    size_t cs;
    DecodeBefore(s, b, e, &cs);
    if (!member(s.substr(cs, e - cs))) break;
    e = cs;
  }
  return std::string(s.substr(b, e - b));
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

std::vector<std::string> SplitOn(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t p = s.find(sep, pos);
    if (p == std::string_view::npos) break;
    out.emplace_back(s.substr(pos, p - pos));
    pos = p + sep.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::vector<std::string> RSplitOn(std::string_view s, std::string_view sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string_view::npos) break;
    out.emplace_back(s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
  }
  out.emplace_back(s.substr(0, end));
  return std::vector<std::string>(out.rbegin(), out.rend());
}

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  // Words with their byte ranges, then the maxsplit rule (the remainder keeps its inner spaces).
  std::vector<std::pair<size_t, size_t>> words;
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    char32_t c = DecodeUtf8(s, i, &len);
    if (IsPySpace(c)) {
      i += len;
      continue;
    }
    size_t b = i;
    while (i < s.size()) {
      c = DecodeUtf8(s, i, &len);
      if (IsPySpace(c)) break;
      i += len;
    }
    words.emplace_back(b, i);
  }
  std::vector<std::string> out;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
    for (auto [b, e] : words) out.emplace_back(s.substr(b, e - b));
    return out;
  }
  size_t m = static_cast<size_t>(maxsplit);
  if (!from_right) {
    for (size_t k = 0; k < m; ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
    out.push_back(StripWhitespace(s.substr(words[m].first), false, true));
  } else {
    size_t first = words.size() - m;
    out.push_back(StripWhitespace(s.substr(0, words[first - 1].second), true, false));
    for (size_t k = first; k < words.size(); ++k) out.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
  }
  return out;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++i;
      continue;
    }
    size_t len;
    char32_t c = DecodeUtf8(s, i, &len);
    if (c == kInvalidCodePoint) {
      out.push_back(s[i]);
    } else {
      AppendUtf8(SimpleCaseFold(c), &out);
    }
    i += len;
  }
  return out;
}

std::string Title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (size_t i = 0; i < out.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(out[i]);
    if (IsAsciiLetter(static_cast<char>(c))) {
      out[i] = prev_cased ? static_cast<char>(c | 0x20) : static_cast<char>(c & ~0x20);
      prev_cased = true;
    } else {
      prev_cased = c >= 0x80;  // non-ASCII letters count as cased (their case is left alone)
    }
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out = Lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 32);
  return out;
}

StatusOr<std::string> Replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count,
                              size_t max_bytes) {
  std::string out;
  int64_t done = 0;
  if (old_s.empty()) {  // Python inserts new_s between every code point
    for (size_t i = 0; i <= s.size();) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (i == s.size()) break;
      size_t len = Utf8Length(s, i);
      out += s.substr(i, len);
      i += len;
      if (out.size() > max_bytes) break;
    }
  } else {
    size_t pos = 0;
    while (count < 0 || done < count) {
      size_t p = s.find(old_s, pos);
      if (p == std::string_view::npos) break;
      out += s.substr(pos, p - pos);
      out += new_s;
      pos = p + old_s.size();
      ++done;
      if (out.size() > max_bytes) break;
    }
    out += s.substr(pos);
  }
  if (out.size() > max_bytes) {
    return ResourceExhaustedError("replace() would build a string over the limit of " + std::to_string(max_bytes) + " bytes");
  }
  return out;
}

bool CharClassTest(std::string_view s, std::string_view test) {
  if (s.empty()) return false;
  if (test == "isupper" || test == "islower") {
    bool cased = false;
    for (char c : s) {
      if (c >= 'a' && c <= 'z') {
        if (test == "isupper") return false;
        cased = true;
      } else if (c >= 'A' && c <= 'Z') {
        if (test == "islower") return false;
        cased = true;
      }
    }
    return cased;
  }
  for (size_t i = 0; i < s.size();) {
    size_t len;
    char32_t c = DecodeUtf8(s, i, &len);
    bool ok = test == "isspace" ? IsPySpace(c)
              : test == "isdigit" ? (c >= '0' && c <= '9')
                                  : (c < 0x80 && IsAsciiLetter(static_cast<char>(c)));
    if (!ok) return false;
    i += len;
  }
  return true;
}

}  // namespace icecache::tokenizer::jinja
