// Operators, attribute/item access, slicing, iteration and Python methods (builtins.h).
#include <algorithm>
#include <cmath>
#include <limits>

#include "model/tokenizer/jinja/builtins.h"
#include "model/tokenizer/jinja/string_ops.h"

namespace icecache::tokenizer::jinja {
namespace {

Status TypeError(std::string_view op, const Value& a, const Value& b) {
  return InvalidArgumentError("unsupported operand type(s) for " + std::string(op) + ": '" + a.TypeName() +
                              "' and '" + b.TypeName() + "'");
}

Status UndefinedError(const Value& v) {
  const std::string& hint = v.undefined_hint();
  return InvalidArgumentError(hint.empty() ? "a value is undefined" : hint + " is undefined");
}

StatusOr<Value> IntResult(__int128 r) {
  if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min()) {
    return OutOfRangeError("integer result out of the 64-bit range");
  }
  return Value::Int(static_cast<int64_t>(r));
}

// Python's index normalisation: negative counts from the end; nullopt when out of range.
std::optional<size_t> NormalizeIndex(int64_t i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || static_cast<size_t>(i) >= size) return std::nullopt;
  return static_cast<size_t>(i);
}

Status ExpectArgs(std::string_view what, const CallArgs& args, size_t min, size_t max) {
  if (args.positional.size() + args.keyword.size() < min || args.positional.size() + args.keyword.size() > max) {
    return InvalidArgumentError(std::string(what) + "() takes " +
                                (min == max ? std::to_string(min) : std::to_string(min) + " to " + std::to_string(max)) +
                                " arguments");
  }
  return Status::Ok();
}

StatusOr<std::string> StringArg(std::string_view what, const Value* v) {
  if (!v || !v->is_string()) return InvalidArgumentError(std::string(what) + ": argument must be a string");
  return v->as_string();
}

StatusOr<Value> StrMethod(const std::string& s, std::string_view name, const CallArgs& args, Budget& budget) {
  ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(s.size() / 16)));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 0, 1));
    const Value* chars = args.Get(0, "chars");
    bool l = name != "rstrip", r = name != "lstrip";
    if (chars && !chars->is_none()) {
      ICE_ASSIGN_OR_RETURN(std::string c, StringArg(name, chars));
      return Value::String(StripChars(s, c, l, r));
    }
    return Value::String(StripWhitespace(s, l, r));
  }
  if (name == "startswith" || name == "endswith") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 1, 1));
    const Value& p = args.positional.empty() ? args.keyword[0].second : args.positional[0];
    std::vector<std::string> prefixes;
    if (p.is_string()) {
      prefixes.push_back(p.as_string());
    } else if (p.is_list()) {
      for (const auto& e : p.as_list()) {
        if (!e.is_string()) return InvalidArgumentError(std::string(name) + ": tuple items must be strings");
        prefixes.push_back(e.as_string());
      }
    } else {
      return InvalidArgumentError(std::string(name) + " first arg must be str or a tuple of str, not " + p.TypeName());
    }
    for (const auto& x : prefixes) {
      if (name == "startswith" ? StartsWith(s, x) : EndsWith(s, x)) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split" || name == "rsplit") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 0, 2));
    const Value* sep = args.Get(0, "sep");
    const Value* maxsplit = args.Get(1, "maxsplit");
    int64_t max = maxsplit && maxsplit->is_int() ? maxsplit->as_int() : -1;
    std::vector<std::string> parts;
    if (sep && !sep->is_none()) {
      ICE_ASSIGN_OR_RETURN(std::string d, StringArg(name, sep));
      if (d.empty()) return InvalidArgumentError("empty separator");
      parts = name == "split" ? SplitOn(s, d, max) : RSplitOn(s, d, max);
    } else {
      parts = SplitWhitespace(s, max, name == "rsplit");
    }
    ValueList out;
    for (auto& p : parts) out.push_back(Value::String(std::move(p)));
    return Value::List(std::move(out));
  }
  if (name == "splitlines") {
    ValueList out;
    for (auto& p : SplitOn(s, "\n", -1)) out.push_back(Value::String(std::move(p)));
    if (!out.empty() && out.back().as_string().empty()) out.pop_back();
    return Value::List(std::move(out));
  }
  if (name == "upper") return Value::String(AsciiUpper(s));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "title") return Value::String(Title(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "replace") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 2, 3));
    ICE_ASSIGN_OR_RETURN(std::string old_s, StringArg(name, args.Get(0, "old")));
    ICE_ASSIGN_OR_RETURN(std::string new_s, StringArg(name, args.Get(1, "new")));
    const Value* count = args.Get(2, "count");
    ICE_ASSIGN_OR_RETURN(std::string r,
                         Replace(s, old_s, new_s, count && count->is_int() ? count->as_int() : -1, budget.max_bytes()));
    return Value::String(std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 1, 1));
    ICE_ASSIGN_OR_RETURN(std::string sub, StringArg(name, args.Get(0, "sub")));
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointLength(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::Int(n);
    }
    size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
    if (p == std::string::npos) return Value::Int(-1);
    return Value::Int(static_cast<int64_t>(CodePointLength(std::string_view(s).substr(0, p))));
  }
  if (name == "join") {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 1, 1));
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(args.positional.empty() ? args.keyword[0].second : args.positional[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) return InvalidArgumentError("sequence item " + std::to_string(i) + ": expected str instance");
      if (i) out += s;
      out += items[i].as_string();
      ICE_RETURN_IF_ERROR(budget.CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" || name == "islower") {
    return Value::Bool(CharClassTest(s, name));
  }
  return InvalidArgumentError("'str' object has no method '" + std::string(name) + "'");
}

}  // namespace

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

std::vector<size_t> CodePointStarts(std::string_view s) {
  std::vector<size_t> out;
  size_t i = 0;
  while (i < s.size()) {
    out.push_back(i);
    i += Utf8Length(s, i);
  }
  out.push_back(s.size());
  return out;
}

std::vector<std::string> SplitCodePoints(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t len = Utf8Length(s, i);
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b, Budget& budget) {
  if (op == "~") {
    std::string s = Str(a);
    AppendStr(b, &s);
    ICE_RETURN_IF_ERROR(budget.CheckSize(s.size()));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(s.size() / 16)));
    return Value::String(std::move(s));
  }
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    const __int128 x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? IntResult(x + y) : Value::Float(fx + fy);
    if (op == "-") return ints ? IntResult(x - y) : Value::Float(fx - fy);
    if (op == "*") return ints ? IntResult(x * y) : Value::Float(fx * fy);
    if (op == "/") {
      if (fy == 0) return InvalidArgumentError("division by zero");
      return Value::Float(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) return InvalidArgumentError("integer division or modulo by zero");
        __int128 q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
          q -= 1;
          r += y;
        }
        return IntResult(op == "//" ? q : r);
      }
      if (fy == 0) return InvalidArgumentError("float division by zero");
      double q = std::floor(fx / fy);
      double r = fx - q * fy;
      if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
      return Value::Float(op == "//" ? q : r);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        __int128 r = 1;
        for (__int128 i = 0; i < y; ++i) {
          r *= x;
          if (r > std::numeric_limits<int64_t>::max() || r < std::numeric_limits<int64_t>::min()) {
            return OutOfRangeError("integer result out of the 64-bit range");
          }
          if (r == 0 || r == 1) break;
        }
        return Value::Int(static_cast<int64_t>(r));
      }
      return Value::Float(std::pow(fx, fy));
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    ICE_RETURN_IF_ERROR(budget.CheckSize(a.as_string().size() + b.as_string().size()));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>((a.as_string().size() + b.as_string().size()) / 16)));
    return Value::String(a.as_string() + b.as_string());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    ICE_RETURN_IF_ERROR(budget.CheckListSize(a.as_list().size() + b.as_list().size()));
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(a.as_list().size() + b.as_list().size())));
    ValueList l = a.as_list();
    l.insert(l.end(), b.as_list().begin(), b.as_list().end());
    return Value::List(std::move(l));
  }
  if (op == "*" && (((a.is_string() || a.is_list()) && b.is_int()) || (a.is_int() && (b.is_string() || b.is_list())))) {
    const Value& seq = a.is_int() ? b : a;
    int64_t n = std::max<int64_t>(0, a.is_int() ? a.as_int() : b.as_int());
    size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
    if (unit == 0 || n == 0) return seq.is_string() ? Value::String("") : Value::List({});
    if (static_cast<uint64_t>(n) > budget.max_bytes() / unit + 1) return budget.CheckSize(budget.max_bytes() + 1);
    if (seq.is_string()) {
      ICE_RETURN_IF_ERROR(budget.CheckSize(unit * static_cast<size_t>(n)));
      ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(unit) * n / 16));
    } else {
      ICE_RETURN_IF_ERROR(budget.CheckListSize(unit * static_cast<size_t>(n)));
      ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(unit) * n));
    }
    if (seq.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += seq.as_string();
      return Value::String(std::move(s));
    }
    ValueList l;
    for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq.as_list().begin(), seq.as_list().end());
    return Value::List(std::move(l));
  }
  if (op == "%" && a.is_string()) return UnimplementedError("printf-style string formatting ('...' % value) is not supported");
  return TypeError(op, a, b);
}

StatusOr<Value> UnaryOp(std::string_view op, const Value& a) {
  if (a.is_undefined()) return UndefinedError(a);
  if (!a.is_number()) return InvalidArgumentError("bad operand type for unary " + std::string(op) + ": '" + a.TypeName() + "'");
  if (op == "+") return a.is_bool() ? Value::Int(a.as_int()) : a;
  if (a.is_float()) return Value::Float(-a.as_double());
  if (a.as_int() == std::numeric_limits<int64_t>::min()) return OutOfRangeError("integer result out of the 64-bit range");
  return Value::Int(-a.as_int());
}

int64_t ScanCost(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(v.as_string().size() / 16);
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_dict() || v.is_namespace()) return static_cast<int64_t>(v.as_dict().items.size());
  return 0;
}

StatusOr<bool> Contains(const Value& container, const Value& item, int64_t* work) {
  if (work) *work += ScanCost(container);
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgumentError(std::string("'in <string>' requires string as left operand, not ") + item.TypeName());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& e : container.as_list()) {
        if (Equals(e, item, work)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.as_dict().Find(item.as_string()) != nullptr;
    case Value::Kind::kUndefined: return false;
    default:
      return InvalidArgumentError(std::string("argument of type '") + container.TypeName() + "' is not iterable");
  }
}

bool HasMethod(const Value& receiver, std::string_view name) {
  static const char* kStr[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit",
                               "splitlines", "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                               "count", "join", "isdigit", "isspace", "isalpha", "isupper", "islower"};
  static const char* kDict[] = {"items", "keys", "values", "get"};
  static const char* kList[] = {"count", "index"};
  auto in = [&](const auto& names) {
    return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
  };
  if (receiver.is_string()) return in(kStr);
  if (receiver.is_dict()) return in(kDict);
  if (receiver.is_list()) return in(kList);
  return false;
}

StatusOr<Value> CallMethod(const Value& receiver, std::string_view name, const CallArgs& args, Budget& budget) {
  if (receiver.is_string()) return StrMethod(receiver.as_string(), name, args, budget);
  if (receiver.is_dict()) {
    const ValueDict& d = receiver.as_dict();
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(d.items.size())));
    if (name == "get") {
      ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 1, 2));
      const Value& key = args.positional.empty() ? args.keyword[0].second : args.positional[0];
      const Value* v = key.is_string() ? d.Find(key.as_string()) : nullptr;
      if (v) return *v;
      const Value* def = args.Get(1, "default");
      return def ? *def : Value::None();
    }
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 0, 0));
    ValueList out;
    for (const auto& [k, v] : d.items) {
      if (name == "items") out.push_back(Value::Tuple({Value::String(k), v}));
      else if (name == "keys") out.push_back(Value::String(k));
      else out.push_back(v);
    }
    return Value::List(std::move(out));
  }
  if (receiver.is_list()) {
    ICE_RETURN_IF_ERROR(ExpectArgs(name, args, 1, 1));
    const Value& x = args.positional.empty() ? args.keyword[0].second : args.positional[0];
    const ValueList& l = receiver.as_list();
    ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(l.size())));
    int64_t count = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      int64_t work = 0;
      bool eq = Equals(l[i], x, &work);
      ICE_RETURN_IF_ERROR(budget.Charge(work));
      if (!eq) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "index") return InvalidArgumentError(Repr(x) + " is not in list");
    return Value::Int(count);
  }
  return InvalidArgumentError(std::string("'") + receiver.TypeName() + "' object has no method '" + std::string(name) + "'");
}

StatusOr<Value> GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (HasMethod(obj, name)) {
    auto fn = std::make_shared<Callable>();
    fn->name = std::string(name);
    fn->fn = [obj, method = std::string(name)](const CallArgs& args, Budget& budget) {
      return CallMethod(obj, method, args, budget);
    };
    return Value::Function(std::move(fn));
  }
  if (obj.is_dict() || obj.is_namespace()) {
    const Value* v = obj.as_dict().Find(name);
    if (v) return *v;
  }
  return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no attribute '" + std::string(name) + "'");
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict() || obj.is_namespace()) {
    if (key.is_string()) {
      const Value* v = obj.as_dict().Find(key.as_string());
      if (v) return *v;
      if (obj.is_dict() && HasMethod(obj, key.as_string())) return GetAttr(obj, key.as_string());
      return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no attribute '" + key.as_string() + "'");
    }
    return Value::Undefined("'dict object' has no element " + Repr(key));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_list()) {
      auto i = NormalizeIndex(key.as_int(), obj.as_list().size());
      if (i) return obj.as_list()[*i];
    } else {
      const std::string& str = obj.as_string();
      std::vector<size_t> starts = CodePointStarts(str);
      auto i = NormalizeIndex(key.as_int(), starts.size() - 1);
      if (i) return Value::String(str.substr(starts[*i], starts[*i + 1] - starts[*i]));
    }
    return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no element " + Repr(key));
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no element " + Repr(key));
}

StatusOr<Value> SliceValue(const Value& obj, const Value* start, const Value* stop, const Value* step, Budget& budget) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto as_index = [](const Value* v, const char* what) -> StatusOr<std::optional<int64_t>> {
    if (!v || v->is_none()) return std::optional<int64_t>();
    if (!v->is_int() && !v->is_bool()) {
      return InvalidArgumentError(std::string("slice ") + what + " must be an integer or None, not " + v->TypeName());
    }
    return std::optional<int64_t>(v->as_int());
  };
  ICE_ASSIGN_OR_RETURN(auto b, as_index(start, "start"));
  ICE_ASSIGN_OR_RETURN(auto e, as_index(stop, "stop"));
  ICE_ASSIGN_OR_RETURN(auto s, as_index(step, "step"));
  int64_t st = s.value_or(1);
  if (st == 0) return InvalidArgumentError("slice step cannot be zero");
  std::vector<size_t> starts;  // strings: byte offset of each code point, plus the end
  size_t n;
  if (obj.is_list()) {
    n = obj.as_list().size();
  } else if (obj.is_string()) {
    starts = CodePointStarts(obj.as_string());
    n = starts.size() - 1;
  } else {
    return InvalidArgumentError(std::string("'") + obj.TypeName() + "' object is not subscriptable");
  }
  ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(n)));
  const int64_t len = static_cast<int64_t>(n);
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + len : *v;
    if (st > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  int64_t lo = clamp(b, st > 0 ? 0 : len - 1), hi = clamp(e, st > 0 ? len : -1);
  std::vector<size_t> picks;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) picks.push_back(static_cast<size_t>(i));
  if (obj.is_list()) {
    ValueList out;
    out.reserve(picks.size());
    for (size_t i : picks) out.push_back(obj.as_list()[i]);
    return Value::List(std::move(out));
  }
  const std::string& str = obj.as_string();
  if (st == 1) {  // contiguous
    if (picks.empty()) return Value::String("");
    return Value::String(str.substr(starts[picks.front()], starts[picks.back() + 1] - starts[picks.front()]));
  }
  std::string out;
  for (size_t i : picks) out.append(str, starts[i], starts[i + 1] - starts[i]);
  return Value::String(std::move(out));
}

StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return ValueList{};
    case Value::Kind::kList: return v.as_list();
    case Value::Kind::kString: {
      ValueList out;
      for (auto& c : SplitCodePoints(v.as_string())) out.push_back(Value::String(std::move(c)));
      return out;
    }
    case Value::Kind::kDict: {
      ValueList out;
      for (const auto& kv : v.as_dict().items) out.push_back(Value::String(kv.first));
      return out;
    }
    default: return InvalidArgumentError(std::string("'") + v.TypeName() + "' object is not iterable");
  }
}

}  // namespace icecache::tokenizer::jinja
