// Filters and tests (builtins.h).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "model/tokenizer/jinja/builtins.h"
#include "model/tokenizer/jinja/string_ops.h"

namespace icecache::tokenizer::jinja {
namespace {

constexpr const char* kFilters[] = {
    "abs", "attr", "capitalize", "count", "d", "default", "e", "escape", "first", "float", "indent", "int",
    "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim",
    "unique", "upper", "wordcount"};
constexpr const char* kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
    "float", "ge", "greaterthan", "gt", "in", "integer", "iterable", "le", "lessthan", "lower", "lt",
    "mapping", "ne", "none", "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined",
    "upper"};

template <size_t N>
bool In(const char* const (&names)[N], std::string_view name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

Status NeedArgs(std::string_view what, const CallArgs& args, size_t n) {
  if (args.positional.size() + args.keyword.size() >= n) return Status::Ok();
  return InvalidArgumentError(std::string(what) + " needs " + std::to_string(n) + " argument(s)");
}

// Jinja's attribute getter for selectattr/map/sort/join/sum: "a.b.0" walks attributes and items.
StatusOr<Value> GetPath(const Value& item, const std::string& path) {
  Value cur = item;
  size_t b = 0;
  while (b <= path.size()) {
    size_t e = path.find('.', b);
    std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (cur.is_undefined()) return cur;
    if (digits && part.size() > 18) return Value::Undefined("item " + part);
    ICE_ASSIGN_OR_RETURN(cur, digits ? GetItem(cur, Value::Int(std::strtoll(part.c_str(), nullptr, 10)))
                                     : GetItem(cur, Value::String(part)));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return cur;
}

// The test named by args[first] applied with the remaining positional arguments.
StatusOr<bool> RunTest(const Value& v, const CallArgs& args, size_t first) {
  if (args.positional.size() <= first) return Truthy(v);
  const Value& name = args.positional[first];
  if (!name.is_string()) return InvalidArgumentError("the test name must be a string");
  if (!IsKnownTest(name.as_string())) return UnimplementedError("the test '" + name.as_string() + "' is not supported");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + static_cast<long>(first) + 1, args.positional.end());
  return ApplyTest(name.as_string(), v, rest);
}

StatusOr<Value> SelectFilter(std::string_view name, const Value& input, const CallArgs& args, Budget& budget) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(items.size())));
  std::string attr;
  if (by_attr) {
    ICE_RETURN_IF_ERROR(NeedArgs(name, args, 1));
    if (args.positional.empty() || !args.positional[0].is_string()) return InvalidArgumentError(std::string(name) + ": the attribute must be a string");
    attr = args.positional[0].as_string();
  }
  ValueList out;
  for (const auto& item : items) {
    Value v = item;
    if (by_attr) {
      ICE_ASSIGN_OR_RETURN(v, GetPath(item, attr));
    }
    ICE_ASSIGN_OR_RETURN(bool pass, RunTest(v, args, by_attr ? 1 : 0));
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

StatusOr<Value> SortFilter(const Value& input, const CallArgs& args) {
  ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
  const Value* rev = args.Get(0, "reverse");
  const Value* cs = args.Get(1, "case_sensitive");
  const Value* attr = args.Get(2, "attribute");
  bool case_sensitive = cs && Truthy(*cs);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& it : items) {
    Value k = it;
    if (attr && attr->is_string()) {
      ICE_ASSIGN_OR_RETURN(k, GetPath(it, attr->as_string()));
    }
    if (!case_sensitive && k.is_string()) k = Value::String(Lower(k.as_string()));
    keyed.emplace_back(std::move(k), it);
  }
  Status error = Status::Ok();
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto lt = Less(a.first, b.first);
    if (!lt.ok()) {
      error = lt.status();
      return false;
    }
    return *lt;
  });
  ICE_RETURN_IF_ERROR(error);
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  if (rev && Truthy(*rev)) std::reverse(out.begin(), out.end());
  return Value::List(std::move(out));
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return In(kFilters, name); }
bool IsKnownTest(std::string_view name) { return In(kTests, name); }

StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args, Budget& budget) {
  // Filters that scan their input pay for it; these do not (length of a string counts code points).
  const bool constant_time = name == "default" || name == "d" || name == "safe" || name == "attr" ||
                             ((name == "length" || name == "count" || name == "first" || name == "last") &&
                              !input.is_string());
  if (!constant_time) ICE_RETURN_IF_ERROR(budget.Charge(ScanCost(input)));
  else if (input.is_string()) ICE_RETURN_IF_ERROR(budget.Charge(ScanCost(input)));
  if (name == "default" || name == "d") {
    const Value* def = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    bool use_default = input.is_undefined() || (boolean && Truthy(*boolean) && !Truthy(input));
    if (!use_default) return input;
    return def ? *def : Value::String("");
  }
  if (name == "safe") return input;
  if (name == "tojson") {
    const Value* indent = args.Get(1, "indent");
    const Value* ensure_ascii = args.Get(0, "ensure_ascii");
    const Value* sort_keys = args.Get(3, "sort_keys");
    if (ensure_ascii && Truthy(*ensure_ascii)) return UnimplementedError("tojson(ensure_ascii=true) is not supported");
    if (args.Get(2, "separators") && !args.Get(2, "separators")->is_none()) {
      return UnimplementedError("tojson(separators=...) is not supported");
    }
    int ind = indent && (indent->is_int() || indent->is_bool()) ? static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64)) : -1;
    ICE_ASSIGN_OR_RETURN(std::string s, ToJson(input, ind, sort_keys && Truthy(*sort_keys)));
    ICE_RETURN_IF_ERROR(budget.CheckSize(s.size()));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(s.size() / 16)));
    return Value::String(std::move(s));
  }
  if (name == "length" || name == "count") {
    switch (input.kind()) {
      case Value::Kind::kUndefined: return Value::Int(0);
      case Value::Kind::kString: return Value::Int(static_cast<int64_t>(CodePointLength(input.as_string())));
      case Value::Kind::kList: return Value::Int(static_cast<int64_t>(input.as_list().size()));
      case Value::Kind::kDict: return Value::Int(static_cast<int64_t>(input.as_dict().items.size()));
      default: return InvalidArgumentError(std::string("object of type '") + input.TypeName() + "' has no len()");
    }
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::List({});
    if (!input.is_dict()) return InvalidArgumentError(std::string("items: expected a mapping, got ") + input.TypeName());
    return CallMethod(input, "items", CallArgs{}, budget);
  }
  if (name == "attr") {
    ICE_RETURN_IF_ERROR(NeedArgs(name, args, 1));
    if (!args.positional[0].is_string()) return InvalidArgumentError("attr: the name must be a string");
    return GetAttr(input, args.positional[0].as_string());
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return SelectFilter(name, input, args, budget);
  }
  if (name == "map") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(items.size())));
    const Value* attribute = args.Get(99, "attribute");
    ValueList out;
    if (attribute) {
      if (!attribute->is_string()) return InvalidArgumentError("map: attribute must be a string");
      const Value* def = args.Get(99, "default");
      for (const auto& it : items) {
        ICE_ASSIGN_OR_RETURN(Value v, GetPath(it, attribute->as_string()));
        out.push_back(v.is_undefined() && def ? *def : v);
      }
      return Value::List(std::move(out));
    }
    ICE_RETURN_IF_ERROR(NeedArgs(name, args, 1));
    if (!args.positional[0].is_string() || !IsKnownFilter(args.positional[0].as_string())) {
      return UnimplementedError("map: unknown filter " + Repr(args.positional[0]));
    }
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    for (const auto& it : items) {
      ICE_ASSIGN_OR_RETURN(Value v, ApplyFilter(args.positional[0].as_string(), it, rest, budget));
      out.push_back(std::move(v));
    }
    return Value::List(std::move(out));
  }
  if (name == "join") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    const Value* sep = args.Get(0, "d");
    const Value* attribute = args.Get(1, "attribute");
    std::string d = sep ? Str(*sep) : "";
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += d;
      if (attribute && attribute->is_string()) {
        ICE_ASSIGN_OR_RETURN(Value v, GetPath(items[i], attribute->as_string()));
        AppendStr(v, &out);
      } else {
        AppendStr(items[i], &out);
      }
      ICE_RETURN_IF_ERROR(budget.CheckSize(out.size()));
    }
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(items.size() + out.size() / 16)));
    return Value::String(std::move(out));
  }
  if (name == "list") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(items.size())));
    return Value::List(std::move(items));
  }
  if ((name == "first" || name == "last") && input.is_list()) {
    const ValueList& l = input.as_list();
    if (l.empty()) return Value::Undefined(std::string("the ") + std::string(name) + " item of an empty sequence");
    return name == "first" ? l.front() : l.back();
  }
  if (name == "first" || name == "last") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    if (items.empty()) return Value::Undefined(std::string("the ") + std::string(name) + " item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (input.is_string()) {
      auto cps = SplitCodePoints(input.as_string());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::String(std::move(out));
    }
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sort") return SortFilter(input, args);
  if (name == "unique") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    ValueList out;
    for (const auto& it : items) {
      int64_t work = 0;
      bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) { return Equals(o, it, &work); });
      ICE_RETURN_IF_ERROR(budget.Charge(work));
      if (!seen) out.push_back(it);
    }
    return Value::List(std::move(out));
  }
  if (name == "min" || name == "max") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    if (items.empty()) return Value::Undefined("min/max of an empty sequence");
    Value best = items[0];
    for (size_t i = 1; i < items.size(); ++i) {
      ICE_ASSIGN_OR_RETURN(bool lt, name == "min" ? Less(items[i], best) : Less(best, items[i]));
      if (lt) best = items[i];
    }
    return best;
  }
  if (name == "sum") {
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(input));
    const Value* attribute = args.Get(0, "attribute");
    const Value* start = args.Get(1, "start");
    Value total = start ? *start : Value::Int(0);
    for (const auto& it : items) {
      Value v = it;
      if (attribute && attribute->is_string()) {
        ICE_ASSIGN_OR_RETURN(v, GetPath(it, attribute->as_string()));
      }
      ICE_ASSIGN_OR_RETURN(total, BinaryOp("+", total, v, budget));
    }
    return total;
  }
  if (name == "abs") {
    if (!input.is_number()) return InvalidArgumentError(std::string("bad operand type for abs(): '") + input.TypeName() + "'");
    if (input.is_float()) return Value::Float(std::fabs(input.as_double()));
    if (input.as_int() < 0) return UnaryOp("-", input);
    return Value::Int(input.as_int());
  }
  if (name == "int") {
    const Value* def = args.Get(0, "default");
    if (input.is_number()) return input.is_float() ? Value::Int(static_cast<int64_t>(input.as_double())) : Value::Int(input.as_int());
    if (input.is_string()) {
      std::string s = StripWhitespace(input.as_string(), true, true);
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == '\0' && errno == 0) return Value::Int(v);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0' && std::isfinite(d)) return Value::Int(static_cast<int64_t>(d));
    }
    return def ? *def : Value::Int(0);
  }
  if (name == "float") {
    const Value* def = args.Get(0, "default");
    if (input.is_number()) return Value::Float(input.as_double());
    if (input.is_string()) {
      std::string s = StripWhitespace(input.as_string(), true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == '\0') return Value::Float(d);
    }
    return def ? *def : Value::Float(0.0);
  }
  if (name == "round") {
    const Value* precision = args.Get(0, "precision");
    const Value* method = args.Get(1, "method");
    if (!input.is_number()) return InvalidArgumentError("round: expected a number");
    int64_t p = precision && precision->is_int() ? precision->as_int() : 0;
    std::string m = method && method->is_string() ? method->as_string() : "common";
    double scale = std::pow(10.0, static_cast<double>(p));
    double x = input.as_double() * scale;
    double r = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);  // round half to even, as Python
    return Value::Float(r / scale);
  }
  // String filters: the input is converted with str() (Undefined -> "").
  std::string s = Str(input);
  ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(s.size() / 16)));
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    if (chars && chars->is_string()) return Value::String(StripChars(s, chars->as_string(), true, true));
    return Value::String(StripWhitespace(s, true, true));
  }
  if (name == "string") return Value::String(std::move(s));
  if (name == "upper") return Value::String(AsciiUpper(s));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "title") return Value::String(Title(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "e" || name == "escape") return Value::String(Escape(s));
  if (name == "wordcount") return Value::Int(static_cast<int64_t>(SplitWhitespace(s, -1, false).size()));
  if (name == "replace") {
    ICE_RETURN_IF_ERROR(NeedArgs(name, args, 2));
    const Value* old_s = args.Get(0, "old");
    const Value* new_s = args.Get(1, "new");
    const Value* count = args.Get(2, "count");
    ICE_ASSIGN_OR_RETURN(std::string r, Replace(s, Str(*old_s), Str(*new_s),
                                                count && count->is_int() ? count->as_int() : -1, budget.max_bytes()));
    return Value::String(std::move(r));
  }
  if (name == "indent") {
    const Value* width = args.Get(0, "width");
    const Value* first = args.Get(1, "first");
    const Value* blank = args.Get(2, "blank");
    std::string pad = width && width->is_string() ? width->as_string()
                                                  : std::string(static_cast<size_t>(std::clamp<int64_t>(width && width->is_int() ? width->as_int() : 4, 0, 256)), ' ');
    auto lines = SplitOn(s, "\n", -1);
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n";
      bool indent_it = (i > 0 || (first && Truthy(*first))) && (!lines[i].empty() || (blank && Truthy(*blank)));
      if (indent_it) out += pad;
      out += lines[i];
      ICE_RETURN_IF_ERROR(budget.CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  return UnimplementedError("the filter '" + std::string(name) + "' is not supported");
}

StatusOr<bool> ApplyTest(std::string_view name, const Value& v, const CallArgs& args) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && Lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && AsciiUpper(v.as_string()) == v.as_string();
  if (name == "filter" || name == "test") return v.is_string() && (name == "filter" ? IsKnownFilter(v.as_string()) : IsKnownTest(v.as_string()));
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) return InvalidArgumentError(std::string("the test '") + std::string(name) + "' needs an integer");
    bool odd = (v.as_int() % 2) != 0;
    return name == "odd" ? odd : !odd;
  }
  ICE_RETURN_IF_ERROR(NeedArgs(name, args, 1));
  const Value& other = args.positional.empty() ? args.keyword[0].second : args.positional[0];
  if (name == "divisibleby") {
    if (!v.is_number() || !other.is_number()) return InvalidArgumentError("divisibleby needs numbers");
    if (!v.is_float() && !other.is_float()) {
      if (other.as_int() == 0) return InvalidArgumentError("integer division or modulo by zero");
      return v.as_int() % other.as_int() == 0;
    }
    if (other.as_double() == 0) return InvalidArgumentError("float modulo by zero");
    return std::fmod(v.as_double(), other.as_double()) == 0;
  }
  if (name == "eq" || name == "equalto") return Equals(v, other);
  if (name == "ne") return !Equals(v, other);
  if (name == "sameas") {
    if (v.is_number() || v.is_none() || v.is_undefined()) return v.kind() == other.kind() && Equals(v, other);
    return Equals(v, other) && v.kind() == other.kind();
  }
  if (name == "in") return Contains(other, v);
  if (name == "lt" || name == "lessthan") return Less(v, other);
  if (name == "gt" || name == "greaterthan") return Less(other, v);
  if (name == "le") {
    ICE_ASSIGN_OR_RETURN(bool gt, Less(other, v));
    return !gt;
  }
  if (name == "ge") {
    ICE_ASSIGN_OR_RETURN(bool lt, Less(v, other));
    return !lt;
  }
  return UnimplementedError("the test '" + std::string(name) + "' is not supported");
}

}  // namespace icecache::tokenizer::jinja
