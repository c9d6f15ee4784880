// Values of the Jinja-subset interpreter (model/tokenizer/jinja/): Python's None, bool, int,
// float, str, list, dict, plus Jinja's Undefined, namespace() objects and callables (built-in
// functions, bound methods, macros). Semantics follow Python where templates can see them:
// truthiness, ==, ordering, str() and repr() (what `{{ x }}` prints), json.dumps (`tojson`).
//
// Strings are UTF-8; indexing, slicing and length count code points, as Python does.
// Lists and dicts are immutable once built and shared between copies (copying a Value is cheap);
// a namespace is the one mutable object (shared by reference, as in Python). Values built by one
// render are used by that render only; a Value that is never mutated (every kind except a
// namespace) may be read from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace icecache::tokenizer::jinja {

class Value;
struct Callable;  // interpreter.h
using ValueList = std::vector<Value>;

// Insertion-ordered dict with string keys (what chat templates use); lookup is linear.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);  // replaces an existing key in place
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // Undefined
  static Value Undefined(std::string hint);  // hint names what was missing, for error messages
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);  // a list that prints as (a, b) and != an equal list
  static Value Dict(ValueDict dict);
  static Value Namespace(ValueDict attributes);
  static Value Function(std::shared_ptr<const Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // lists and tuples
  bool is_tuple() const { return kind_ == Kind::kList && b_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  // REQUIRES: the matching kind (bool/int also read as int, all numbers as double).
  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *s_; }
  const ValueList& as_list() const { return *l_; }
  const ValueDict& as_dict() const { return *d_; }      // dict or namespace
  ValueDict& namespace_attributes() const { return *d_; }  // REQUIRES: is_namespace()
  const std::shared_ptr<const Callable>& as_callable() const { return c_; }
  const std::string& undefined_hint() const;

  // Nesting depth: 0 for scalars, 1 + the deepest item for lists, tuples, dicts and namespaces
  // (namespace attributes count as set at creation). The interpreter bounds it, so that printing,
  // comparing and freeing values never recurse deeply.
  uint32_t depth() const { return depth_; }

  // Python's type name ("str", "int", "list", "dict", "NoneType", "Undefined", ...).
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  uint32_t depth_ = 0;
  bool b_ = false;  // bool value; for lists: is a tuple
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_;   // string, or an undefined value's hint
  std::shared_ptr<const ValueList> l_;
  std::shared_ptr<ValueDict> d_;
  std::shared_ptr<const Callable> c_;
};

// Python bool(v): false for Undefined, None, False, 0, 0.0, "", [], {}.
bool Truthy(const Value& v);

// Python ==: 1 == 1.0 == True, lists and dicts compare element-wise (a tuple never equals a
// list), Undefined == Undefined.
// `work` (optional) grows by the comparison's cost (items visited + string bytes / 16).
bool Equals(const Value& a, const Value& b, int64_t* work = nullptr);

// Python <: numbers, strings (code point order) and lists; INVALID_ARGUMENT for other pairs.
StatusOr<bool> Less(const Value& a, const Value& b);

// Python str(v) (Undefined prints as ""); AppendStr appends to *out.
std::string Str(const Value& v);
void AppendStr(const Value& v, std::string* out);
// Python repr(v) ('it''s' quoting, [..], {..}).
std::string Repr(const Value& v);
// Python repr() of a float ("1.0", "0.1", "1e+16", "inf", "nan").
std::string FloatRepr(double d);

// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) with the default
// separators (", " and ": "; "," at line ends when indenting). indent < 0: none.
// INVALID_ARGUMENT for Undefined and callables ("Object of type Undefined is not JSON serializable").
StatusOr<std::string> ToJson(const Value& v, int indent, bool sort_keys);

// A Value from JSON text (objects keep their key order). INVALID_ARGUMENT on malformed JSON or
// nesting deeper than 100.
StatusOr<Value> ValueFromJson(std::string_view json_text);

// Number of code points in a UTF-8 string (invalid bytes count one each).
size_t CodePointLength(std::string_view s);

}  // namespace icecache::tokenizer::jinja
