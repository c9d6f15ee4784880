// UTF-8 and Unicode character properties used by the tokenizer (generated tables: unicode_tables.h).
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace icecache::tokenizer {

// Decodes one code point at text[pos]. On success returns the code point and sets *len to its
// byte length (1..4). An invalid or truncated sequence returns kInvalidCodePoint with *len = 1.
inline constexpr char32_t kInvalidCodePoint = 0xFFFFFFFF;
char32_t DecodeUtf8(std::string_view text, size_t pos, size_t* len);

// Appends the UTF-8 encoding of cp (REQUIRES: a valid scalar value).
void AppendUtf8(char32_t cp, std::string* out);

// Code points of text plus the byte offset of each one; offsets has one extra entry (text size).
// Invalid bytes decode to U+FFFD, one per byte, so offsets stay exact.
struct CodePoints {
  std::vector<char32_t> cps;
  std::vector<uint32_t> offsets;
};
CodePoints DecodeAll(std::string_view text);

// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence that more bytes
// could still complete. Bytes before it are final: complete characters or definitely invalid.
size_t StableUtf8PrefixLength(std::string_view bytes);

// Replaces each maximal invalid subpart of `bytes` with U+FFFD (as Rust's from_utf8_lossy and
// Python's errors="replace" do).
std::string ToValidUtf8(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

bool IsLetter(char32_t cp);      // general category L*
bool IsNumber(char32_t cp);      // general category N*
bool IsWhiteSpace(char32_t cp);  // White_Space property
bool IsPunctuation(char32_t cp); // general category P*
bool IsRegexWordChar(char32_t cp);    // Rust regex \w: Alphabetic, M*, Nd, Pc, Join_Control
char32_t SimpleCaseFold(char32_t cp);
uint8_t CombiningClass(char32_t cp);

const char* UnicodeVersion();

}  // namespace icecache::tokenizer
