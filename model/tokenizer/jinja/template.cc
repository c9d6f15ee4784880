#include "model/tokenizer/jinja/template.h"

#include "model/tokenizer/jinja/ast.h"
#include "model/tokenizer/jinja/interpreter.h"
#include "model/tokenizer/jinja/lexer.h"
#include "model/tokenizer/jinja/parser.h"

namespace icecache::tokenizer::jinja {

Template::Template(std::unique_ptr<Program> program) : program_(std::move(program)) {}
Template::~Template() = default;

StatusOr<std::shared_ptr<const Template>> Template::Compile(std::string_view source) {
  ICE_ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  ICE_ASSIGN_OR_RETURN(std::unique_ptr<Program> program, Parse(tokens));
  return std::shared_ptr<const Template>(new Template(std::move(program)));
}

StatusOr<std::string> Template::Render(const ValueDict& context, const RenderOptions& options) const {
  return Execute(*program_, context, options);
}

}  // namespace icecache::tokenizer::jinja
