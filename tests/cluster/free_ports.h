// Picking loopback ports for tests that start real processes (which cannot bind port 0 and report
// back). Racy by nature: a port free now may be taken before the child binds it, so callers retry
// or accept a rare failure.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <ctime>
#include <random>

namespace icecache::testing {

// True when 127.0.0.1:port can be bound right now.
inline bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A base port whose next `n` ports are all free right now, or -1. `salt` keeps test binaries
// started in the same second from drawing the same ports.
inline int FreePortRange(int n, uint32_t salt) {
  std::mt19937 rng(static_cast<uint32_t>(getpid()) * salt + static_cast<uint32_t>(time(nullptr)));
  for (int attempt = 0; attempt < 100; ++attempt) {
    // Below Linux's ephemeral range (32768..60999): a port there can be taken between this check
    // and the bind by any process's outgoing connection (seen as "Connection refused" flakes).
    int base = 20000 + static_cast<int>(rng() % 12000);
    bool all = true;
    for (int i = 0; i < n && all; ++i) all = PortFree(base + i);
    if (all) return base;
  }
  return -1;
}

}  // namespace icecache::testing
