#include "model/tokenizer/unicode.h"

#include <algorithm>

#include "model/tokenizer/unicode_tables.h"

namespace icecache::tokenizer {
namespace {

bool InRanges(const tables::Range* table, int size, char32_t cp) {
  const tables::Range* end = table + size;
  const tables::Range* it =
      std::upper_bound(table, end, cp, [](char32_t c, const tables::Range& r) { return c < r.lo; });
  return it != table && cp <= (it - 1)->hi;
}

}  // namespace

char32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len) {
  *len = 1;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size() - pos;
  unsigned char b0 = s[pos];
  if (b0 < 0x80) return b0;
  int need;
  char32_t cp;
  char32_t min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1; cp = b0 & 0x1F; min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2; cp = b0 & 0x0F; min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3; cp = b0 & 0x07; min = 0x10000;
  } else {
    return kInvalidCodePoint;
  }
  if (n < static_cast<size_t>(need) + 1) return kInvalidCodePoint;
  for (int i = 1; i <= need; ++i) {
    unsigned char b = s[pos + i];
    if ((b & 0xC0) != 0x80) return kInvalidCodePoint;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidCodePoint;
  *len = need + 1;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

CodePoints DecodeAll(std::string_view text) {
  CodePoints r;
  r.cps.reserve(text.size());
  r.offsets.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len;
    char32_t cp = DecodeUtf8(text, pos, &len);
    r.cps.push_back(cp == kInvalidCodePoint ? 0xFFFD : cp);
    r.offsets.push_back(static_cast<uint32_t>(pos));
    pos += len;
  }
  r.offsets.push_back(static_cast<uint32_t>(text.size()));
  return r;
}

// Length of the valid-but-incomplete UTF-8 prefix starting at s[pos] (0 if the bytes there are
// not the start of a sequence that more bytes could complete).
static size_t IncompleteSequenceLength(std::string_view s, size_t pos) {
  auto b0 = static_cast<unsigned char>(s[pos]);
  int need;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 1;
  else if (b0 >= 0xE0 && b0 <= 0xEF) need = 2;
  else if (b0 >= 0xF0 && b0 <= 0xF4) need = 3;
  else return 0;
  size_t avail = s.size() - pos - 1;
  if (avail >= static_cast<size_t>(need)) return 0;
  for (size_t i = 1; i <= avail; ++i) {
    auto b = static_cast<unsigned char>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    // Second-byte restrictions that make the sequence invalid already.
    if (i == 1 && ((b0 == 0xE0 && b < 0xA0) || (b0 == 0xED && b > 0x9F) ||
                   (b0 == 0xF0 && b < 0x90) || (b0 == 0xF4 && b > 0x8F))) {
      return 0;
    }
  }
  return avail + 1;
}

size_t StableUtf8PrefixLength(std::string_view bytes) {
  size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t pos = n - back;
    auto b = static_cast<unsigned char>(bytes[pos]);
    if ((b & 0xC0) != 0x80) {
      return IncompleteSequenceLength(bytes, pos) == back ? pos : n;
    }
  }
  return n;
}

std::string ToValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len;
    char32_t cp = DecodeUtf8(bytes, pos, &len);
    if (cp != kInvalidCodePoint) {
      out.append(bytes.substr(pos, len));
      pos += len;
      continue;
    }
    // Maximal subpart: a truncated but so-far-valid prefix counts as one replacement.
    size_t partial = 1;
    auto b0 = static_cast<unsigned char>(bytes[pos]);
    int need = (b0 >= 0xC2 && b0 <= 0xDF) ? 1 : (b0 >= 0xE0 && b0 <= 0xEF) ? 2 : (b0 >= 0xF0 && b0 <= 0xF4) ? 3 : 0;
    for (int i = 1; i <= need && pos + i < bytes.size(); ++i) {
      auto b = static_cast<unsigned char>(bytes[pos + i]);
      bool ok = (b & 0xC0) == 0x80;
      if (i == 1) {
        ok = ok && !((b0 == 0xE0 && b < 0xA0) || (b0 == 0xED && b > 0x9F) ||
                     (b0 == 0xF0 && b < 0x90) || (b0 == 0xF4 && b > 0x8F));
      }
      if (!ok) break;
      partial = i + 1;
    }
    out.append("\xEF\xBF\xBD");
    pos += partial;
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t len;
    if (DecodeUtf8(bytes, pos, &len) == kInvalidCodePoint) return false;
    pos += len;
  }
  return true;
}

bool IsLetter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return InRanges(tables::kLetterRanges, tables::kLetterRangesSize, cp);
}

bool IsNumber(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return InRanges(tables::kNumberRanges, tables::kNumberRangesSize, cp);
}

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  return InRanges(tables::kWhiteSpaceRanges, tables::kWhiteSpaceRangesSize, cp);
}

bool IsPunctuation(char32_t cp) {
  return InRanges(tables::kPunctuationRanges, tables::kPunctuationRangesSize, cp);
}

bool IsRegexWordChar(char32_t cp) {
  if (cp < 0x80) return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || (cp >= '0' && cp <= '9') || cp == '_';
  return InRanges(tables::kWordRanges, tables::kWordRangesSize, cp);
}

char32_t SimpleCaseFold(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  const auto* end = tables::kCaseFolds + tables::kCaseFoldsSize;
  const auto* it = std::lower_bound(tables::kCaseFolds, end, cp,
                                    [](const tables::CaseFold& f, char32_t c) { return f.cp < c; });
  return (it != end && it->cp == cp) ? it->folded : cp;
}

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* table = tables::kCombiningClasses;
  const auto* end = table + tables::kCombiningClassesSize;
  const auto* it = std::upper_bound(table, end, cp,
                                    [](char32_t c, const tables::ClassRange& r) { return c < r.lo; });
  return (it != table && cp <= (it - 1)->hi) ? (it - 1)->ccc : 0;
}

const char* UnicodeVersion() { return tables::kUnicodeVersion; }

}  // namespace icecache::tokenizer
