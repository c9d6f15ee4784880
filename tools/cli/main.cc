#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "tools/cli/command.h"

namespace icecache::cli {
namespace {
std::map<std::string, std::pair<const char*, CommandFn>>& Registry() {
  static std::map<std::string, std::pair<const char*, CommandFn>> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(const char* name, const char* help, CommandFn fn) {
  Registry()[name] = {help, fn};
}

}  // namespace icecache::cli

int main(int argc, char** argv) {
  auto& reg = icecache::cli::Registry();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fprintf(stderr, "usage: icecache COMMAND [options]   (COMMAND --help for its options)\n");
    for (auto& [name, entry] : reg) std::fprintf(stderr, "  %-11s %s\n", name.c_str(), entry.first);
    return argc < 2 ? 2 : 0;
  }
  auto it = reg.find(argv[1]);
  if (it == reg.end()) {
    std::fprintf(stderr, "icecache: unknown command '%s' (run icecache --help for the list)\n", argv[1]);
    return 2;
  }
  return it->second.second(argc - 1, argv + 1);
}
