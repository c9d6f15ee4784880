// Subcommands of the `icecache` command line. A command file defines
//   int RunFoo(int argc, char** argv);   // argv[0] is the subcommand name
//   ICE_CLI_COMMAND("foo", "one-line description", RunFoo);
// and is listed in tools/CMakeLists.txt. Exit codes: 0 success, 1 runtime error, 2 usage error.
#pragma once

namespace icecache::cli {

using CommandFn = int (*)(int argc, char** argv);

struct CommandRegistrar {
  CommandRegistrar(const char* name, const char* help, CommandFn fn);
};

}  // namespace icecache::cli

#define ICE_CLI_COMMAND(name, help, fn) \
  static ::icecache::cli::CommandRegistrar ice_cli_registrar_##fn(name, help, fn)
