#include "bench/eval_prompts.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

namespace icecache::bench {
namespace {

constexpr const char kFiller[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr const char* kCities[] = {"Oslo",  "Lima",   "Cairo", "Perth", "Quito", "Dakar", "Hanoi", "Porto",
                                   "Turin", "Kyoto",  "Accra", "Tunis", "Minsk", "Riga",  "Sofia", "Bern"};

// Lines of the haystack, each with its newline (blank lines kept with the line before).
std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string::npos ? text.size() : end + 1;
    std::string line = text.substr(pos, end - pos);
    if (line.find_first_not_of(" \n\t") == std::string::npos && !out.empty()) {
      out.back() += line;
    } else {
      out.push_back(std::move(line));
    }
    pos = end;
  }
  return out;
}

struct Parts {
  std::string intro, question, assistant_prefix, needle, answer;
};

// The prompt: template(user: intro + body + question) + assistant_prefix.
StatusOr<std::vector<int32_t>> Encode(const tokenizer::Tokenizer& tok, const Parts& p, const std::string& body) {
  const std::string user = p.intro + body + p.question;
  auto chat = tok.ApplyChatTemplate({{"user", user}}, /*add_generation_prompt=*/true);
  if (chat.ok()) return tok.Encode(*chat + p.assistant_prefix, /*add_special_tokens=*/false);
  return tok.Encode(user + " " + p.assistant_prefix, /*add_special_tokens=*/true);
}

}  // namespace

StatusOr<std::vector<EvalPrompt>> LoadEvalPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot open " + path);
  std::vector<EvalPrompt> out;
  std::string line;
  for (int ln = 1; std::getline(in, line); ++ln) {
    if (line.empty()) continue;
    try {
      auto j = nlohmann::json::parse(line);
      EvalPrompt p;
      p.task = j.at("task").get<std::string>();
      p.context = j.at("context").get<int>();
      p.depth = j.at("depth").get<int>();
      p.ids = j.at("prompt_ids").get<std::vector<int32_t>>();
      p.answer = j.at("answer_ids").get<std::vector<int32_t>>();
      if (p.ids.size() < 2 || p.answer.empty()) return InvalidArgumentError(path + ":" + std::to_string(ln) + ": empty prompt/answer");
      out.push_back(std::move(p));
    } catch (const std::exception& e) {
      return InvalidArgumentError(path + ":" + std::to_string(ln) + ": " + e.what());
    }
  }
  return out;
}

StatusOr<std::vector<EvalPrompt>> MakeEvalPrompts(const tokenizer::Tokenizer& tok, const std::string& task,
                                                  const std::string& haystack, const std::vector<int>& contexts,
                                                  const std::vector<int>& depths, int trials, uint64_t seed) {
  if (task != "passkey" && task != "needle") return InvalidArgumentError("unknown task '" + task + "' (passkey, needle)");
  std::vector<std::string> units;
  if (task == "passkey") {
    units.assign(1, kFiller);
  } else {
    units = Lines(haystack);
    if (units.empty()) return InvalidArgumentError("needle: the haystack text is empty (--haystack FILE)");
  }
  std::vector<int> unit_tokens;
  for (const std::string& u : units) {
    ICE_ASSIGN_OR_RETURN(auto ids, tok.Encode(u, false));
    unit_tokens.push_back(static_cast<int>(ids.size()));
  }
  std::mt19937_64 rng(seed);
  std::vector<EvalPrompt> out;
  for (int context : contexts) {
    for (int depth : depths) {
      if (depth < 0 || depth > 100) return InvalidArgumentError("depth " + std::to_string(depth) + " not in [0, 100]");
      for (int trial = 0; trial < trials; ++trial) {
        Parts p;
        const std::string key = std::to_string(10000 + rng() % 90000);
        if (task == "passkey") {
          p.intro = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                    "I will quiz you about the important information there.\n";
          p.question = "\nWhat is the pass key?";
          p.assistant_prefix = "The pass key is";
          p.needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key. ";
        } else {
          const std::string city = kCities[rng() % std::size(kCities)];
          p.intro = "Read the document below and answer the question after it.\n\n";
          p.question = "\nQuestion: What is the secret number of the " + city + " office?";
          p.assistant_prefix = "The secret number of the " + city + " office is";
          p.needle = "The secret number of the " + city + " office is " + key + ".\n";
        }
        p.answer = " " + key;
        ICE_ASSIGN_OR_RETURN(auto overhead, Encode(tok, p, p.needle));
        // Haystack units from a per-trial starting point until the context is reached.
        const size_t start = task == "needle" ? rng() % units.size() : 0;
        std::vector<size_t> body;
        int64_t tokens = static_cast<int64_t>(overhead.size());
        for (size_t i = start; tokens < context; ++i) {
          const size_t u = i % units.size();
          body.push_back(u);
          tokens += unit_tokens[u];
          if (body.size() > 1000000) return InternalError("haystack units produce no tokens");
        }
        if (!body.empty() && tokens > context) body.pop_back();  // stay at or under the context
        // The needle goes before the first unit at which depth% of the body's tokens have passed.
        int64_t body_tokens = 0;
        for (size_t u : body) body_tokens += unit_tokens[u];
        size_t at = 0;
        for (int64_t before = 0; at < body.size() && before * 100 < depth * body_tokens; ++at) before += unit_tokens[body[at]];
        std::string text;
        for (size_t i = 0; i <= body.size(); ++i) {
          if (i == at) text += p.needle;
          if (i < body.size()) text += units[body[i]];
        }
        EvalPrompt e;
        e.task = task;
        e.context = context;
        e.depth = depth;
        ICE_ASSIGN_OR_RETURN(e.ids, Encode(tok, p, text));
        ICE_ASSIGN_OR_RETURN(e.answer, tok.Encode(p.answer, false));
        e.answer_text = p.answer;
        out.push_back(std::move(e));
      }
    }
  }
  return out;
}

bool AnswerMatches(const std::string& text, const std::string& answer) {
  auto trim = [](const std::string& s) {
    size_t b = 0;
    while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    return s.substr(b);
  };
  const std::string t = trim(text), a = trim(answer);
  if (a.empty() || t.compare(0, a.size(), a) != 0) return false;
  return t.size() == a.size() || !std::isdigit(static_cast<unsigned char>(t[a.size()]));
}

}  // namespace icecache::bench
