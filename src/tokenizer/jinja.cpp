// Jinja evaluation: values are JSON (insertion-ordered) plus undefined, namespaces and macros.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_values.h"

namespace deltaserve::tokenizer::jinja {

namespace {

class Renderer {
 public:
  explicit Renderer(const Json& vars) {
    frames_.emplace_back();
    for (auto it = vars.begin(); it != vars.end(); ++it)
      frames_[0][it.key()] = Value::of(it.value());
  }

  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kBody:
        for (const auto& c : n.children) {
          const Flow f = exec(*c, out);
          if (f != Flow::kNormal) return f;
        }
        return Flow::kNormal;
      case Node::Kind::kText:
        out += n.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += to_str(eval(*n.exprs[0]));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t i = 0; i < n.exprs.size(); ++i)
          if (truthy(eval(*n.exprs[i]))) return exec(*n.children[i], out);
        if (n.children.size() > n.exprs.size()) return exec(*n.children.back(), out);
        return Flow::kNormal;
      case Node::Kind::kFor:
        return exec_for(n, out);
      case Node::Kind::kSet: {
        Value v = eval(*n.exprs[0]);
        if (n.attr.empty()) {
          frames_.back()[n.text] = std::move(v);
        } else {
          Value target = lookup(n.text);
          if (target.k != Value::K::kNs)
            fail("cannot set attribute of '" + n.text + "' (not a namespace)");
          (*target.ns)[n.attr] = v.json();
        }
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        Value m;
        m.k = Value::K::kMacro;
        m.macro = &n;
        frames_.back()[n.text] = m;
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

 private:
  Flow exec_for(const Node& n, std::string& out) {
    const Value it = eval(*n.exprs[0]);
    std::vector<Json> items;
    const Json& j = it.json();
    if (j.is_array()) {
      items.assign(j.begin(), j.end());
    } else if (j.is_object()) {
      for (auto e = j.begin(); e != j.end(); ++e) items.push_back(e.key());
    } else if (j.is_string()) {
      for (char c : j.get<std::string>()) items.push_back(std::string(1, c));
    } else if (!it.undefined() && !j.is_null()) {
      fail("cannot iterate over " + py_str(j));
    }
    frames_.emplace_back();
    if (n.exprs.size() > 1) {  // "for x in xs if cond": filter first, so loop.* counts kept items
      std::vector<Json> kept;
      for (const Json& x : items) {
        bind(n, x);
        if (truthy(eval(*n.exprs[1]))) kept.push_back(x);
      }
      items.swap(kept);
    }
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      bind(n, items[i]);
      frames_.back()["loop"] = Value::of(Json{{"index0", i},
                                              {"index", i + 1},
                                              {"first", i == 0},
                                              {"last", i + 1 == len},
                                              {"length", len},
                                              {"revindex", len - i},
                                              {"revindex0", len - i - 1}});
      if (exec(*n.children[0], out) == Flow::kBreak) break;
    }
    frames_.pop_back();
    if (len == 0 && n.children.size() > 1) return exec(*n.children[1], out);
    return Flow::kNormal;
  }

  void bind(const Node& n, const Json& x) {
    if (n.vars.size() == 1) {
      frames_.back()[n.vars[0]] = Value::of(x);
      return;
    }
    if (!x.is_array() || x.size() != n.vars.size()) fail("cannot unpack loop item " + py_str(x));
    for (size_t k = 0; k < n.vars.size(); ++k) frames_.back()[n.vars[k]] = Value::of(x[k]);
  }

  Value lookup(const std::string& name) const {
    for (size_t i = frames_.size(); i-- > barrier_;) {
      const auto it = frames_[i].find(name);
      if (it != frames_[i].end()) return it->second;
    }
    const auto it = frames_[0].find(name);
    return it == frames_[0].end() ? Value{} : it->second;
  }

  Value attr(const Value& obj, const std::string& name) {
    if (obj.k == Value::K::kNs) {
      return obj.ns->contains(name) ? Value::of((*obj.ns)[name]) : Value{};
    }
    const Json& j = obj.json();
    if (j.is_object() && j.contains(name)) return Value::of(j[name]);
    return Value{};
  }

  Value index(const Value& obj, const Value& key) {
    const Json& j = obj.json();
    const Json& k = key.json();
    if (j.is_object())
      return k.is_string() && j.contains(k.get<std::string>()) ? Value::of(j[k.get<std::string>()])
                                                               : Value{};
    if ((j.is_array() || j.is_string()) && k.is_number_integer()) {
      const int64_t n = j.is_array() ? static_cast<int64_t>(j.size())
                                     : static_cast<int64_t>(j.get_ref<const std::string&>().size());
      int64_t i = k.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value{};
      return j.is_array() ? Value::of(j[static_cast<size_t>(i)])
                          : Value::of(std::string(
                                1, j.get_ref<const std::string&>()[static_cast<size_t>(i)]));
    }
    return Value{};
  }

  Value slice(const Value& obj, const Expr& e) {
    const Json& j = obj.json();
    const int64_t n = j.is_array()    ? static_cast<int64_t>(j.size())
                      : j.is_string() ? static_cast<int64_t>(j.get_ref<const std::string&>().size())
                                      : -1;
    if (n < 0) fail("cannot slice " + py_str(j));
    const int64_t step = e.args[3] ? to_int(eval(*e.args[3]), "slice step") : 1;
    if (step == 0) fail("slice step cannot be zero");
    auto bound = [&](const ExprPtr& x, int64_t dflt) {
      if (!x) return dflt;
      int64_t v = to_int(eval(*x), "slice index");
      if (v < 0) v += n;
      return step > 0 ? std::clamp<int64_t>(v, 0, n) : std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t b = bound(e.args[1], step > 0 ? 0 : n - 1),
                  en = bound(e.args[2], step > 0 ? n : -1);
    Json out = j.is_array() ? Json::array() : Json("");
    for (int64_t i = b; step > 0 ? i < en : i > en; i += step) {
      if (j.is_array())
        out.push_back(j[static_cast<size_t>(i)]);
      else
        out.get_ref<std::string&>() += j.get_ref<const std::string&>()[static_cast<size_t>(i)];
    }
    return Value::of(out);
  }

  Value call_macro(const Node& m, const std::vector<Value>& args,
                   const std::vector<std::pair<std::string, Value>>& kwargs) {
    const size_t saved_barrier = barrier_;
    frames_.emplace_back();
    barrier_ = frames_.size() - 1;
    for (size_t i = 0; i < m.vars.size(); ++i) {
      Value v;
      if (i < args.size())
        v = args[i];
      else if (m.exprs[i])
        v = eval(*m.exprs[i]);
      for (const auto& [k, kv] : kwargs)
        if (k == m.vars[i]) v = kv;
      frames_.back()[m.vars[i]] = v;
    }
    std::string out;
    exec(*m.children[0], out);
    frames_.pop_back();
    barrier_ = saved_barrier;
    return Value::of(out);
  }

  Value call(const Expr& e) {
    std::vector<Value> args;
    std::vector<std::pair<std::string, Value>> kwargs;
    for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i]));
    for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x));
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kAttr) return method(eval(*callee.args[0]), callee.name, args);
    if (callee.kind != Expr::Kind::kName) fail("unsupported call");
    const std::string& f = callee.name;
    const Value fv = lookup(f);
    if (fv.k == Value::K::kMacro) return call_macro(*fv.macro, args, kwargs);
    if (f == "namespace") {
      Value ns;
      ns.k = Value::K::kNs;
      ns.ns = std::make_shared<Json>(Json::object());
      if (!args.empty() && args[0].json().is_object()) *ns.ns = args[0].json();
      for (const auto& [k, v] : kwargs) (*ns.ns)[k] = v.json();
      return ns;
    }
    if (f == "raise_exception") fail(args.empty() ? "raise_exception" : to_str(args[0]));
    if (f == "range") {
      int64_t a = 0, b = 0, s = 1;
      if (args.size() == 1)
        b = to_int(args[0], "range");
      else if (args.size() >= 2)
        a = to_int(args[0], "range"), b = to_int(args[1], "range");
      if (args.size() == 3) s = to_int(args[2], "range");
      if (s == 0) fail("range step cannot be zero");
      Json out = Json::array();
      for (int64_t i = a; s > 0 ? i < b : i > b; i += s) out.push_back(i);
      return Value::of(out);
    }
    fail("unknown function '" + f + "'");
  }

  Value method(const Value& obj, const std::string& name, const std::vector<Value>& args) {
    const Json& j = obj.json();
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      auto arg_str = [&](size_t i) {
        if (i >= args.size() || !args[i].is_string())
          fail("str." + name + " needs a string argument");
        return args[i].json().get<std::string>();
      };
      if (name == "startswith") return Value::of(s.rfind(arg_str(0), 0) == 0);
      if (name == "endswith") {
        const std::string x = arg_str(0);
        return Value::of(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const std::string chars =
            args.empty() || args[0].json().is_null() ? std::string(" \t\n\r\v\f") : arg_str(0);
        return Value::of(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
      }
      if (name == "split") return Value::of(py_split(s, args.empty() ? nullptr : &args[0]));
      if (name == "upper" || name == "lower") {
        std::string r = s;
        for (char& c : r)
          c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                                : std::tolower(static_cast<unsigned char>(c)));
        return Value::of(r);
      }
      if (name == "replace") {
        const std::string a = arg_str(0), b = arg_str(1);
        if (a.empty()) return Value::of(s);
        std::string r;
        size_t i = 0;
        for (size_t k; (k = s.find(a, i)) != std::string::npos; i = k + a.size())
          r += s.substr(i, k - i) + b;
        return Value::of(r + s.substr(i));
      }
    }
    if (j.is_object()) {
      if (name == "get") {
        if (args.empty() || !args[0].is_string()) fail("dict.get needs a key");
        const std::string k = args[0].json().get<std::string>();
        return j.contains(k) ? Value::of(j[k]) : args.size() > 1 ? args[1] : Value::of(nullptr);
      }
      if (name == "items") return filter("items", obj, {});
      if (name == "keys" || name == "values") {
        Json out = Json::array();
        for (auto it = j.begin(); it != j.end(); ++it)
          out.push_back(name == "keys" ? Json(it.key()) : it.value());
        return Value::of(out);
      }
    }
    fail("unknown method '" + name + "' on " + (obj.undefined() ? "undefined" : py_str(j, true)));
  }

  Value filter(const std::string& f, const Value& v, const std::vector<Value>& args,
               const std::vector<std::pair<std::string, Value>>& kwargs = {}) {
    const Json& j = v.json();
    if (f == "length" || f == "count") {
      if (j.is_string()) return Value::of(utf8_length(j.get<std::string>()));
      if (j.is_array() || j.is_object()) return Value::of(j.size());
      return Value::of(0);
    }
    if (f == "tojson") {
      int indent = -1;
      for (const auto& [k, x] : kwargs)
        if (k == "indent" && x.json().is_number_integer()) indent = x.json().get<int>();
      if (!args.empty() && args[0].json().is_number_integer()) indent = args[0].json().get<int>();
      std::string out;
      dump_json(j, indent, 0, out);
      return Value::of(out);
    }
    if (f == "string") return Value::of(to_str(v));
    if (f == "trim") return Value::of(strip_chars(to_str(v), " \t\n\r\v\f", true, true));
    if (f == "safe" || f == "e" || f == "escape")
      return v;  // chat templates render without autoescape
    if (f == "upper" || f == "lower") return method(Value::of(to_str(v)), f, {});
    if (f == "items") {
      Json out = Json::array();
      if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it)
          out.push_back(Json::array({it.key(), it.value()}));
      return Value::of(out);
    }
    if (f == "join") {
      const std::string sep = args.empty() ? "" : to_str(args[0]);
      std::string out;
      bool first = true;
      for (const Json& x : j) {
        if (!first) out += sep;
        first = false;
        out += py_str(x);
      }
      return Value::of(out);
    }
    if (f == "first" || f == "last") {
      if (j.is_array()) return j.empty() ? Value{} : Value::of(f == "first" ? j.front() : j.back());
      if (j.is_string()) return index(v, Value::of(f == "first" ? 0 : -1));
      return Value{};
    }
    if (f == "default" || f == "d") {
      const bool boolean = args.size() > 1 && truthy(args[1]);
      if (v.undefined() || (boolean && !truthy(v))) return args.empty() ? Value::of("") : args[0];
      return v;
    }
    if (f == "list") {
      if (j.is_array()) return v;
      Json out = Json::array();
      if (j.is_string())
        for (char c : j.get<std::string>()) out.push_back(std::string(1, c));
      if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) out.push_back(it.key());
      return Value::of(out);
    }
    if (f == "reverse") {
      if (j.is_string())
        return Value::of(std::string(j.get<std::string>().rbegin(), j.get<std::string>().rend()));
      Json out = Json::array();
      for (auto it = j.rbegin(); it != j.rend(); ++it) out.push_back(*it);
      return Value::of(out);
    }
    if (f == "int") {
      if (j.is_number()) return Value::of(to_int(v, "int"));
      if (j.is_string()) {
        try {
          return Value::of(std::stoll(j.get<std::string>()));
        } catch (const std::exception&) {
          return Value::of(0);
        }
      }
      return Value::of(0);
    }
    if (f == "replace" && args.size() == 2) return method(Value::of(to_str(v)), "replace", args);
    fail("unknown filter '" + f + "'");
  }

  bool test(const std::string& t, const Value& v) {
    const Json& j = v.json();
    if (t == "defined") return !v.undefined();
    if (t == "undefined") return v.undefined();
    if (t == "none") return v.k == Value::K::kJson && j.is_null();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.k == Value::K::kNs || (v.k == Value::K::kJson && j.is_object());
    if (t == "sequence" || t == "iterable")
      return v.k == Value::K::kJson && (j.is_array() || j.is_string() || j.is_object());
    if (t == "number") return v.k == Value::K::kJson && j.is_number();
    if (t == "integer") return v.k == Value::K::kJson && j.is_number_integer();
    if (t == "float") return v.k == Value::K::kJson && j.is_number_float();
    if (t == "boolean") return v.k == Value::K::kJson && j.is_boolean();
    if (t == "true") return v.k == Value::K::kJson && j.is_boolean() && j.get<bool>();
    if (t == "false") return v.k == Value::K::kJson && j.is_boolean() && !j.get<bool>();
    if (t == "even" || t == "odd")
      return j.is_number_integer() && (j.get<int64_t>() % 2 == 0) == (t == "even");
    fail("unknown test '" + t + "'");
  }

  static bool equal(const Value& a, const Value& b) {
    if (a.undefined() || b.undefined()) return a.undefined() && b.undefined();
    return a.json() == b.json();
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.args[0]);
      return truthy(l) ? l : eval(*e.args[1]);
    }
    const Value l = eval(*e.args[0]), r = eval(*e.args[1]);
    const Json &a = l.json(), &b = r.json();
    if (op == "==") return Value::of(equal(l, r));
    if (op == "!=") return Value::of(!equal(l, r));
    if (op == "~") return Value::of(to_str(l) + to_str(r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string())
        found = b.get_ref<const std::string&>().find(a.get<std::string>()) != std::string::npos;
      else if (b.is_array())
        found = std::find(b.begin(), b.end(), a) != b.end();
      else if (b.is_object() && a.is_string())
        found = b.contains(a.get<std::string>());
      return Value::of(found == (op == "in"));
    }
    if (op == "+" && a.is_string() && b.is_string())
      return Value::of(a.get<std::string>() + b.get<std::string>());
    if (op == "+" && a.is_array() && b.is_array()) {
      Json out = a;
      out.insert(out.end(), b.begin(), b.end());
      return Value::of(out);
    }
    if (a.is_string() && b.is_string()) {
      const std::string &x = a.get_ref<const std::string&>(), &y = b.get_ref<const std::string&>();
      if (op == "<") return Value::of(x < y);
      if (op == ">") return Value::of(x > y);
      if (op == "<=") return Value::of(x <= y);
      if (op == ">=") return Value::of(x >= y);
    }
    if (!a.is_number() || !b.is_number())
      fail("unsupported operands for '" + op + "': " + py_str(a, true) + ", " + py_str(b, true));
    if (a.is_number_integer() && b.is_number_integer() && op != "/") {
      const int64_t x = a.get<int64_t>(), y = b.get<int64_t>();
      if ((op == "//" || op == "%") && y == 0) fail("division by zero");
      if (op == "+") return Value::of(x + y);
      if (op == "-") return Value::of(x - y);
      if (op == "*") return Value::of(x * y);
      if (op == "//") return Value::of(x / y - ((x % y != 0) && ((x < 0) != (y < 0))));
      if (op == "%") return Value::of(((x % y) + y) % y);
    }
    const double x = a.get<double>(), y = b.get<double>();
    if (op == "+") return Value::of(x + y);
    if (op == "-") return Value::of(x - y);
    if (op == "*") return Value::of(x * y);
    if (op == "/") return Value::of(x / y);
    if (op == "//") return Value::of(std::floor(x / y));
    if (op == "<") return Value::of(x < y);
    if (op == ">") return Value::of(x > y);
    if (op == "<=") return Value::of(x <= y);
    if (op == ">=") return Value::of(x >= y);
    fail("unsupported operator '" + op + "'");
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return Value::of(e.literal);
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kAttr:
        return attr(eval(*e.args[0]), e.name);
      case Expr::Kind::kIndex:
        return index(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice:
        return slice(eval(*e.args[0]), e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter: {
        std::vector<Value> args;
        std::vector<std::pair<std::string, Value>> kwargs;
        for (size_t i = 1; i < e.args.size(); ++i) args.push_back(eval(*e.args[i]));
        for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x));
        return filter(e.name, eval(*e.args[0]), args, kwargs);
      }
      case Expr::Kind::kTest:
        return Value::of(test(e.name, eval(*e.args[0])) != e.negated);
      case Expr::Kind::kNot:
        return Value::of(!truthy(eval(*e.args[0])));
      case Expr::Kind::kNeg: {
        const Value v = eval(*e.args[0]);
        if (v.json().is_number_integer()) return Value::of(-v.json().get<int64_t>());
        if (v.json().is_number()) return Value::of(-v.json().get<double>());
        fail("cannot negate " + py_str(v.json(), true));
      }
      case Expr::Kind::kBinary:
        return binary(e);
      case Expr::Kind::kCond:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args.size() > 2 ? eval(*e.args[2]) : Value{};
      case Expr::Kind::kList: {
        Json out = Json::array();
        for (const auto& x : e.args) out.push_back(eval(*x).json());
        return Value::of(out);
      }
      case Expr::Kind::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2)
          out[to_str(eval(*e.args[i]))] = eval(*e.args[i + 1]).json();
        return Value::of(out);
      }
    }
    fail("bad expression");
  }

  std::vector<std::unordered_map<std::string, Value>> frames_;
  size_t barrier_ = 0;  // lookups see frames [barrier_, end) and the globals frame 0
};

}  // namespace

Template::Template(const std::string& source) : root_(parse_template(source)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Json& vars) const {
  Renderer r(vars);
  std::string out;
  r.exec(*root_, out);
  return out;
}

}  // namespace deltaserve::tokenizer::jinja
