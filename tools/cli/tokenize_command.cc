// icecache tokenize: JSON lines {"text": ...} on stdin -> {"ids": [...]} lines on stdout.
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "tools/cli/command.h"

namespace icecache::cli {
namespace {

constexpr const char* kUsage =
    "usage: icecache tokenize --tokenizer PATH/tokenizer.json [--add-special-tokens]\n"
    "  reads JSON lines {\"text\": \"...\"} on stdin and writes {\"ids\": [...]} lines on stdout.\n"
    "  Added tokens present in the text are matched; bos/eos are added only with --add-special-tokens.\n";

int RunTokenize(int argc, char** argv) {
  std::string path;
  bool add_special = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else if (flag == "--add-special-tokens") {
      add_special = true;
    } else {
      std::fprintf(stderr, "icecache tokenize: unknown or incomplete option '%s'\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "icecache tokenize: --tokenizer is required\n%s", kUsage);
    return 2;
  }
  auto tok = tokenizer::Tokenizer::Load(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "icecache tokenize: %s\n", tok.status().ToString().c_str());
    return 1;
  }
  std::string line;
  for (long line_no = 1; std::getline(std::cin, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string()) {
      std::fprintf(stderr, "icecache tokenize: stdin line %ld: expected a JSON object with a string \"text\"\n",
                   line_no);
      return 1;
    }
    auto ids = (*tok)->Encode(j["text"].get<std::string>(), add_special);
    if (!ids.ok()) {
      std::fprintf(stderr, "icecache tokenize: stdin line %ld: %s\n", line_no, ids.status().ToString().c_str());
      return 1;
    }
    std::cout << nlohmann::json{{"ids", *ids}}.dump() << '\n' << std::flush;
  }
  return 0;
}

}  // namespace

ICE_CLI_COMMAND("tokenize", "text (JSON lines on stdin) to token ids", RunTokenize);

}  // namespace icecache::cli
