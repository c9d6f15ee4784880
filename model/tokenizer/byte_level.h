// The GPT-2 byte-to-unicode alphabet used by ByteLevel pre-tokenizers and decoders: every byte
// 0..255 maps to one printable code point (printable Latin-1 bytes map to themselves, the rest to
// U+0100 onwards). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace icecache::tokenizer {

// UTF-8 text of the code point standing for byte b.
const std::string& ByteLevelChar(uint8_t b);

// The byte that code point cp stands for, or -1 when cp is not in the alphabet.
int ByteLevelByte(char32_t cp);

// Maps every byte of `bytes` to its alphabet character.
std::string BytesToByteLevel(std::string_view bytes);

// Inverse of BytesToByteLevel. Returns false (and leaves *out unspecified) when `text` holds a
// character outside the alphabet or invalid UTF-8.
bool ByteLevelToBytes(std::string_view text, std::string* out);

}  // namespace icecache::tokenizer
