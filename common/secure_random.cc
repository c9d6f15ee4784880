#include "common/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace icecache {

Status SecureRandomBytes(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t got = getrandom(p, bytes, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return InternalError(std::string("getrandom: ") + std::strerror(errno));
    }
    p += got;
    bytes -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

StatusOr<uint64_t> SecureRandomId() {
  uint64_t id = 0;
  while (id == 0) ICE_RETURN_IF_ERROR(SecureRandomBytes(&id, sizeof(id)));
  return id;
}

StatusOr<std::string> SecureRandomToken(size_t bytes) {
  std::string token(bytes, '\0');
  ICE_RETURN_IF_ERROR(SecureRandomBytes(token.data(), bytes));
  return token;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace icecache
