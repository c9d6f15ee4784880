#include "model/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

namespace icecache::tokenizer::jinja {

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(std::string key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
namespace {
uint32_t Deepest(const ValueList& items) {
  uint32_t d = 0;
  for (const auto& e : items) d = std::max(d, e.depth());
  return d;
}
uint32_t Deepest(const ValueDict& dict) {
  uint32_t d = 0;
  for (const auto& kv : dict.items) d = std::max(d, kv.second.depth());
  return d;
}
}  // namespace

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = Deepest(items) + 1;
  v.l_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.b_ = true;
  return v;
}
Value Value::Dict(ValueDict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = Deepest(dict) + 1;
  v.d_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}
Value Value::Namespace(ValueDict attributes) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.depth_ = Deepest(attributes) + 1;
  v.d_ = std::make_shared<ValueDict>(std::move(attributes));
  return v;
}
Value Value::Function(std::shared_ptr<const Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.c_ = std::move(fn);
  return v;
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  return s_ ? *s_ : kEmpty;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_double() != 0.0;
    case Value::Kind::kString: return !v.as_string().empty();
    case Value::Kind::kList: return !v.as_list().empty();
    case Value::Kind::kDict: return !v.as_dict().items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable: return true;
  }
  return false;
}

bool Equals(const Value& a, const Value& b, int64_t* work) {
  if (work) ++*work;
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString:
      if (&a.as_string() == &b.as_string()) return true;
      if (work) *work += static_cast<int64_t>(std::min(a.as_string().size(), b.as_string().size()) / 16);
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
      if (&x == &y) return true;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i], work)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      if (&x == &y) return true;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.Find(k);
        if (work) *work += static_cast<int64_t>(y.items.size());
        if (!w || !Equals(v, *w, work)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.namespace_attributes() == &b.namespace_attributes();
    case Value::Kind::kCallable: return a.as_callable() == b.as_callable();
    default: return false;
  }
}

StatusOr<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return InvalidArgumentError(std::string("'<' not supported between instances of '") + a.TypeName() + "' and '" +
                              b.TypeName() + "'");
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

namespace {

void AppendRepr(const Value& v, std::string* out);

void AppendStringRepr(const std::string& s, std::string* out) {
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  out->push_back(quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      *out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c == '\r') {
      *out += "\\r";
    } else if (c == '\t') {
      *out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      *out += buf;
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back(quote);
}

void AppendRepr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kString: AppendStringRepr(v.as_string(), out); return;
    case Value::Kind::kList: {
      out->push_back(v.is_tuple() ? '(' : '[');
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) *out += ", ";
        first = false;
        AppendRepr(e, out);
      }
      if (v.is_tuple() && v.as_list().size() == 1) out->push_back(',');
      out->push_back(v.is_tuple() ? ')' : ']');
      return;
    }
    case Value::Kind::kDict: {
      out->push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.as_dict().items) {
        if (!first) *out += ", ";
        first = false;
        AppendStringRepr(k, out);
        *out += ": ";
        AppendRepr(e, out);
      }
      out->push_back('}');
      return;
    }
    default: AppendStr(v, out); return;
  }
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

Status AppendJson(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  if (depth > 200) return InvalidArgumentError("tojson: value nested too deeply");
  auto newline = [&](int d) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * static_cast<size_t>(d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone: *out += "null"; return Status::Ok();
    case Value::Kind::kBool: *out += v.as_bool() ? "true" : "false"; return Status::Ok();
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return Status::Ok();
    case Value::Kind::kFloat: {
      double d = v.as_double();
      if (std::isnan(d)) *out += "NaN";
      else if (std::isinf(d)) *out += d < 0 ? "-Infinity" : "Infinity";
      else *out += FloatRepr(d);
      return Status::Ok();
    }
    case Value::Kind::kString: AppendJsonString(v.as_string(), out); return Status::Ok();
    case Value::Kind::kList: {
      const auto& l = v.as_list();
      if (l.empty()) {
        *out += "[]";
        return Status::Ok();
      }
      out->push_back('[');
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        ICE_RETURN_IF_ERROR(AppendJson(l[i], indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        *out += "{}";
        return Status::Ok();
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(depth + 1);
        AppendJsonString(items[i]->first, out);
        *out += ": ";
        ICE_RETURN_IF_ERROR(AppendJson(items[i]->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return Status::Ok();
    }
    default:
      return InvalidArgumentError(std::string("Object of type ") + v.TypeName() + " is not JSON serializable");
  }
}

StatusOr<Value> FromJson(const nlohmann::ordered_json& j, int depth) {
  if (depth > 100) return InvalidArgumentError("JSON nested deeper than 100 levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList l;
      l.reserve(j.size());
      for (const auto& e : j) {
        ICE_ASSIGN_OR_RETURN(Value v, FromJson(e, depth + 1));
        l.push_back(std::move(v));
      }
      return Value::List(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        ICE_ASSIGN_OR_RETURN(Value v, FromJson(it.value(), depth + 1));
        d.Set(it.key(), std::move(v));
      }
      return Value::Dict(std::move(d));
    }
    default: return Value::None();
  }
}

}  // namespace

void AppendStr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return;
    case Value::Kind::kNone: *out += "None"; return;
    case Value::Kind::kBool: *out += v.as_bool() ? "True" : "False"; return;
    case Value::Kind::kInt: *out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: *out += FloatRepr(v.as_double()); return;
    case Value::Kind::kString: *out += v.as_string(); return;
    case Value::Kind::kList:
    case Value::Kind::kDict: AppendRepr(v, out); return;
    case Value::Kind::kNamespace: *out += "<Namespace>"; return;
    case Value::Kind::kCallable: *out += "<function>"; return;
  }
}

std::string Str(const Value& v) {
  std::string out;
  AppendStr(v, &out);
  return out;
}

std::string Repr(const Value& v) {
  if (v.is_undefined()) return "Undefined";
  std::string out;
  AppendRepr(v, &out);
  return out;
}

StatusOr<std::string> ToJson(const Value& v, int indent, bool sort_keys) {
  std::string out;
  ICE_RETURN_IF_ERROR(AppendJson(v, indent, sort_keys, 0, &out));
  return out;
}

StatusOr<Value> ValueFromJson(std::string_view json_text) {
  auto j = nlohmann::ordered_json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError("malformed JSON");
  return FromJson(j, 0);
}

size_t CodePointLength(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        len = 1;
        break;
      }
    }
    i += len;
  }
  return n;
}

}  // namespace icecache::tokenizer::jinja
