#include "model/tokenizer/jinja/interpreter.h"

#include <algorithm>
#include <chrono>

#include "model/tokenizer/jinja/builtins.h"

namespace icecache::tokenizer::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox limit on range()
// Work units of one loop iteration (building the `loop` object costs about as much as eight
// expression evaluations), so that the step limit bounds time.
constexpr int64_t kIterationCost = 8;
constexpr uint32_t kMaxValueDepth = 100;  // lists/dicts/namespaces inside each other

std::string Loc(int line, int column) { return "line " + std::to_string(line) + ", column " + std::to_string(column); }
std::string Where(int line, int column) { return Loc(line, column) + ": "; }

class Interpreter {
 public:
  Interpreter(const ValueDict& context, const RenderOptions& options)
      : context_(context), options_(options), budget_(options.limits.max_steps, options.limits.max_output_bytes) {
    scopes_.emplace_back();
    InstallGlobals();
  }

  // A namespace can hold itself (ns.me = [ns]); clearing every namespace breaks such cycles so
  // nothing a render built outlives it.
  ~Interpreter() {
    for (auto& ns : namespaces_) ns.namespace_attributes().items.clear();
  }

  StatusOr<std::string> Run(const Program& program) {
    std::string out;
    out_ = &out;
    auto flow = ExecBody(program.body);
    if (raised_) {
      return InvalidArgumentError(*raised_ + " (raise_exception at " + raised_where_ + ")");
    }
    if (!flow.ok()) return flow.status();
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::vector<std::pair<std::string, Value>>;

  // ---- variables ----

  const Value* FindIn(const Scope& s, std::string_view name) const {
    for (auto it = s.rbegin(); it != s.rend(); ++it) {
      if (it->first == name) return &it->second;
    }
    return nullptr;
  }

  Value Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > floor_;) {
      if (const Value* v = FindIn(scopes_[i], name)) return *v;
    }
    if (floor_ > 0) {
      if (const Value* v = FindIn(scopes_[0], name)) return *v;
    }
    if (const Value* v = context_.Find(name)) return *v;
    if (const Value* v = globals_.Find(name)) return *v;
    return Value::Undefined("'" + name + "'");
  }

  void Assign(const std::string& name, Value v) {
    Scope& s = scopes_.back();
    for (auto& kv : s) {
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    }
    s.emplace_back(name, std::move(v));
  }

  Status Unpack(const std::vector<std::string>& targets, const Value& v, int line, int column) {
    if (targets.size() == 1) {
      Assign(targets[0], v);
      return Status::Ok();
    }
    if (!v.is_list() && !v.is_string()) {
      return InvalidArgumentError(Where(line, column) + "cannot unpack non-iterable " + v.TypeName() + " object");
    }
    ICE_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.size() != targets.size()) {
      return InvalidArgumentError(Where(line, column) + (items.size() > targets.size() ? "too many" : "not enough") +
                                  " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                                  std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) Assign(targets[i], items[i]);
    return Status::Ok();
  }

  // ---- globals ----

  void AddGlobal(const std::string& name, std::function<StatusOr<Value>(const CallArgs&, Budget&)> fn) {
    auto c = std::make_shared<Callable>();
    c->name = name;
    c->fn = std::move(fn);
    globals_.Set(name, Value::Function(std::move(c)));
  }

  void InstallGlobals() {
    AddGlobal("range", [](const CallArgs& args, Budget& budget) -> StatusOr<Value> {
      if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
        return InvalidArgumentError("range() takes 1 to 3 positional arguments");
      }
      for (const auto& a : args.positional) {
        if (!a.is_int() && !a.is_bool()) return InvalidArgumentError(std::string("range() needs integers, got ") + a.TypeName());
      }
      int64_t start = 0, stop, step = 1;
      if (args.positional.size() == 1) {
        stop = args.positional[0].as_int();
      } else {
        start = args.positional[0].as_int();
        stop = args.positional[1].as_int();
        if (args.positional.size() == 3) step = args.positional[2].as_int();
      }
      if (step == 0) return InvalidArgumentError("range() arg 3 must not be zero");
      __int128 count = step > 0 ? (static_cast<__int128>(stop) - start + step - 1) / step
                                : (static_cast<__int128>(start) - stop - step - 1) / -step;
      if (count < 0) count = 0;
      if (count > kMaxRange) {
        return ResourceExhaustedError("range() of " + std::to_string(static_cast<int64_t>(count)) +
                                      " items is too big (at most " + std::to_string(kMaxRange) + ")");
      }
      ICE_RETURN_IF_ERROR(budget.Charge(static_cast<int64_t>(count)));
      ValueList out;
      out.reserve(static_cast<size_t>(count));
      for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.push_back(Value::Int(start + i * step));
      return Value::List(std::move(out));
    });
    AddGlobal("namespace", [this](const CallArgs& args, Budget&) -> StatusOr<Value> {
      ValueDict attrs;
      for (const auto& p : args.positional) {
        if (!p.is_dict()) return InvalidArgumentError("namespace() takes keyword arguments or a dict");
        for (const auto& kv : p.as_dict().items) attrs.Set(kv.first, kv.second);
      }
      for (const auto& [k, v] : args.keyword) attrs.Set(k, v);
      Value ns = Value::Namespace(std::move(attrs));
      namespaces_.push_back(ns);
      return ns;
    });
    AddGlobal("dict", [](const CallArgs& args, Budget&) -> StatusOr<Value> {
      ValueDict d;
      for (const auto& p : args.positional) {
        if (!p.is_dict()) return InvalidArgumentError("dict() takes keyword arguments or a dict");
        for (const auto& kv : p.as_dict().items) d.Set(kv.first, kv.second);
      }
      for (const auto& [k, v] : args.keyword) d.Set(k, v);
      return Value::Dict(std::move(d));
    });
    AddGlobal("raise_exception", [this](const CallArgs& args, Budget&) -> StatusOr<Value> {
      raised_ = args.positional.empty() ? std::string("raise_exception() called") : Str(args.positional[0]);
      return AbortedError(*raised_);
    });
    AddGlobal("strftime_now", [this](const CallArgs& args, Budget&) -> StatusOr<Value> {
      if (args.positional.size() != 1 || !args.positional[0].is_string()) {
        return InvalidArgumentError("strftime_now() takes one format string");
      }
      std::tm tm{};
      if (options_.now) {
        tm = *options_.now;
      } else {
        std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
        localtime_r(&t, &tm);
      }
      const std::string& fmt = args.positional[0].as_string();
      if (fmt.size() > 256) return InvalidArgumentError("strftime_now(): format too long");
      char buf[1024];
      size_t n = fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
      return Value::String(std::string(buf, n));
    });
  }

  // ---- output ----

  Status Write(std::string_view s) {
    output_bytes_ += s.size();
    if (output_bytes_ > options_.limits.max_output_bytes) {
      return ResourceExhaustedError("the template produced more than " + std::to_string(options_.limits.max_output_bytes) +
                                    " bytes of output");
    }
    out_->append(s);
    return Status::Ok();
  }

  // Renders `body` into a new string (block set, macro call).
  StatusOr<std::string> Capture(const StmtList& body) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    auto flow = ExecBody(body);
    out_ = saved;
    if (!flow.ok()) return flow.status();
    return buf;
  }

  // ---- statements ----

  StatusOr<Flow> ExecBody(const StmtList& body) {
    for (const auto& s : body) {
      ICE_ASSIGN_OR_RETURN(Flow f, Exec(*s));
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> Exec(const Stmt& s) {
    ICE_RETURN_IF_ERROR(budget_.Charge(1));
    switch (s.kind) {
      case Stmt::Kind::kData: ICE_RETURN_IF_ERROR(Write(s.text)); return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        ICE_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (v.is_string()) {
          ICE_RETURN_IF_ERROR(Write(v.as_string()));
        } else {
          ICE_RETURN_IF_ERROR(Write(Str(v)));
        }
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i) {
          ICE_ASSIGN_OR_RETURN(Value c, Eval(*s.conds[i]));
          if (Truthy(c)) return ExecBody(s.bodies[i]);
        }
        return ExecBody(s.else_body);
      case Stmt::Kind::kFor: return ExecFor(s);
      case Stmt::Kind::kSet: {
        ICE_ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        if (!s.ns_name.empty()) {
          Value ns = Lookup(s.ns_name);
          if (!ns.is_namespace()) {
            return InvalidArgumentError(Where(s.line, s.column) + "cannot assign attribute '" + s.ns_attr + "' on '" +
                                        s.ns_name + "', which is not a namespace()");
          }
          ns.namespace_attributes().Set(s.ns_attr, std::move(v));
          return Flow::kNormal;
        }
        ICE_RETURN_IF_ERROR(Unpack(s.targets, v, s.line, s.column));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        ICE_ASSIGN_OR_RETURN(std::string text, Capture(s.bodies[0]));
        Assign(s.targets[0], Value::String(std::move(text)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro: {
        auto c = std::make_shared<Callable>();
        c->name = s.name;
        c->macro = &s;
        Assign(s.name, Value::Function(std::move(c)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak: return Flow::kBreak;
      case Stmt::Kind::kContinue: return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> ExecFor(const Stmt& s) {
    ICE_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    auto items = Iterate(iterable);
    if (!items.ok()) return InvalidArgumentError(Where(s.expr->line, s.expr->column) + items.status().message());
    ValueList list = std::move(items).value();
    ICE_RETURN_IF_ERROR(budget_.Charge(static_cast<int64_t>(list.size())));
    ICE_ASSIGN_OR_RETURN(bool ran, RunLoop(s, list));
    if (!ran) return ExecBody(s.else_body);
    return Flow::kNormal;
  }

  // Runs `fn` in a fresh innermost scope (as Jinja, each loop iteration starts with one: what an
  // iteration assigns is gone in the next and after the loop).
  template <typename Fn>
  auto InScope(Fn fn) {
    scopes_.emplace_back();
    auto r = fn();
    scopes_.pop_back();
    return r;
  }

  // Returns whether the body ran at least once.
  StatusOr<bool> RunLoop(const Stmt& s, ValueList& list) {
    if (s.filter) {
      ValueList kept;
      for (const auto& item : list) {
        ICE_RETURN_IF_ERROR(budget_.Charge(1));
        ICE_ASSIGN_OR_RETURN(Value keep, InScope([&]() -> StatusOr<Value> {
          ICE_RETURN_IF_ERROR(Unpack(s.targets, item, s.line, s.column));
          return Eval(*s.filter);
        }));
        if (Truthy(keep)) kept.push_back(item);
      }
      list = std::move(kept);
    }
    const size_t n = list.size();
    // Built once per loop: loop.cycle reads the current index through a shared counter.
    auto index = std::make_shared<size_t>(0);
    auto cycle = std::make_shared<Callable>();
    cycle->name = "loop.cycle";
    cycle->fn = [index](const CallArgs& args, Budget&) -> StatusOr<Value> {
      if (args.positional.empty()) return InvalidArgumentError("loop.cycle() needs at least one argument");
      return args.positional[*index % args.positional.size()];
    };
    const Value cycle_value = Value::Function(std::move(cycle));
    const Value no_prev = Value::Undefined("'loop.previtem' (first iteration)");
    const Value no_next = Value::Undefined("'loop.nextitem' (last iteration)");
    for (size_t i = 0; i < n; ++i) {
      ICE_RETURN_IF_ERROR(budget_.Charge(kIterationCost));
      scopes_.emplace_back();
      *index = i;
      auto f = Iteration(s, list, i, cycle_value, no_prev, no_next);
      scopes_.pop_back();
      if (!f.ok()) return f.status();
      if (*f == Flow::kBreak) break;
    }
    return n > 0;
  }

  StatusOr<Flow> Iteration(const Stmt& s, const ValueList& list, size_t i, const Value& cycle_value,
                           const Value& no_prev, const Value& no_next) {
    const size_t n = list.size();
    {
      ICE_RETURN_IF_ERROR(Unpack(s.targets, list[i], s.line, s.column));
      ValueDict loop;
      loop.items.reserve(12);
      loop.items.emplace_back("index0", Value::Int(static_cast<int64_t>(i)));
      loop.items.emplace_back("index", Value::Int(static_cast<int64_t>(i + 1)));
      loop.items.emplace_back("revindex0", Value::Int(static_cast<int64_t>(n - i - 1)));
      loop.items.emplace_back("revindex", Value::Int(static_cast<int64_t>(n - i)));
      loop.items.emplace_back("first", Value::Bool(i == 0));
      loop.items.emplace_back("last", Value::Bool(i + 1 == n));
      loop.items.emplace_back("length", Value::Int(static_cast<int64_t>(n)));
      loop.items.emplace_back("depth", Value::Int(1));
      loop.items.emplace_back("depth0", Value::Int(0));
      loop.items.emplace_back("previtem", i > 0 ? list[i - 1] : no_prev);
      loop.items.emplace_back("nextitem", i + 1 < n ? list[i + 1] : no_next);
      loop.items.emplace_back("cycle", cycle_value);
      Assign("loop", Value::Dict(std::move(loop)));
    }
    return ExecBody(s.bodies[0]);
  }

  // ---- expressions ----

  static Status At(const Expr& e, const Status& s) {
    if (s.ok() || s.message().rfind("line ", 0) == 0 || s.code() == StatusCode::kAborted) return s;
    return Status(s.code(), Where(e.line, e.column) + s.message());
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.children.size(); ++i) {
      ICE_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, ex] : e.kwargs) {
      ICE_ASSIGN_OR_RETURN(Value v, Eval(*ex));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  StatusOr<Value> Eval(const Expr& e) {
    auto v = EvalInner(e);
    if (!v.ok()) return At(e, v.status());
    if (v->depth() > kMaxValueDepth) {
      return ResourceExhaustedError(Where(e.line, e.column) + "the template built a value nested deeper than " +
                                    std::to_string(kMaxValueDepth) + " levels");
    }
    return v;
  }

  StatusOr<Value> EvalInner(const Expr& e) {
    ICE_RETURN_IF_ERROR(budget_.Charge(1));
    switch (e.kind) {
      case Expr::Kind::kLiteral: return e.literal;
      case Expr::Kind::kName: return Lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const auto& c : e.children) {
          ICE_ASSIGN_OR_RETURN(Value v, Eval(*c));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ICE_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i]));
          if (!k.is_string()) return UnimplementedError("dict keys other than strings are not supported");
          ICE_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1]));
          d.Set(k.as_string(), std::move(v));
        }
        return Value::Dict(std::move(d));
      }
      case Expr::Kind::kAttr: {
        ICE_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kSubscript: {
        ICE_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        ICE_ASSIGN_OR_RETURN(Value key, Eval(*e.children[1]));
        if (obj.is_string()) ICE_RETURN_IF_ERROR(budget_.Charge(ScanCost(obj)));  // indexing decodes code points
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ICE_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.children[static_cast<size_t>(i) + 1]) {
            ICE_ASSIGN_OR_RETURN(parts[i], Eval(*e.children[static_cast<size_t>(i) + 1]));
          }
        }
        return SliceValue(obj, e.children[1] ? &parts[0] : nullptr, e.children[2] ? &parts[1] : nullptr,
                          e.children[3] ? &parts[2] : nullptr, budget_);
      }
      case Expr::Kind::kCall: return EvalCall(e);
      case Expr::Kind::kFilter: {
        ICE_ASSIGN_OR_RETURN(Value input, Eval(*e.children[0]));
        ICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, input, args, budget_);
      }
      case Expr::Kind::kTest: {
        ICE_ASSIGN_OR_RETURN(Value input, Eval(*e.children[0]));
        ICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        ICE_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, input, args));
        return Value::Bool(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        ICE_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        return UnaryOp(e.name, v);
      }
      case Expr::Kind::kBinary: {
        ICE_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        ICE_ASSIGN_OR_RETURN(Value b, Eval(*e.children[1]));
        return BinaryOp(e.name, a, b, budget_);
      }
      case Expr::Kind::kCompare: {
        ICE_ASSIGN_OR_RETURN(Value left, Eval(*e.children[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ICE_ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1]));
          ICE_ASSIGN_OR_RETURN(bool r, Compare(e.ops[i], left, right));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kAnd: {
        ICE_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        if (!Truthy(a)) return a;
        return Eval(*e.children[1]);
      }
      case Expr::Kind::kOr: {
        ICE_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        if (Truthy(a)) return a;
        return Eval(*e.children[1]);
      }
      case Expr::Kind::kNot: {
        ICE_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        return Value::Bool(!Truthy(a));
      }
      case Expr::Kind::kCond: {
        ICE_ASSIGN_OR_RETURN(Value c, Eval(*e.children[1]));
        if (Truthy(c)) return Eval(*e.children[0]);
        if (e.children[2]) return Eval(*e.children[2]);
        return Value::Undefined("the else branch of a conditional expression");
      }
    }
    return InternalError("unknown expression kind");
  }

  StatusOr<bool> Compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==" || op == "!=") {
      int64_t work = 0;
      bool eq = Equals(a, b, &work);
      ICE_RETURN_IF_ERROR(budget_.Charge(work));
      return op == "==" ? eq : !eq;
    }
    if (op == "<") return Less(a, b);
    if (op == ">") return Less(b, a);
    if (op == "<=" || op == ">=") {
      ICE_ASSIGN_OR_RETURN(bool lt, op == "<=" ? Less(b, a) : Less(a, b));
      return !lt;
    }
    int64_t work = 0;
    auto in = Contains(b, a, &work);
    ICE_RETURN_IF_ERROR(budget_.Charge(work));
    if (!in.ok()) return in.status();
    return op == "in" ? *in : !*in;
  }

  StatusOr<Value> EvalCall(const Expr& e) {
    const Expr& callee = *e.children[0];
    Value fn;
    if (callee.kind == Expr::Kind::kAttr) {
      ICE_ASSIGN_OR_RETURN(Value obj, Eval(*callee.children[0]));
      if (HasMethod(obj, callee.name)) {
        ICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return CallMethod(obj, callee.name, args, budget_);
      }
      ICE_ASSIGN_OR_RETURN(fn, GetAttr(obj, callee.name));
    } else {
      ICE_ASSIGN_OR_RETURN(fn, Eval(callee));
    }
    if (fn.is_undefined()) return InvalidArgumentError(fn.undefined_hint() + " is undefined and cannot be called");
    if (!fn.is_callable()) return InvalidArgumentError(std::string("'") + fn.TypeName() + "' object is not callable");
    ICE_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
    const Callable& c = *fn.as_callable();
    if (c.macro) return CallMacro(*c.macro, args);
    auto r = c.fn(args, budget_);
    if (!r.ok() && raised_ && raised_where_.empty()) raised_where_ = Loc(e.line, e.column);
    return r;
  }

  StatusOr<Value> CallMacro(const Stmt& m, const CallArgs& args) {
    if (call_depth_ >= options_.limits.max_call_depth) {
      return ResourceExhaustedError("macro calls nested deeper than " + std::to_string(options_.limits.max_call_depth));
    }
    if (args.positional.size() > m.params.size()) {
      return InvalidArgumentError("macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments, got " +
                                  std::to_string(args.positional.size()));
    }
    for (const auto& kv : args.keyword) {
      bool known = std::any_of(m.params.begin(), m.params.end(), [&](const MacroParam& p) { return p.name == kv.first; });
      if (!known) return InvalidArgumentError("macro '" + m.name + "' has no parameter '" + kv.first + "'");
    }
    const size_t saved_floor = floor_;
    scopes_.emplace_back();
    floor_ = scopes_.size() - 1;
    ++call_depth_;
    auto run = [&]() -> StatusOr<std::string> {
      for (size_t i = 0; i < m.params.size(); ++i) {
        const Value* given = args.Get(i, m.params[i].name);
        if (given) {
          Assign(m.params[i].name, *given);
        } else if (m.params[i].default_value) {
          ICE_ASSIGN_OR_RETURN(Value d, Eval(*m.params[i].default_value));
          Assign(m.params[i].name, std::move(d));
        } else {
          Assign(m.params[i].name, Value::Undefined("'" + m.params[i].name + "' (not passed to macro '" + m.name + "')"));
        }
      }
      return Capture(m.bodies[0]);
    };
    auto text = run();
    --call_depth_;
    scopes_.pop_back();
    floor_ = saved_floor;
    if (!text.ok()) return text.status();
    return Value::String(std::move(text).value());
  }

  const ValueDict& context_;
  const RenderOptions& options_;
  Budget budget_;
  ValueDict globals_;
  std::vector<Scope> scopes_;  // [0]: the template's top level
  size_t floor_ = 0;           // first scope of the innermost macro call
  std::string* out_ = nullptr;
  size_t output_bytes_ = 0;
  int call_depth_ = 0;
  std::vector<Value> namespaces_;  // every namespace() this render created
  std::optional<std::string> raised_;
  std::string raised_where_;
};

}  // namespace

StatusOr<std::string> Execute(const Program& program, const ValueDict& context, const RenderOptions& options) {
  Interpreter interp(context, options);
  return interp.Run(program);
}

}  // namespace icecache::tokenizer::jinja
