// Minimal PNG encoder for bench plots: 8-bit RGB, no filtering, zlib stream of stored
// (uncompressed) deflate blocks, with CRC-32 per chunk and Adler-32 over the image data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace icecache::bench {

// rgb: [height, width, 3] row-major. INVALID_ARGUMENT for a size mismatch; INTERNAL when the file
// cannot be written.
Status WritePng(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

}  // namespace icecache::bench
