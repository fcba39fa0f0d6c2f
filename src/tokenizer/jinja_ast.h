// Internal: the syntax tree of a Jinja template (expressions and statements) and its parser.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja.h"

namespace deltaserve::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kAttr,
    kIndex,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kCond,
    kList,
    kDict
  };
  Kind kind;
  Json literal;               // kLiteral
  std::string name;           // kName, kAttr attribute, kFilter/kTest name, kBinary operator
  std::vector<ExprPtr> args;  // operands / call args / list items / dict k,v pairs
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: "is not"
  explicit Expr(Kind k) : kind(k) {}
};

struct Node {
  enum class Kind { kBody, kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind;
  std::string text;               // kText; kSet/kMacro target name
  std::string attr;               // kSet: namespace attribute ("ns.attr")
  std::vector<std::string> vars;  // kFor loop variables; kMacro parameter names
  std::vector<ExprPtr>
      exprs;  // kOutput/kSet value; kIf conditions; kFor iterable (+ filter); kMacro defaults
  std::vector<std::unique_ptr<Node>>
      children;  // kBody statements; kIf branch bodies; kFor body (+ else); kMacro body
  explicit Node(Kind k) : kind(k) {}
};

// Parses a whole template into a kBody node.
std::unique_ptr<Node> parse_template(const std::string& source);

}  // namespace deltaserve::tokenizer::jinja
