// Tree-walking evaluator of the Jinja-subset interpreter (internal; use template.h).
#pragma once

#include <string>

#include "common/status.h"
#include "model/tokenizer/jinja/ast.h"
#include "model/tokenizer/jinja/template.h"

namespace icecache::tokenizer::jinja {

// Runs `program` with `context` as its variables; errors as Template::Render documents.
StatusOr<std::string> Execute(const Program& program, const ValueDict& context, const RenderOptions& options);

}  // namespace icecache::tokenizer::jinja
