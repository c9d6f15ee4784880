#include "model/tokenizer/byte_level.h"

#include <array>

#include "model/tokenizer/unicode.h"

namespace icecache::tokenizer {
namespace {

struct Alphabet {
  std::array<char32_t, 256> byte_to_cp;
  std::array<std::string, 256> byte_to_utf8;
  std::array<int16_t, 512> cp_to_byte;  // every alphabet code point is below U+0144

  Alphabet() {
    cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      byte_to_cp[b] = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    }
    for (int b = 0; b < 256; ++b) {
      AppendUtf8(byte_to_cp[b], &byte_to_utf8[b]);
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* alphabet = new Alphabet();
  return *alphabet;
}

}  // namespace

const std::string& ByteLevelChar(uint8_t b) { return GetAlphabet().byte_to_utf8[b]; }

int ByteLevelByte(char32_t cp) {
  return cp < 512 ? GetAlphabet().cp_to_byte[cp] : -1;
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Alphabet& a = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(a.byte_to_utf8[static_cast<uint8_t>(c)]);
  return out;
}

bool ByteLevelToBytes(std::string_view text, std::string* out) {
  out->clear();
  out->reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len;
    char32_t cp = DecodeUtf8(text, pos, &len);
    int b = cp == kInvalidCodePoint ? -1 : ByteLevelByte(cp);
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
    pos += len;
  }
  return true;
}

}  // namespace icecache::tokenizer
