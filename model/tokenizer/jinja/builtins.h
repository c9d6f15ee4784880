// Built-ins of the Jinja-subset interpreter: operators, attribute/item access, iteration, the
// filters, tests and Python methods templates call. Semantics are those of Python + Jinja 3.1
// (the environment transformers renders chat templates in: ImmutableSandboxedEnvironment, whose
// `tojson` is json.dumps(ensure_ascii=False)). Case mapping (upper/title/capitalize) changes ASCII
// letters only; lower() also folds non-ASCII letters (Unicode simple case folding).
// Pure functions of their arguments; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/jinja/value.h"

namespace icecache::tokenizer::jinja {

struct Stmt;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at position `index` or named `name`; nullptr when neither was passed.
  const Value* Get(size_t index, std::string_view name) const;
};


// Work and size bounds of one render. Every expression evaluation charges one unit, operations
// that build strings or lists charge in proportion to what they build, so that no template can
// run longer or build a larger value than the limits allow.
class Budget {
 public:
  Budget(int64_t max_work, size_t max_bytes) : work_left_(max_work), max_work_(max_work), max_bytes_(max_bytes) {}
  Status Charge(int64_t units) {
    work_left_ -= units;
    if (work_left_ >= 0) return Status::Ok();
    return ResourceExhaustedError("the template exceeded its work limit (" + std::to_string(max_work_) +
                                  " steps); is a loop unbounded?");
  }
  // RESOURCE_EXHAUSTED when a value of `bytes` bytes (or list of that many items) is too large.
  Status CheckSize(size_t bytes) const {
    if (bytes <= max_bytes_) return Status::Ok();
    return ResourceExhaustedError("the template built a value of " + std::to_string(bytes) +
                                  " bytes, over the limit of " + std::to_string(max_bytes_));
  }
  // RESOURCE_EXHAUSTED when a list of `items` values would take more than the byte limit.
  Status CheckListSize(size_t items) const { return CheckSize(items * sizeof(Value)); }
  size_t max_bytes() const { return max_bytes_; }

 private:
  int64_t work_left_;
  int64_t max_work_;
  size_t max_bytes_;
};

// A function value: a built-in or bound method (fn), or a macro (run by the interpreter).
struct Callable {
  std::string name;
  std::function<StatusOr<Value>(const CallArgs&, Budget&)> fn;
  const Stmt* macro = nullptr;
};

bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// `a op b` for op in + - * / // % ** ~ (Python semantics; ~ concatenates str() of both).
StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b, Budget& budget);
// -a / +a.
StatusOr<Value> UnaryOp(std::string_view op, const Value& a);
// `item in container` (substring, list element, dict key); `work` as for Equals.
StatusOr<bool> Contains(const Value& container, const Value& item, int64_t* work = nullptr);
// Work units of scanning v once (string bytes / 16, list or dict items).
int64_t ScanCost(const Value& v);

// Jinja's getattr (obj.name: attribute, i.e. a method, first, then item) and getitem
// (obj[key]: item first, then attribute). Missing -> Undefined; INVALID_ARGUMENT when obj is
// Undefined (as Jinja's UndefinedError).
StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] on lists and strings (null = omitted).
StatusOr<Value> SliceValue(const Value& obj, const Value* start, const Value* stop, const Value* step, Budget& budget);
// The items a for loop visits: list items, string characters, dict keys; nothing for Undefined.
StatusOr<ValueList> Iterate(const Value& v);

StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args, Budget& budget);
StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const CallArgs& args);

// Python methods of str (strip, split, startswith, replace, ...), dict (items, keys, values, get)
// and list (count, index). HasMethod says whether receiver.name is one.
bool HasMethod(const Value& receiver, std::string_view name);
StatusOr<Value> CallMethod(const Value& receiver, std::string_view name, const CallArgs& args, Budget& budget);

// Byte offsets of the code points of a UTF-8 string, plus its size at the end.
std::vector<size_t> CodePointStarts(std::string_view s);
// The code points of a UTF-8 string as separate strings (what iterating a Python str gives).
std::vector<std::string> SplitCodePoints(std::string_view s);

}  // namespace icecache::tokenizer::jinja
