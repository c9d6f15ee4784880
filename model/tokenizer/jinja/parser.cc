#include "model/tokenizer/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "model/tokenizer/jinja/builtins.h"

namespace icecache::tokenizer::jinja {
namespace {

constexpr int kMaxNesting = 200;  // expression and statement nesting (bounds recursion)

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  StatusOr<std::unique_ptr<Program>> Run() {
    auto program = std::make_unique<Program>();
    std::string end;
    ICE_ASSIGN_OR_RETURN(program->body, ParseBody({}, &end));
    return program;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().type == TokenType::kOp && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == TokenType::kName && Cur().text == name; }
  void Next() {
    if (i_ + 1 < t_.size()) ++i_;
  }

  static std::string Where(const Token& t) {
    return "line " + std::to_string(t.line) + ", column " + std::to_string(t.column) + ": ";
  }
  Status Error(const Token& t, const std::string& what) const { return InvalidArgumentError(Where(t) + what); }
  Status Unsupported(const Token& t, const std::string& what) const {
    return UnimplementedError(Where(t) + what + " is not supported by this Jinja subset");
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEof: return "end of template";
      case TokenType::kBlockEnd: return "'%}'";
      case TokenType::kVarEnd: return "'}}'";
      case TokenType::kString: return "string literal";
      case TokenType::kData: return "text";
      default: return "'" + t.text + "'";
    }
  }
  Status Expect(const char* op) {
    if (!IsOp(op)) return Error(Cur(), std::string("expected '") + op + "', got " + Describe(Cur()));
    Next();
    return Status::Ok();
  }
  Status ExpectBlockEnd() {
    if (Cur().type != TokenType::kBlockEnd) return Error(Cur(), "expected '%}', got " + Describe(Cur()));
    Next();
    return Status::Ok();
  }
  StatusOr<std::string> ExpectName() {
    if (Cur().type != TokenType::kName) return Error(Cur(), "expected a name, got " + Describe(Cur()));
    std::string n = Cur().text;
    Next();
    return n;
  }

  template <typename T>
  static std::unique_ptr<T> Node(typename T::Kind kind, const Token& at) {
    auto n = std::make_unique<T>();
    n->kind = kind;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  // Statements up to a block tag named in `stop` (consumed up to and including its name, which
  // is returned in *end) or the end of the template (only allowed when stop is empty).
  StatusOr<StmtList> ParseBody(std::initializer_list<const char*> stop, std::string* end) {
    if (++nesting_ > kMaxNesting) return Error(Cur(), "blocks nested too deeply");
    StmtList body;
    while (true) {
      const Token& tok = Cur();
      if (tok.type == TokenType::kEof) {
        if (stop.size() == 0) break;
        return Error(tok, std::string("unexpected end of template: missing '{% ") + *stop.begin() + " %}'");
      }
      if (tok.type == TokenType::kData) {
        auto s = Node<Stmt>(Stmt::Kind::kData, tok);
        s->text = tok.text;
        body.push_back(std::move(s));
        Next();
        continue;
      }
      if (tok.type == TokenType::kVarBegin) {
        Next();
        auto s = Node<Stmt>(Stmt::Kind::kOutput, tok);
        ICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
        if (Cur().type != TokenType::kVarEnd) return Error(Cur(), "expected '}}', got " + Describe(Cur()));
        Next();
        body.push_back(std::move(s));
        continue;
      }
      if (tok.type != TokenType::kBlockBegin) return Error(tok, "unexpected " + Describe(tok));
      const Token& name = Peek(1);
      if (name.type != TokenType::kName) return Error(name, "expected a tag name after '{%'");
      if (std::find_if(stop.begin(), stop.end(), [&](const char* s) { return name.text == s; }) != stop.end()) {
        Next();
        Next();
        *end = name.text;
        break;
      }
      Next();
      ICE_ASSIGN_OR_RETURN(StmtPtr s, ParseStatement());
      if (s) body.push_back(std::move(s));
    }
    --nesting_;
    return body;
  }

  StatusOr<StmtPtr> ParseStatement() {
    const Token tag = Cur();
    const std::string& n = tag.text;
    Next();
    if (n == "if") return ParseIf(tag);
    if (n == "for") return ParseFor(tag);
    if (n == "set") return ParseSet(tag);
    if (n == "macro") return ParseMacro(tag);
    if (n == "break" || n == "continue") {
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      if (loop_depth_ == 0) return Error(tag, "'{% " + n + " %}' outside a loop");
      return Node<Stmt>(n == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tag);
    }
    if (n == "generation") {  // transformers' assistant-mask marker: render the body
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      auto s = Node<Stmt>(Stmt::Kind::kIf, tag);
      auto cond = Node<Expr>(Expr::Kind::kLiteral, tag);
      cond->literal = Value::Bool(true);
      s->conds.push_back(std::move(cond));
      std::string end;
      ICE_ASSIGN_OR_RETURN(StmtList body, ParseBody({"endgeneration"}, &end));
      s->bodies.push_back(std::move(body));
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    static const char* kJinjaTags[] = {"include", "import", "from", "extends", "block", "call", "filter", "with",
                                       "autoescape", "raw", "do", "trans", "pluralize", "print"};
    for (const char* k : kJinjaTags) {
      if (n == k) return Unsupported(tag, "'{% " + n + " %}'");
    }
    if (n.rfind("end", 0) == 0 || n == "elif" || n == "else") return Error(tag, "unexpected '{% " + n + " %}'");
    return Error(tag, "unknown tag '" + n + "'");
  }

  StatusOr<StmtPtr> ParseIf(const Token& tag) {
    auto s = Node<Stmt>(Stmt::Kind::kIf, tag);
    while (true) {
      ICE_ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(true));
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ICE_ASSIGN_OR_RETURN(StmtList body, ParseBody({"elif", "else", "endif"}, &end));
      s->conds.push_back(std::move(cond));
      s->bodies.push_back(std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        ICE_RETURN_IF_ERROR(ExpectBlockEnd());
        ICE_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end));
      }
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
  }

  StatusOr<StmtPtr> ParseFor(const Token& tag) {
    auto s = Node<Stmt>(Stmt::Kind::kFor, tag);
    bool paren = IsOp("(");
    if (paren) Next();
    while (true) {
      ICE_ASSIGN_OR_RETURN(std::string name, ExpectName());
      s->targets.push_back(std::move(name));
      if (!IsOp(",")) break;
      Next();
    }
    if (paren) ICE_RETURN_IF_ERROR(Expect(")"));
    if (!IsName("in")) return Error(Cur(), "expected 'in' in for loop, got " + Describe(Cur()));
    Next();
    ICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
    if (IsName("if")) {
      Next();
      ICE_ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return Unsupported(Cur(), "a recursive for loop");
    ICE_RETURN_IF_ERROR(ExpectBlockEnd());
    ++loop_depth_;
    std::string end;
    ICE_ASSIGN_OR_RETURN(StmtList body, ParseBody({"else", "endfor"}, &end));
    --loop_depth_;
    s->bodies.push_back(std::move(body));
    if (end == "else") {
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      ICE_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
    }
    ICE_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  StatusOr<StmtPtr> ParseSet(const Token& tag) {
    auto s = Node<Stmt>(Stmt::Kind::kSet, tag);
    ICE_ASSIGN_OR_RETURN(std::string first, ExpectName());
    if (IsOp(".")) {
      Next();
      s->ns_name = first;
      ICE_ASSIGN_OR_RETURN(s->ns_attr, ExpectName());
    } else {
      s->targets.push_back(first);
      while (IsOp(",")) {
        Next();
        ICE_ASSIGN_OR_RETURN(std::string name, ExpectName());
        s->targets.push_back(std::move(name));
      }
    }
    if (IsOp("=")) {
      Next();
      ICE_ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      ICE_RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (Cur().type != TokenType::kBlockEnd) {
      if (IsOp("|")) return Unsupported(Cur(), "a filter on a block set");
      return Error(Cur(), "expected '=' or '%}' in set, got " + Describe(Cur()));
    }
    if (!s->ns_name.empty() || s->targets.size() != 1) return Error(tag, "a block set assigns one plain name");
    Next();
    s->kind = Stmt::Kind::kSetBlock;
    std::string end;
    ICE_ASSIGN_OR_RETURN(StmtList body, ParseBody({"endset"}, &end));
    s->bodies.push_back(std::move(body));
    ICE_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  StatusOr<StmtPtr> ParseMacro(const Token& tag) {
    auto s = Node<Stmt>(Stmt::Kind::kMacro, tag);
    ICE_ASSIGN_OR_RETURN(s->name, ExpectName());
    ICE_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      MacroParam p;
      ICE_ASSIGN_OR_RETURN(p.name, ExpectName());
      if (IsOp("=")) {
        Next();
        ICE_ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
      }
      s->params.push_back(std::move(p));
      if (!IsOp(",")) break;
      Next();
    }
    ICE_RETURN_IF_ERROR(Expect(")"));
    ICE_RETURN_IF_ERROR(ExpectBlockEnd());
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    ICE_ASSIGN_OR_RETURN(StmtList body, ParseBody({"endmacro"}, &end));
    loop_depth_ = saved_loops;
    s->bodies.push_back(std::move(body));
    if (Cur().type == TokenType::kName) Next();  // {% endmacro name %}
    ICE_RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  // ---- expressions ----

  bool AtTupleEnd() const {
    const Token& t = Cur();
    if (t.type == TokenType::kBlockEnd || t.type == TokenType::kVarEnd || t.type == TokenType::kEof) return true;
    if (t.type == TokenType::kOp && (t.text == ")" || t.text == "]" || t.text == "}" || t.text == "=")) return true;
    return t.type == TokenType::kName && (t.text == "if" || t.text == "recursive");
  }

  StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const Token start = Cur();
    ICE_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_condexpr));
    if (!IsOp(",")) return first;
    auto list = Node<Expr>(Expr::Kind::kList, start);
    list->name = "tuple";
    list->children.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (AtTupleEnd()) break;
      ICE_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(with_condexpr));
      list->children.push_back(std::move(e));
    }
    return list;
  }

  StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (++nesting_ > kMaxNesting) return Error(Cur(), "expression nested too deeply");
    const Token start = Cur();
    ICE_ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (with_condexpr && IsName("if")) {
      Next();
      auto c = Node<Expr>(Expr::Kind::kCond, start);
      ICE_ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr other;
      if (IsName("else")) {
        Next();
        ICE_ASSIGN_OR_RETURN(other, ParseExpression(true));
      }
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(other));
      e = std::move(c);
    }
    --nesting_;
    return e;
  }

  StatusOr<ExprPtr> ParseOr() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = Binary(Expr::Kind::kOr, op, "or", std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseAnd() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = Binary(Expr::Kind::kAnd, op, "and", std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      if (++nesting_ > kMaxNesting) return Error(Cur(), "expression nested too deeply");
      auto n = Node<Expr>(Expr::Kind::kNot, Cur());
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
      n->children.push_back(std::move(e));
      --nesting_;
      return ExprPtr(std::move(n));
    }
    return ParseCompare();
  }

  StatusOr<ExprPtr> ParseCompare() {
    const Token start = Cur();
    ICE_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (Cur().type == TokenType::kOp &&
          (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" || Cur().text == ">" ||
           Cur().text == "<=" || Cur().text == ">=")) {
        op = Cur().text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek(1).type == TokenType::kName && Peek(1).text == "in") {
        op = "not in";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = Node<Expr>(Expr::Kind::kCompare, start);
        cmp->children.push_back(std::move(first));
      }
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseMath1());
      cmp->ops.push_back(op);
      cmp->children.push_back(std::move(right));
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr Binary(Expr::Kind kind, const Token& at, std::string op, ExprPtr a, ExprPtr b) {
    auto n = Node<Expr>(kind, at);
    n->name = std::move(op);
    n->children.push_back(std::move(a));
    n->children.push_back(std::move(b));
    return n;
  }

  StatusOr<ExprPtr> ParseMath1() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = Binary(Expr::Kind::kBinary, op, op.text, std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseConcat() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParseMath2());
    while (IsOp("~")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseMath2());
      left = Binary(Expr::Kind::kBinary, op, "~", std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseMath2() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = Binary(Expr::Kind::kBinary, op, op.text, std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParsePow() {
    ICE_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token op = Cur();
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = Binary(Expr::Kind::kBinary, op, "**", std::move(left), std::move(right));
    }
    return left;
  }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    if (++nesting_ > kMaxNesting) return Error(Cur(), "expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      auto n = Node<Expr>(Expr::Kind::kUnary, Cur());
      n->name = Cur().text;
      Next();
      ICE_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      n->children.push_back(std::move(operand));
      node = std::move(n);
    } else {
      ICE_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ICE_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ICE_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    --nesting_;
    return node;
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token tok = Cur();
    switch (tok.type) {
      case TokenType::kName: {
        Next();
        auto n = Node<Expr>(Expr::Kind::kLiteral, tok);
        if (tok.text == "true" || tok.text == "True") n->literal = Value::Bool(true);
        else if (tok.text == "false" || tok.text == "False") n->literal = Value::Bool(false);
        else if (tok.text == "none" || tok.text == "None") n->literal = Value::None();
        else {
          n->kind = Expr::Kind::kName;
          n->name = tok.text;
        }
        return ExprPtr(std::move(n));
      }
      case TokenType::kString: {
        std::string s;
        while (Cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += Cur().text;
          Next();
        }
        auto n = Node<Expr>(Expr::Kind::kLiteral, tok);
        n->literal = Value::String(std::move(s));
        return ExprPtr(std::move(n));
      }
      case TokenType::kInt:
      case TokenType::kFloat: {
        Next();
        auto n = Node<Expr>(Expr::Kind::kLiteral, tok);
        n->literal = tok.type == TokenType::kInt ? Value::Int(tok.int_value) : Value::Float(tok.float_value);
        return ExprPtr(std::move(n));
      }
      case TokenType::kOp:
        if (tok.text == "(") {
          Next();
          if (IsOp(")")) {  // empty tuple
            Next();
            auto empty = Node<Expr>(Expr::Kind::kList, tok);
            empty->name = "tuple";
            return ExprPtr(std::move(empty));
          }
          ICE_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true));
          ICE_RETURN_IF_ERROR(Expect(")"));
          return e;
        }
        if (tok.text == "[") {
          Next();
          auto n = Node<Expr>(Expr::Kind::kList, tok);
          while (!IsOp("]")) {
            ICE_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
            n->children.push_back(std::move(e));
            if (!IsOp(",")) break;
            Next();
          }
          ICE_RETURN_IF_ERROR(Expect("]"));
          return ExprPtr(std::move(n));
        }
        if (tok.text == "{") {
          Next();
          auto n = Node<Expr>(Expr::Kind::kDict, tok);
          while (!IsOp("}")) {
            ICE_ASSIGN_OR_RETURN(ExprPtr k, ParseExpression(true));
            ICE_RETURN_IF_ERROR(Expect(":"));
            ICE_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
            n->children.push_back(std::move(k));
            n->children.push_back(std::move(v));
            if (!IsOp(",")) break;
            Next();
          }
          ICE_RETURN_IF_ERROR(Expect("}"));
          return ExprPtr(std::move(n));
        }
        break;
      default: break;
    }
    return Error(tok, "unexpected " + Describe(tok) + " in expression");
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      const Token tok = Cur();
      if (IsOp(".")) {
        Next();
        if (Cur().type == TokenType::kInt) {
          auto n = Node<Expr>(Expr::Kind::kSubscript, tok);
          auto idx = Node<Expr>(Expr::Kind::kLiteral, Cur());
          idx->literal = Value::Int(Cur().int_value);
          Next();
          n->children.push_back(std::move(node));
          n->children.push_back(std::move(idx));
          node = std::move(n);
          continue;
        }
        auto n = Node<Expr>(Expr::Kind::kAttr, tok);
        ICE_ASSIGN_OR_RETURN(n->name, ExpectName());
        n->children.push_back(std::move(node));
        node = std::move(n);
      } else if (IsOp("[")) {
        Next();
        ICE_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), tok));
      } else if (IsOp("(")) {
        ICE_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr obj, const Token& at) {
    ExprPtr start, stop, step;
    if (!IsOp(":")) {
      ICE_ASSIGN_OR_RETURN(start, ParseExpression(true));
      if (IsOp("]")) {
        Next();
        auto n = Node<Expr>(Expr::Kind::kSubscript, at);
        n->children.push_back(std::move(obj));
        n->children.push_back(std::move(start));
        return ExprPtr(std::move(n));
      }
      if (IsOp(",")) return Unsupported(Cur(), "a tuple subscript");
    }
    ICE_RETURN_IF_ERROR(Expect(":"));
    if (!IsOp("]") && !IsOp(":")) {
      ICE_ASSIGN_OR_RETURN(stop, ParseExpression(true));
    }
    if (IsOp(":")) {
      Next();
      if (!IsOp("]")) {
        ICE_ASSIGN_OR_RETURN(step, ParseExpression(true));
      }
    }
    ICE_RETURN_IF_ERROR(Expect("]"));
    auto n = Node<Expr>(Expr::Kind::kSlice, at);
    n->children.push_back(std::move(obj));
    n->children.push_back(std::move(start));
    n->children.push_back(std::move(stop));
    n->children.push_back(std::move(step));
    return ExprPtr(std::move(n));
  }

  // Parses "(args)" into `call`'s children (after any already there) and kwargs.
  Status ParseArgs(Expr* call) {
    ICE_RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return Unsupported(Cur(), "'*args' / '**kwargs' in a call");
      if (Cur().type == TokenType::kName && Peek(1).type == TokenType::kOp && Peek(1).text == "=") {
        std::string key = Cur().text;
        Next();
        Next();
        ICE_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call->kwargs.empty()) return Error(Cur(), "positional argument after keyword argument");
        ICE_ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->children.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto n = Node<Expr>(Expr::Kind::kCall, Cur());
    n->line = callee->line;  // errors point at the callee, not at '('
    n->column = callee->column;
    n->children.push_back(std::move(callee));
    ICE_RETURN_IF_ERROR(ParseArgs(n.get()));
    return ExprPtr(std::move(n));
  }

  StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Next();
        const Token name_tok = Cur();
        ICE_ASSIGN_OR_RETURN(std::string name, ExpectName());
        while (IsOp(".")) {
          Next();
          ICE_ASSIGN_OR_RETURN(std::string part, ExpectName());
          name += "." + part;
        }
        if (!IsKnownFilter(name)) return Unsupported(name_tok, "the filter '" + name + "'");
        auto f = Node<Expr>(Expr::Kind::kFilter, name_tok);
        f->name = name;
        f->children.push_back(std::move(node));
        if (IsOp("(")) ICE_RETURN_IF_ERROR(ParseArgs(f.get()));
        node = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto t = Node<Expr>(Expr::Kind::kTest, Cur());
        if (IsName("not")) {
          t->negated = true;
          Next();
        }
        const Token name_tok = Cur();
        ICE_ASSIGN_OR_RETURN(t->name, ExpectName());
        if (!IsKnownTest(t->name)) return Unsupported(name_tok, "the test '" + t->name + "'");
        t->children.push_back(std::move(node));
        const Token& c = Cur();
        if (IsOp("(")) {
          ICE_RETURN_IF_ERROR(ParseArgs(t.get()));
        } else if ((c.type == TokenType::kName && c.text != "else" && c.text != "or" && c.text != "and" &&
                    c.text != "if" && c.text != "is") ||
                   c.type == TokenType::kString || c.type == TokenType::kInt || c.type == TokenType::kFloat ||
                   (c.type == TokenType::kOp && (c.text == "[" || c.text == "{"))) {
          ICE_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ICE_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->children.push_back(std::move(arg));
        }
        node = std::move(t);
      } else if (IsOp("(")) {
        ICE_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Program>> Parse(const std::vector<Token>& tokens) {
  if (tokens.empty()) return std::make_unique<Program>();
  return Parser(tokens).Run();
}

}  // namespace icecache::tokenizer::jinja
