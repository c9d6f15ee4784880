// Malformed tokenizer.json files give errors that name the file and the problem; random and
// mutated inputs never crash the loader (or the tokenizer it returns).
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_util.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;

Json ValidJson() {
  ByteLevelBpeSpec spec;
  spec.vocab_size = 290;
  spec.corpus = "hello world, hello there; the world is wide. 123 456";
  spec.special_tokens = {"<s>", "</s>"};
  return Json::parse(*BuildByteLevelBpeTokenizerJson(spec));
}

Status LoadText(const std::filesystem::path& dir, const std::string& text) {
  auto t = Tokenizer::Load(testing::WriteFile(dir / "tokenizer.json", text));
  return t.ok() ? Status::Ok() : t.status();
}

void ExpectError(const Status& s, StatusCode code, const std::vector<std::string>& needles) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
}

TEST(LoaderErrorsTest, NamesFileAndProblem) {
  auto dir = testing::TestDir();
  const std::string file = (dir / "tokenizer.json").string();

  auto missing = Tokenizer::Load((dir / "nope.json").string());
  ExpectError(missing.status(), StatusCode::kNotFound, {"nope.json"});

  ExpectError(LoadText(dir, "{\"model\": "), StatusCode::kInvalidArgument, {file, "invalid JSON"});
  ExpectError(LoadText(dir, "[1, 2]"), StatusCode::kInvalidArgument, {file, "not a JSON object"});
  ExpectError(LoadText(dir, "{\"version\": \"1.0\"}"), StatusCode::kInvalidArgument, {file, "\"model\""});

  Json j = ValidJson();
  j["model"]["type"] = "WordPiece";
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "unsupported model type \"WordPiece\""});

  j = ValidJson();
  j["model"]["merges"][3] = Json::array({"\xC4\xA0", "zzzq"});
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "merges[3]", "\"zzzq\" is not in the vocab"});

  j = ValidJson();
  j["model"]["merges"].push_back(Json::array({"q", "q"}));  // "qq" is not a token
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "merged token \"qq\""});

  j = ValidJson();
  j["model"]["merges"][0] = "a b c";
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "merges[0]"});

  j = ValidJson();
  j["model"].erase("vocab");
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "\"vocab\""});

  j = ValidJson();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "unsupported pre_tokenizer type \"BertPreTokenizer\""});

  j = ValidJson();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+|\\d";
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "pre_tokenizer Split", "unsupported escape"});

  j = ValidJson();
  j["normalizer"] = {{"type", "NFKD"}};
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "unsupported normalizer type \"NFKD\""});

  j = ValidJson();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "unsupported decoder type \"WordPiece\""});

  j = ValidJson();
  j["added_tokens"][0].erase("content");
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "added_tokens[0]"});

  j = ValidJson();
  j["model"]["vocab"]["hello"] = "seven";
  ExpectError(LoadText(dir, j.dump()), StatusCode::kInvalidArgument, {file, "\"hello\""});

  // Deeply nested Sequences are refused instead of exhausting the stack.
  j = ValidJson();
  j["normalizer"] = "NESTED";
  std::string nested = "{\"type\": \"NFC\"}";
  for (int i = 0; i < 5000; ++i) nested = "{\"type\": \"Sequence\", \"normalizers\": [" + nested + "]}";
  std::string text = j.dump();
  text.replace(text.find("\"NESTED\""), 8, nested);
  ExpectError(LoadText(dir, text), StatusCode::kInvalidArgument, {file, "nested too deeply"});

  // A broken tokenizer_config.json beside a valid tokenizer.json is named too.
  testing::WriteFile(dir / "tokenizer_config.json", "{ not json");
  ExpectError(LoadText(dir, ValidJson().dump()), StatusCode::kInvalidArgument, {"tokenizer_config.json", "invalid JSON"});
}

// Replaces one randomly chosen value (at any depth) with a random value of a random type.
void MutateStructure(Json* j, std::mt19937* rng) {
  Json* node = j;
  while (true) {
    bool descend = (node->is_object() || node->is_array()) && !node->empty() && (*rng)() % 4 != 0;
    if (!descend) break;
    size_t k = (*rng)() % node->size();
    if (node->is_array()) {
      node = &(*node)[k];
    } else {
      auto it = node->begin();
      std::advance(it, k);
      node = &it.value();
    }
  }
  switch ((*rng)() % 9) {
    case 0: *node = nullptr; break;
    case 1: *node = static_cast<int>((*rng)() % 600) - 100; break;
    case 2: *node = "\xC4\xA0" "h"; break;
    case 3: *node = Json::array(); break;
    case 4: *node = Json::object(); break;
    case 5: *node = (*rng)() % 2 == 0; break;
    case 6: *node = Json::array({"h", "e"}); break;
    case 7: *node = {{"type", "Sequence"}}; break;
    case 8: *node = 1e300; break;
  }
}

void Exercise(const Tokenizer& t) {
  for (const char* s : {"hello world", "<s>x</s>", "\xE4\xB8\xAD 123", ""}) {
    auto ids = t.Encode(s, true);
    if (!ids.ok()) continue;
    auto text = t.Decode(*ids);
    (void)text;
    IncrementalDecoder dec(t);
    for (int32_t id : *ids) (void)dec.Push(id);
    (void)dec.Flush();
  }
  std::vector<int32_t> odd = {0, 1, t.vocab_size() - 1, t.vocab_size(), -5};
  (void)t.Decode(odd);
}

TEST(LoaderErrorsTest, FuzzedInputsNeverCrash) {
  auto dir = testing::TestDir();
  const std::string path = (dir / "tokenizer.json").string();
  const std::string valid = ValidJson().dump();
  std::mt19937 rng(12345);
  int loaded = 0, failed = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string text;
    int kind = iter % 4;
    if (kind == 0) {
      text.resize(rng() % 200);
      for (char& c : text) c = static_cast<char>(rng());
    } else if (kind == 1) {
      text = valid;
      int edits = 1 + rng() % 8;
      for (int e = 0; e < edits && !text.empty(); ++e) {
        size_t pos = rng() % text.size();
        switch (rng() % 4) {
          case 0: text[pos] = static_cast<char>(rng()); break;
          case 1: text.erase(pos, 1 + rng() % 16); break;
          case 2: text.insert(pos, 1, "{}[]\",:0-e\\u"[rng() % 13]); break;
          case 3: text.resize(pos); break;
        }
      }
    } else {
      Json j = ValidJson();
      int edits = 1 + rng() % 3;
      for (int e = 0; e < edits; ++e) MutateStructure(&j, &rng);
      text = j.dump();
    }
    testing::WriteFile(path, text);
    auto t = Tokenizer::Load(path);
    if (t.ok()) {
      ++loaded;
      Exercise(**t);
    } else {
      ++failed;
      EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    }
  }
  // Both outcomes occur: the mutations reach deep into valid files.
  EXPECT_GT(loaded, 50);
  EXPECT_GT(failed, 500);
}

}  // namespace
}  // namespace icecache::tokenizer
