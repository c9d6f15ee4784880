// Syntax tree of the Jinja-subset interpreter, built by parser.h and walked by interpreter.h.
// Immutable after parsing; one tree is shared by concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/tokenizer/jinja/value.h"

namespace icecache::tokenizer::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // children = items; name "tuple" for tuple literals
    kDict,       // children = key0, value0, key1, value1, ...
    kAttr,       // children[0].name
    kSubscript,  // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]] (null = omitted)
    kCall,       // children[0](children[1..], kwargs)
    kFilter,     // children[0] | name(children[1..], kwargs)
    kTest,       // children[0] is [not] name(children[1..], kwargs)
    kUnary,      // name ("-" or "+") children[0]
    kBinary,     // children[0] name children[1]; name in + - * / // % ** ~
    kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ... (chained like Python)
    kAnd,        // children[0] and children[1]
    kOr,         // children[0] or children[1]
    kNot,        // not children[0]
    kCond,       // children[0] if children[1] else children[2] (children[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0, column = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: "==", "!=", "<", "<=", ">", ">=", "in", "not in"
  bool negated = false;          // kTest
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null = none
};

struct Stmt {
  enum class Kind {
    kData,      // text
    kOutput,    // {{ expr }}
    kIf,        // conds[i] -> bodies[i]; else_body
    kFor,       // for targets in expr [if filter]: bodies[0]; else_body
    kSet,       // targets = expr, or ns_name.ns_attr = expr
    kSetBlock,  // {% set targets[0] %} bodies[0] {% endset %}
    kMacro,     // {% macro name(params) %} bodies[0] {% endmacro %}
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kData;
  int line = 0, column = 0;
  std::string text;
  ExprPtr expr;
  std::vector<ExprPtr> conds;
  std::vector<StmtList> bodies;
  StmtList else_body;
  std::vector<std::string> targets;
  ExprPtr filter;
  std::string ns_name, ns_attr;
  std::string name;
  std::vector<MacroParam> params;
};

struct Program {
  StmtList body;
};

}  // namespace icecache::tokenizer::jinja
