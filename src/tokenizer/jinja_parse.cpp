// Jinja lexer (with trim_blocks / lstrip_blocks / "-" whitespace control) and recursive-descent
// parser for statements and expressions.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"

namespace deltaserve::tokenizer::jinja {

namespace {

[[noreturn]] void fail(const std::string& m) { throw Error("chat template: " + m); }

// One piece of the template: text, or the inside of {{ }}, {% %} ({# #} are dropped).
struct Segment {
  enum Type { kText, kVar, kBlock } type;
  std::string body;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::vector<Segment> split_segments(const std::string& src) {
  std::vector<Segment> segs;
  bool strip_next = false, trim_next = false;  // after a "-x}" / after a block tag (trim_blocks)
  size_t i = 0;
  for (;;) {
    size_t open = src.find('{', i);
    while (open != std::string::npos &&
           (open + 1 >= src.size() || std::strchr("{%#", src[open + 1]) == nullptr))
      open = src.find('{', open + 1);
    std::string text = src.substr(i, (open == std::string::npos ? src.size() : open) - i);
    bool line_start = i == 0 || src[i - 1] == '\n';
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_next && text.rfind("\n", 0) == 0) {
      text.erase(0, 1);
      line_start = true;
    } else if (trim_next && text.rfind("\r\n", 0) == 0) {
      text.erase(0, 2);
      line_start = true;
    }
    if (open == std::string::npos) {
      if (!text.empty()) segs.push_back({Segment::kText, text});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus = open + 2 < src.size() && src[open + 2] == '+';
    if (minus) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && !plus) {
      // lstrip_blocks: drop spaces/tabs between the start of the line and a block tag.
      const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l > 0 || line_start) && text.find_first_not_of(" \t", l) == std::string::npos)
        text.erase(l);
    }
    if (!text.empty()) segs.push_back({Segment::kText, text});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t start = open + 2 + ((minus || plus) ? 1 : 0);
    const size_t end = src.find(close, start);
    if (end == std::string::npos) fail("unclosed tag at offset " + std::to_string(open));
    std::string body = src.substr(start, end - start);
    strip_next = !body.empty() && body.back() == '-';
    if (strip_next || (!body.empty() && body.back() == '+')) body.pop_back();
    trim_next = kind != '{';
    if (kind != '#') segs.push_back({kind == '{' ? Segment::kVar : Segment::kBlock, body});
    i = end + 2;
  }
  return segs;
}

struct Tok {
  enum Type { kName, kString, kInt, kFloat, kOp, kEnd } type;
  std::string s;
};

std::vector<Tok> lex(const std::string& s) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::kName, s.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      bool is_float =
          j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]));
      if (is_float) {
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      out.push_back({is_float ? Tok::kFloat : Tok::kInt, s.substr(i, j - i)});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          v += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          v += s[j];
        }
      }
      if (j >= s.size()) fail("unterminated string");
      out.push_back({Tok::kString, v});
      i = j + 1;
    } else {
      static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[",
                                   "]",  "{",  "}",  ".",  ",",  ":",  "|", "~", "+",
                                   "-",  "*",  "/",  "%",  "<",  ">",  "="};
      bool found = false;
      for (const char* op : kOps) {
        if (s.compare(i, std::strlen(op), op) == 0) {
          out.push_back({Tok::kOp, op});
          i += std::strlen(op);
          found = true;
          break;
        }
      }
      if (!found) fail(std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

class ExprParser {
 public:
  explicit ExprParser(std::vector<Tok> t) : t_(std::move(t)) {}

  const Tok& peek(size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().type == Tok::kOp && peek().s == op; }
  bool at_name(const char* n) const { return peek().type == Tok::kName && peek().s == n; }
  bool done() const { return peek().type == Tok::kEnd; }
  Tok next() { return t_[std::min(p_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(std::string("expected '") + op + "' but found '" + peek().s + "'");
    ++p_;
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) fail("expected a name but found '" + peek().s + "'");
    return next().s;
  }

  ExprPtr parse() { return parse_cond(); }
  // An expression without a trailing "if" (the iterable of a for loop with a filter).
  ExprPtr parse_no_cond() { return parse_or(); }

  // "a if c else b" (the else part is optional: undefined when absent).
  ExprPtr parse_cond() {
    ExprPtr e = parse_or();
    while (at_name("if")) {
      ++p_;
      auto c = std::make_unique<Expr>(Expr::Kind::kCond);
      ExprPtr cond = parse_or();
      ExprPtr other = at_name("else") ? (++p_, parse_cond()) : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      if (other) c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

 private:
  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r) {
    auto e = std::make_unique<Expr>(Expr::Kind::kBinary);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) ++p_, e = binary("or", std::move(e), parse_and());
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) ++p_, e = binary("and", std::move(e), parse_not());
    return e;
  }
  ExprPtr parse_not() {
    if (at_name("not")) {
      ++p_;
      auto e = std::make_unique<Expr>(Expr::Kind::kNot);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_concat();
    for (;;) {
      if (peek().type == Tok::kOp && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                      peek().s == ">" || peek().s == "<=" || peek().s == ">=")) {
        const std::string op = next().s;
        e = binary(op, std::move(e), parse_concat());
      } else if (at_name("in")) {
        ++p_;
        e = binary("in", std::move(e), parse_concat());
      } else if (at_name("not") && peek(1).type == Tok::kName && peek(1).s == "in") {
        p_ += 2;
        e = binary("not in", std::move(e), parse_concat());
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_add();
    while (at_op("~")) ++p_, e = binary("~", std::move(e), parse_add());
    return e;
  }
  ExprPtr parse_add() {
    ExprPtr e = parse_mul();
    while (at_op("+") || at_op("-")) {
      const std::string op = next().s;
      e = binary(op, std::move(e), parse_mul());
    }
    return e;
  }
  ExprPtr parse_mul() {
    ExprPtr e = parse_unary();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = next().s;
      e = binary(op, std::move(e), parse_unary());
    }
    return e;
  }
  ExprPtr parse_unary() {
    if (at_op("-")) {
      ++p_;
      auto e = std::make_unique<Expr>(Expr::Kind::kNeg);
      e->args.push_back(parse_unary());
      return e;
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  void parse_args(Expr& call) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().type == Tok::kName && peek(1).type == Tok::kOp && peek(1).s == "=") {
        std::string k = next().s;
        ++p_;
        call.kwargs.emplace_back(std::move(k), parse());
      } else {
        call.args.push_back(parse());
      }
      if (!at_op(")")) expect_op(",");
    }
    ++p_;
  }
  ExprPtr parse_filters(ExprPtr e) {
    for (;;) {
      if (at_op("|")) {
        ++p_;
        auto f = std::make_unique<Expr>(Expr::Kind::kFilter);
        f->name = expect_name();
        f->args.push_back(std::move(e));
        if (at_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (at_name("is")) {
        ++p_;
        auto t = std::make_unique<Expr>(Expr::Kind::kTest);
        if (at_name("not")) ++p_, t->negated = true;
        t->name = expect_name();
        t->args.push_back(std::move(e));
        if (at_op("(")) parse_args(*t);
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (at_op(".")) {
        ++p_;
        auto a = std::make_unique<Expr>(Expr::Kind::kAttr);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (at_op("[")) {
        ++p_;
        ExprPtr parts[3];
        int colons = 0;
        while (!at_op("]")) {
          if (at_op(":")) {
            ++p_;
            if (++colons > 2) fail("bad slice");
          } else {
            parts[colons] = parse();
          }
        }
        ++p_;
        auto x = std::make_unique<Expr>(colons ? Expr::Kind::kSlice : Expr::Kind::kIndex);
        x->args.push_back(std::move(e));
        if (colons) {
          for (auto& part : parts) x->args.push_back(std::move(part));  // null = omitted
        } else {
          if (!parts[0]) fail("empty subscript");
          x->args.push_back(std::move(parts[0]));
        }
        e = std::move(x);
      } else if (at_op("(")) {
        auto c = std::make_unique<Expr>(Expr::Kind::kCall);
        c->args.push_back(std::move(e));
        parse_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr parse_primary() {
    const Tok t = next();
    auto lit = [](Json j) {
      auto e = std::make_unique<Expr>(Expr::Kind::kLiteral);
      e->literal = std::move(j);
      return e;
    };
    switch (t.type) {
      case Tok::kString: {
        std::string s = t.s;
        while (peek().type == Tok::kString) s += next().s;  // adjacent literals concatenate
        return lit(s);
      }
      case Tok::kInt:
        return lit(std::stoll(t.s));
      case Tok::kFloat:
        return lit(std::stod(t.s));
      case Tok::kName: {
        if (t.s == "true" || t.s == "True") return lit(true);
        if (t.s == "false" || t.s == "False") return lit(false);
        if (t.s == "none" || t.s == "None") return lit(nullptr);
        auto e = std::make_unique<Expr>(Expr::Kind::kName);
        e->name = t.s;
        return e;
      }
      case Tok::kOp:
        if (t.s == "(") {
          ExprPtr e = parse();
          if (at_op(",")) {  // tuple -> list
            auto l = std::make_unique<Expr>(Expr::Kind::kList);
            l->args.push_back(std::move(e));
            while (at_op(",")) {
              ++p_;
              if (at_op(")")) break;
              l->args.push_back(parse());
            }
            e = std::move(l);
          }
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          auto l = std::make_unique<Expr>(Expr::Kind::kList);
          while (!at_op("]")) {
            l->args.push_back(parse());
            if (!at_op("]")) expect_op(",");
          }
          ++p_;
          return l;
        }
        if (t.s == "{") {
          auto d = std::make_unique<Expr>(Expr::Kind::kDict);
          while (!at_op("}")) {
            d->args.push_back(parse());
            expect_op(":");
            d->args.push_back(parse());
            if (!at_op("}")) expect_op(",");
          }
          ++p_;
          return d;
        }
        break;
      default:
        break;
    }
    fail("unexpected '" + t.s + "' in expression");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
};

class StmtParser {
 public:
  explicit StmtParser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  std::unique_ptr<Node> parse_all() {
    std::string stop;
    auto body = parse_body({}, stop);
    if (!stop.empty()) fail("unexpected {% " + stop + " %}");
    return body;
  }

 private:
  static ExprPtr expr_of(ExprParser& p) {
    ExprPtr e = p.parse();
    if (!p.done()) fail("unexpected '" + p.peek().s + "' after expression");
    return e;
  }

  // Parses statements until a block tag whose keyword is in `stops` (returned in `stop`, its
  // parser left in `stop_parser_`).
  std::unique_ptr<Node> parse_body(const std::vector<std::string>& stops, std::string& stop) {
    auto body = std::make_unique<Node>(Node::Kind::kBody);
    while (pos_ < segs_.size()) {
      const Segment& s = segs_[pos_++];
      if (s.type == Segment::kText) {
        auto n = std::make_unique<Node>(Node::Kind::kText);
        n->text = s.body;
        body->children.push_back(std::move(n));
        continue;
      }
      ExprParser p(lex(s.body));
      if (s.type == Segment::kVar) {
        auto n = std::make_unique<Node>(Node::Kind::kOutput);
        n->exprs.push_back(expr_of(p));
        body->children.push_back(std::move(n));
        continue;
      }
      const std::string kw = p.expect_name();
      if (std::find(stops.begin(), stops.end(), kw) != stops.end()) {
        stop = kw;
        stop_parser_ = std::make_unique<ExprParser>(std::move(p));
        return body;
      }
      body->children.push_back(parse_statement(kw, p));
    }
    if (!stops.empty()) fail("missing {% " + stops.back() + " %}");
    return body;
  }

  std::unique_ptr<Node> parse_statement(const std::string& kw, ExprParser& p) {
    std::string stop;
    if (kw == "if") {
      auto n = std::make_unique<Node>(Node::Kind::kIf);
      n->exprs.push_back(expr_of(p));
      for (;;) {
        n->children.push_back(parse_body({"elif", "else", "endif"}, stop));
        if (stop == "elif") {
          n->exprs.push_back(expr_of(*stop_parser_));
        } else if (stop == "else") {
          n->children.push_back(parse_body({"endif"}, stop));
          return n;
        } else {
          return n;
        }
      }
    }
    if (kw == "for") {
      auto n = std::make_unique<Node>(Node::Kind::kFor);
      n->vars.push_back(p.expect_name());
      while (p.at_op(",")) p.next(), n->vars.push_back(p.expect_name());
      if (!p.at_name("in")) fail("expected 'in' in for");
      p.next();
      n->exprs.push_back(p.parse_no_cond());
      if (p.at_name("if")) {
        p.next();
        n->exprs.push_back(p.parse());
      }
      if (!p.done()) fail("unexpected '" + p.peek().s + "' in for");
      n->children.push_back(parse_body({"else", "endfor"}, stop));
      if (stop == "else") n->children.push_back(parse_body({"endfor"}, stop));
      return n;
    }
    if (kw == "set") {
      auto n = std::make_unique<Node>(Node::Kind::kSet);
      n->text = p.expect_name();
      if (p.at_op(".")) p.next(), n->attr = p.expect_name();
      p.expect_op("=");
      n->exprs.push_back(expr_of(p));
      return n;
    }
    if (kw == "macro") {
      auto n = std::make_unique<Node>(Node::Kind::kMacro);
      n->text = p.expect_name();
      p.expect_op("(");
      while (!p.at_op(")")) {
        n->vars.push_back(p.expect_name());
        if (p.at_op("=")) {
          p.next();
          n->exprs.push_back(p.parse());
        } else {
          n->exprs.push_back(nullptr);
        }
        if (!p.at_op(")")) p.expect_op(",");
      }
      p.next();
      n->children.push_back(parse_body({"endmacro"}, stop));
      return n;
    }
    if (kw == "break") return std::make_unique<Node>(Node::Kind::kBreak);
    if (kw == "continue") return std::make_unique<Node>(Node::Kind::kContinue);
    fail("unsupported tag {% " + kw + " %}");
  }

  std::vector<Segment> segs_;
  size_t pos_ = 0;
  std::unique_ptr<ExprParser> stop_parser_;
};

}  // namespace

std::unique_ptr<Node> parse_template(const std::string& source) {
  return StmtParser(split_segments(source)).parse_all();
}

}  // namespace deltaserve::tokenizer::jinja
