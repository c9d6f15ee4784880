// `icecache health --router HOST:PORT`: exits 0 when the server answers grpc.health.v1 SERVING.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/client.h"
#include "tools/cli/command.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache health --router HOST:PORT [--service NAME] [--timeout SECONDS]\n"
    "  exits 0 when the server is SERVING (the whole server, or the named service), 1 otherwise\n";

int RunHealth(int argc, char** argv) {
  std::string address, service;
  double timeout = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--router" || a == "--address") && i + 1 < argc) {
      address = argv[++i];
    } else if (a == "--service" && i + 1 < argc) {
      service = argv[++i];
    } else if (a == "--timeout" && i + 1 < argc) {
      timeout = std::atof(argv[++i]);
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "icecache health: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (address.empty() || timeout <= 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  Status s = router::CheckHealth(address, service, timeout);
  if (!s.ok()) {
    std::fprintf(stderr, "icecache health: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("%s: SERVING\n", address.c_str());
  return 0;
}

}  // namespace
ICE_CLI_COMMAND("health", "check that a cluster (router or worker) is serving", RunHealth);
}  // namespace icecache::cli
