#include "model/tokenizer/tokenizer_json_reader.h"

namespace icecache::tokenizer {
namespace {

using Json = nlohmann::json;

class Reader : public nlohmann::json_sax<Json> {
 public:
  Reader(Json* root, BpeData* data) : root_(root), data_(data) {}

  const std::string& error() const { return error_; }

  bool null() override { return Value(Json(nullptr)); }
  bool boolean(bool v) override { return Value(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) {
      data_->vocab.emplace_back(std::move(vocab_key_), v);
      return true;
    }
    return Value(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) {
      data_->vocab.emplace_back(std::move(vocab_key_), v > INT64_MAX ? int64_t{-1} : static_cast<int64_t>(v));
      return true;
    }
    return Value(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return Value(Json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 1) {
        pair_.push_back(std::move(v));
        return true;
      }
      size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos) {
        return Fail("model.merges[" + std::to_string(data_->merges.size()) + "]: \"" + v +
                    "\" is not two tokens separated by one space");
      }
      data_->merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    return Value(Json(std::move(v)));
  }
  bool binary(binary_t&) override { return Fail("binary values are not supported"); }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kNormal) return Value(Json());  // reports the shape error
    Json* obj = Add(Json::object());
    if (AtModelKey("vocab")) mode_ = Mode::kVocab;
    stack_.push_back({obj, ""});
    return true;
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) vocab_key_ = std::move(k);
    else stack_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) mode_ = Mode::kNormal;
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ != 0) return Value(Json());
      merge_depth_ = 1;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kNormal) return Value(Json());
    Json* arr = Add(Json::array());
    if (AtModelKey("merges")) {
      mode_ = Mode::kMerges;
      merge_depth_ = 0;
    }
    stack_.push_back({arr, ""});
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 1) {
        merge_depth_ = 0;
        if (pair_.size() != 2) return BadMerge();
        data_->merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
        return true;
      }
      mode_ = Mode::kNormal;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    if (error_.empty()) error_ = std::string("invalid JSON: ") + ex.what();
    return false;
  }

 private:
  enum class Mode { kNormal, kVocab, kMerges };
  struct Frame {
    Json* value;
    std::string key;  // the key being filled (objects)
  };

  // True when the value now starting is model.<name>.
  bool AtModelKey(const char* name) const {
    return stack_.size() == 2 && stack_[0].value->is_object() && stack_[0].key == "model" &&
           stack_[1].value->is_object() && stack_[1].key == name;
  }
  bool BadMerge() {
    return Fail("model.merges[" + std::to_string(data_->merges.size()) + "]: expected \"a b\" or [\"a\", \"b\"]");
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  bool Value(Json v) {
    if (mode_ == Mode::kVocab) return Fail("model.vocab: id of token \"" + vocab_key_ + "\" is not an integer");
    if (mode_ == Mode::kMerges) return BadMerge();
    Add(std::move(v));
    return true;
  }
  Json* Add(Json v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    Frame& top = stack_.back();
    if (top.value->is_object()) {
      Json& slot = (*top.value)[top.key];
      slot = std::move(v);
      return &slot;
    }
    top.value->push_back(std::move(v));
    return &top.value->back();
  }

  Json* root_;
  BpeData* data_;
  std::vector<Frame> stack_;
  Mode mode_ = Mode::kNormal;
  int merge_depth_ = 0;
  std::vector<std::string> pair_;
  std::string vocab_key_;
  std::string error_;
};

}  // namespace

Status ReadTokenizerJson(std::string_view text, Json* doc, BpeData* data) {
  Reader reader(doc, data);
  bool ok = Json::sax_parse(text.begin(), text.end(), &reader);
  if (!ok || !reader.error().empty()) {
    return InvalidArgumentError(reader.error().empty() ? std::string("invalid JSON") : reader.error());
  }
  return Status::Ok();
}

}  // namespace icecache::tokenizer
