#include "structured/json_matcher.h"

#include <algorithm>

namespace deltaserve::structured {

enum class FrameKind : uint8_t { kEnd, kValue, kObject, kKey, kArray, kString, kNumber, kLiteral };

// One level of a stack. Phases: kEnd 0 waiting for the document, 1 after it; kObject 0 after '{',
// 1 after a key, 2 inside a value, 3 after a value, 4 after ','; kArray 0 after '[', 1 after ',',
// 2 inside a value, 3 after a value; kString / kKey 0 plain, 1 after '\', 2 inside "\uXXXX";
// kNumber the JSON number grammar's positions (number_next).
struct Frame {
  FrameKind kind = FrameKind::kEnd;
  int node = 0;  // schema node; kNumber: 1 for an integer
  int phase = 0;
  int ws = 0;                // whitespace bytes in a row
  int count = 0;             // kArray items; kNumber / kLiteral bytes; kString / kKey \u digits
  int depth = 0;             // object / array nesting
  int pending = -1;          // kObject: the node of the value after the key just read
  std::vector<bool> seen{};  // kObject: which properties are present
  std::string text{};        // kKey of an object with declared properties: the bytes typed
  std::vector<int> cands{};  // kLiteral: literals still matching
  FramePtr parent{};
};

namespace {

using Tops = std::vector<FramePtr>;

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

template <class F>
FramePtr edited(const Frame& f, F edit) {
  auto c = std::make_shared<Frame>(f);
  edit(*c);
  return c;
}

// A string's (or key's) escape position after byte b (not an unescaped '"'); false if invalid.
bool string_byte(int& phase, int& count, uint8_t b) {
  if (phase == 0) {
    if (b == '\\') phase = 1;
    return b >= 0x20;
  }
  if (phase == 1) {
    if (b == 'u') {
      phase = 2;
      count = 0;
      return true;
    }
    phase = 0;
    return b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
           b == 't';
  }
  if (!is_hex(b)) return false;
  if (++count == 4) phase = 0;
  return true;
}

// The JSON number grammar: 0 start, 1 after '-', 2 after a leading 0, 3 in the integer part,
// 4 after '.', 5 in the fraction, 6 after 'e', 7 after the exponent's sign, 8 in the exponent.
int number_next(int phase, uint8_t b, bool integer) {
  const bool d = is_digit(b), exp = !integer && (b == 'e' || b == 'E');
  switch (phase) {
    case 0:
      return b == '-' ? 1 : b == '0' ? 2 : d ? 3 : -1;
    case 1:
      return b == '0' ? 2 : d ? 3 : -1;
    case 2:
      return !integer && b == '.' ? 4 : exp ? 6 : -1;
    case 3:
      return d ? 3 : !integer && b == '.' ? 4 : exp ? 6 : -1;
    case 4:
      return d ? 5 : -1;
    case 5:
      return d ? 5 : exp ? 6 : -1;
    case 6:
      return b == '+' || b == '-' ? 7 : d ? 8 : -1;
    default:
      return d ? 8 : -1;
  }
}
bool number_complete(int phase) { return phase == 2 || phase == 3 || phase == 5 || phase == 8; }

class Stepper {
 public:
  explicit Stepper(const JsonGrammar& g) : g_(g) {}

  void step(const FramePtr& f, uint8_t b, Tops& out) const {
    switch (f->kind) {
      case FrameKind::kEnd:
        return;
      case FrameKind::kValue:
        if (is_ws(b)) return whitespace(*f, out);
        return start_value(f->node, f->parent, f->depth, b, out, 0);
      case FrameKind::kObject:
        return object(f, b, out);
      case FrameKind::kKey:
        return key(f, b, out);
      case FrameKind::kArray:
        return array(f, b, out);
      case FrameKind::kString:
        return string(f, b, out);
      case FrameKind::kNumber:
        return number(f, b, out);
      case FrameKind::kLiteral:
        return literal(f, b, out);
    }
  }

  // The parent's frame once its child value is complete (null if it cannot take one).
  FramePtr completed(const FramePtr& parent) const {
    const Frame& p = *parent;
    if (p.kind == FrameKind::kEnd && p.phase == 0) return edited(p, [](Frame& e) { e.phase = 1; });
    if ((p.kind == FrameKind::kObject || p.kind == FrameKind::kArray) && p.phase == 2)
      return edited(p, [](Frame& e) {
        e.phase = 3;
        e.ws = 0;
        e.pending = -1;
        if (e.kind == FrameKind::kArray) ++e.count;
      });
    return nullptr;
  }

  // True if the stack may end here (the document complete).
  bool ends(const FramePtr& f) const {
    if (f->kind == FrameKind::kEnd) return f->phase == 1;
    const bool done = (f->kind == FrameKind::kNumber && number_complete(f->phase)) ||
                      (f->kind == FrameKind::kLiteral && literal_done(*f));
    if (!done) return false;
    const FramePtr p = completed(f->parent);
    return p && ends(p);
  }

 private:
  void whitespace(const Frame& f, Tops& out) const {
    if (f.ws < kMaxWhitespace) out.push_back(edited(f, [](Frame& e) { ++e.ws; }));
  }

  void start_value(int node, const FramePtr& parent, int depth, uint8_t b, Tops& out,
                   int hops) const {
    const SchemaNode& n = g_.node(node);
    if (n.kind == NodeKind::kAnyOf) {
      if (hops < 64)
        for (int alt : n.alternatives) start_value(alt, parent, depth, b, out, hops + 1);
      return;
    }
    const bool any = n.kind == NodeKind::kAny;
    if (b == '{' && (any || n.kind == NodeKind::kObject)) {
      if (depth >= kMaxNesting) return;
      const int obj = any ? g_.any_object_node() : node;
      Frame o{.kind = FrameKind::kObject, .node = obj, .depth = depth + 1, .parent = parent};
      o.seen.assign(g_.node(obj).properties.size(), false);
      out.push_back(std::make_shared<Frame>(std::move(o)));
    } else if (b == '[' && (any || n.kind == NodeKind::kArray)) {
      if (depth >= kMaxNesting) return;
      out.push_back(std::make_shared<Frame>(Frame{.kind = FrameKind::kArray,
                                                  .node = any ? g_.any_array_node() : node,
                                                  .depth = depth + 1,
                                                  .parent = parent}));
    } else if (b == '"' && (any || n.kind == NodeKind::kString)) {
      out.push_back(std::make_shared<Frame>(Frame{.kind = FrameKind::kString, .parent = parent}));
    } else if ((b == '-' || is_digit(b)) &&
               (any || n.kind == NodeKind::kNumber || n.kind == NodeKind::kInteger)) {
      number(std::make_shared<Frame>(Frame{.kind = FrameKind::kNumber,
                                           .node = n.kind == NodeKind::kInteger ? 1 : 0,
                                           .parent = parent}),
             b, out);
    } else if (any || n.kind == NodeKind::kLiterals) {
      Frame l{.kind = FrameKind::kLiteral,
              .node = any ? g_.any_literal_node() : node,
              .parent = parent};
      for (size_t i = 0; i < g_.node(l.node).literals.size(); ++i)
        l.cands.push_back(static_cast<int>(i));
      literal(std::make_shared<Frame>(std::move(l)), b, out);
    }
  }

  bool can_add_key(const Frame& o) const {
    const SchemaNode& n = g_.node(o.node);
    return n.additional >= 0 || std::find(o.seen.begin(), o.seen.end(), false) != o.seen.end();
  }
  bool has_required(const Frame& o) const {
    const SchemaNode& n = g_.node(o.node);
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (n.properties[i].required && !o.seen[i]) return false;
    return true;
  }

  void object(const FramePtr& f, uint8_t b, Tops& out) const {
    if (is_ws(b)) return whitespace(*f, out);
    const int ph = f->phase;
    if (b == '"' && (ph == 4 || (ph == 0 && can_add_key(*f)))) {
      out.push_back(std::make_shared<Frame>(Frame{.kind = FrameKind::kKey, .parent = f}));
    } else if (b == '}' && (ph == 0 || ph == 3) && has_required(*f)) {
      if (FramePtr p = completed(f->parent)) out.push_back(std::move(p));
    } else if (b == ':' && ph == 1) {
      FramePtr in_value = edited(*f, [](Frame& e) {
        e.phase = 2;
        e.ws = 0;
      });
      out.push_back(std::make_shared<Frame>(Frame{.kind = FrameKind::kValue,
                                                  .node = f->pending,
                                                  .depth = f->depth,
                                                  .parent = std::move(in_value)}));
    } else if (b == ',' && ph == 3 && can_add_key(*f)) {
      out.push_back(edited(*f, [](Frame& e) {
        e.phase = 4;
        e.ws = 0;
      }));
    }
  }

  void key(const FramePtr& f, uint8_t b, Tops& out) const {
    const Frame& obj = *f->parent;
    const SchemaNode& n = g_.node(obj.node);
    if (f->phase == 0 && b == '"') return close_key(*f, obj, n, out);
    int phase = f->phase, count = f->count;
    if (!string_byte(phase, count, b)) return;
    if (n.properties.empty()) {  // a free key: its bytes need not be kept
      if (phase == f->phase && count == f->count) return out.push_back(f);
      return out.push_back(edited(*f, [&](Frame& e) {
        e.phase = phase;
        e.count = count;
      }));
    }
    std::string text = f->text + static_cast<char>(b);
    if (text.size() > kMaxKeyBytes) return;
    if (n.additional < 0) {
      bool viable = false;
      for (size_t i = 0; i < n.properties.size() && !viable; ++i)
        viable = !obj.seen[i] && n.properties[i].key.compare(0, text.size(), text) == 0;
      if (!viable) return;
    }
    out.push_back(edited(*f, [&](Frame& e) {
      e.phase = phase;
      e.count = count;
      e.text = std::move(text);
    }));
  }

  void close_key(const Frame& k, const Frame& obj, const SchemaNode& n, Tops& out) const {
    int prop = -1;
    for (size_t i = 0; i < n.properties.size(); ++i)
      if (n.properties[i].key == k.text) {
        if (obj.seen[i]) return;  // a key twice
        prop = static_cast<int>(i);
      }
    if (prop < 0 && n.additional < 0) return;
    out.push_back(edited(obj, [&](Frame& e) {
      e.phase = 1;
      e.ws = 0;
      e.pending = prop >= 0 ? n.properties[static_cast<size_t>(prop)].node : n.additional;
      if (prop >= 0) e.seen[static_cast<size_t>(prop)] = true;
    }));
  }

  void array(const FramePtr& f, uint8_t b, Tops& out) const {
    if (is_ws(b)) return whitespace(*f, out);
    const SchemaNode& n = g_.node(f->node);
    const int ph = f->phase;
    if (b == ']' && ((ph == 0 && n.min_items == 0) || (ph == 3 && f->count >= n.min_items))) {
      if (FramePtr p = completed(f->parent)) out.push_back(std::move(p));
    } else if (b == ',' && ph == 3) {
      if (n.max_items < 0 || f->count < n.max_items)
        out.push_back(edited(*f, [](Frame& e) {
          e.phase = 1;
          e.ws = 0;
        }));
    } else if ((ph == 0 && n.max_items != 0) || ph == 1) {
      FramePtr in_value = edited(*f, [](Frame& e) {
        e.phase = 2;
        e.ws = 0;
      });
      start_value(n.items, in_value, f->depth, b, out, 0);
    }
  }

  void string(const FramePtr& f, uint8_t b, Tops& out) const {
    if (f->phase == 0 && b == '"') {
      if (FramePtr p = completed(f->parent)) out.push_back(std::move(p));
      return;
    }
    int phase = f->phase, count = f->count;
    if (!string_byte(phase, count, b)) return;
    if (phase == f->phase && count == f->count) return out.push_back(f);
    out.push_back(edited(*f, [&](Frame& e) {
      e.phase = phase;
      e.count = count;
    }));
  }

  void number(const FramePtr& f, uint8_t b, Tops& out) const {
    const int next = number_next(f->phase, b, f->node == 1);
    if (next >= 0 && f->count < kMaxNumberBytes)
      out.push_back(edited(*f, [&](Frame& e) {
        e.phase = next;
        ++e.count;
      }));
    if (number_complete(f->phase))
      if (FramePtr p = completed(f->parent)) step(p, b, out);
  }

  bool literal_done(const Frame& f) const {
    const auto& lits = g_.node(f.node).literals;
    return std::any_of(f.cands.begin(), f.cands.end(), [&](int c) {
      return lits[static_cast<size_t>(c)].size() == static_cast<size_t>(f.count);
    });
  }

  void literal(const FramePtr& f, uint8_t b, Tops& out) const {
    const auto& lits = g_.node(f->node).literals;
    const auto at = static_cast<size_t>(f->count);
    std::vector<int> next;
    for (int c : f->cands) {
      const std::string& l = lits[static_cast<size_t>(c)];
      if (l.size() > at && static_cast<uint8_t>(l[at]) == b) next.push_back(c);
    }
    if (!next.empty())
      out.push_back(edited(*f, [&](Frame& e) {
        e.cands = std::move(next);
        ++e.count;
      }));
    if (literal_done(*f))
      if (FramePtr p = completed(f->parent)) step(p, b, out);
  }

  const JsonGrammar& g_;
};

void append_key(const Frame* f, std::string& k) {
  for (; f; f = f->parent.get()) {
    k += static_cast<char>('A' + static_cast<int>(f->kind));
    for (int v : {f->node, f->phase, f->ws, f->count, f->depth, f->pending})
      k += std::to_string(v) + ',';
    for (bool s : f->seen) k += s ? '1' : '0';
    k += '|' + f->text + '|';
    for (int c : f->cands) k += std::to_string(c) + ',';
    k += ';';
  }
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar)
    : grammar_(std::move(grammar)) {
  auto end = std::make_shared<Frame>(Frame{.kind = FrameKind::kEnd});
  if (grammar_->exact_text()) {  // the root's literals, as they are: no whitespace before
    Frame l{.kind = FrameKind::kLiteral, .node = grammar_->root(), .parent = std::move(end)};
    for (size_t i = 0; i < grammar_->node(l.node).literals.size(); ++i)
      l.cands.push_back(static_cast<int>(i));
    tops_.push_back(std::make_shared<Frame>(std::move(l)));
    return;
  }
  tops_.push_back(std::make_shared<Frame>(
      Frame{.kind = FrameKind::kValue, .node = grammar_->root(), .parent = std::move(end)}));
}

JsonMatcher JsonMatcher::advance(uint8_t byte) const {
  const Stepper s(*grammar_);
  std::vector<FramePtr> next;
  for (const FramePtr& f : tops_) s.step(f, byte, next);
  if (next.size() > 1) {  // readings that met again: keep one of each
    std::vector<std::pair<std::string, FramePtr>> keyed;
    for (FramePtr& f : next) {
      std::string k;
      append_key(f.get(), k);
      keyed.emplace_back(std::move(k), std::move(f));
    }
    std::sort(keyed.begin(), keyed.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    next.clear();
    for (size_t i = 0; i < keyed.size(); ++i)
      if (i == 0 || keyed[i].first != keyed[i - 1].first)
        next.push_back(std::move(keyed[i].second));
  }
  if (next.size() > kMaxReadings) next.resize(kMaxReadings);
  return JsonMatcher(grammar_, std::move(next));
}

JsonMatcher JsonMatcher::advance(std::string_view bytes) const {
  JsonMatcher m = *this;
  for (char c : bytes) {
    if (m.dead()) break;
    m = m.advance(static_cast<uint8_t>(c));
  }
  return m;
}

bool JsonMatcher::complete() const {
  const Stepper s(*grammar_);
  return std::any_of(tops_.begin(), tops_.end(), [&](const FramePtr& f) { return s.ends(f); });
}

bool JsonMatcher::absorbs(uint8_t byte) const {
  if (!string_plain(byte) || tops_.empty()) return false;
  return std::all_of(tops_.begin(), tops_.end(), [&](const FramePtr& f) {
    if (f->phase != 0) return false;
    if (f->kind == FrameKind::kString) return true;
    return f->kind == FrameKind::kKey && grammar_->node(f->parent->node).properties.empty();
  });
}

std::string JsonMatcher::key() const {
  std::vector<std::string> keys;
  for (const FramePtr& f : tops_) {
    keys.emplace_back();
    append_key(f.get(), keys.back());
  }
  std::sort(keys.begin(), keys.end());
  std::string k;
  for (const std::string& s : keys) k += s + '#';
  return k;
}

}  // namespace deltaserve::structured
