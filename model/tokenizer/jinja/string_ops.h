// Python str operations on UTF-8 text used by the interpreter's methods and filters. White space
// is Python's str.isspace() (Unicode White_Space plus U+001C..U+001F). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace icecache::tokenizer::jinja {

// Byte length of the UTF-8 sequence at s[i] (1 for an invalid byte).
size_t Utf8Length(std::string_view s, size_t i);

std::string StripWhitespace(std::string_view s, bool left, bool right);        // str.strip()
std::string StripChars(std::string_view s, std::string_view chars, bool left, bool right);  // str.strip(chars)
bool StartsWith(std::string_view s, std::string_view prefix);
bool EndsWith(std::string_view s, std::string_view suffix);
// str.split(sep, maxsplit) / str.rsplit(sep, maxsplit); maxsplit < 0: no limit. REQUIRES: sep non-empty.
std::vector<std::string> SplitOn(std::string_view s, std::string_view sep, int64_t maxsplit);
std::vector<std::string> RSplitOn(std::string_view s, std::string_view sep, int64_t maxsplit);
// str.split() / str.rsplit() with no separator: runs of white space, no empty parts.
std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit, bool from_right);
std::string AsciiUpper(std::string_view s);
std::string Lower(std::string_view s);
std::string Title(std::string_view s);
std::string Capitalize(std::string_view s);
// str.replace(old, new, count); RESOURCE_EXHAUSTED when the result would exceed max_bytes.
StatusOr<std::string> Replace(std::string_view s, std::string_view old_s, std::string_view new_s, int64_t count,
                              size_t max_bytes);
// str.isdigit / isspace / isalpha / isupper / islower (ASCII classes, plus Unicode white space).
bool CharClassTest(std::string_view s, std::string_view test);

}  // namespace icecache::tokenizer::jinja
