// Parser of the Jinja-subset interpreter: tokens (lexer.h) -> syntax tree (ast.h).
//
// Statements: {% if/elif/else/endif %}, {% for x[, y] in expr [if cond] %} ... [{% else %}]
// {% endfor %}, {% set x = expr %}, {% set a, b = expr %}, {% set ns.attr = expr %},
// {% set x %}...{% endset %}, {% macro name(a, b=default) %}...{% endmacro %}, {% break %},
// {% continue %}, and transformers' {% generation %}...{% endgeneration %} (rendered as its body).
// Expressions: Jinja's grammar and precedence (conditional expressions, or/and/not, chained
// comparisons, in/not in, + - ~ * / // % **, unary -/+, filters, `is` tests, calls with keyword
// arguments, attributes, subscripts and slices, list/tuple/dict literals).
//
// Errors: INVALID_ARGUMENT "line L, column C: ..." for a syntax error, an unknown filter or test,
// or a tag that is not Jinja; UNIMPLEMENTED naming the construct for Jinja features outside the
// subset ({% include %}, {% extends %}, {% call %}, {% filter %}, recursive loops, *args, ...).
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/jinja/ast.h"
#include "model/tokenizer/jinja/lexer.h"

namespace icecache::tokenizer::jinja {

StatusOr<std::unique_ptr<Program>> Parse(const std::vector<Token>& tokens);

}  // namespace icecache::tokenizer::jinja
