#include "server/json_body.h"

#include <memory>
#include <unordered_map>
#include <vector>

namespace deltaserve::server {

namespace {

// Builds an ordered_json bottom-up from SAX events. Object keys are looked up by a linear scan
// while an object is small and through a hash index once it grows, so no insertion is quadratic.
class BoundedBuilder {
 public:
  using string_t = json::string_t;
  using binary_t = json::binary_t;
  static constexpr size_t kIndexFrom = 16;

  BoundedBuilder(json& root, const JsonLimits& limits, std::string& error)
      : root_(root), limits_(limits), error_(error) {}

  bool null() { return add(json(nullptr)) != nullptr; }
  bool boolean(bool v) { return add(json(v)) != nullptr; }
  bool number_integer(json::number_integer_t v) { return add(json(v)) != nullptr; }
  bool number_unsigned(json::number_unsigned_t v) { return add(json(v)) != nullptr; }
  bool number_float(json::number_float_t v, const string_t&) { return add(json(v)) != nullptr; }
  bool string(string_t& v) { return add(json(std::move(v))) != nullptr; }
  bool binary(binary_t&) { return fail("binary values are not JSON"); }

  bool start_object(size_t) { return open(json::object()); }
  bool start_array(size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(string_t& k) {
    if (!count()) return false;
    frames_.back().key = std::move(k);
    return true;
  }

  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception&) {
    if (error_.empty())
      error_ = "Malformed JSON in the request body (at byte " + std::to_string(position) + ")";
    return false;
  }

 private:
  struct Frame {
    json* value;
    std::string key;  // objects: the key of the next value
    std::unique_ptr<std::unordered_map<std::string, size_t>> index;  // large objects only
  };

  bool fail(const std::string& msg) {
    if (error_.empty()) error_ = msg;
    return false;
  }

  bool count() {
    if (++values_ > limits_.max_values)
      return fail("the request body has more than " + std::to_string(limits_.max_values) +
                  " JSON values");
    return true;
  }

  bool open(json container) {
    if (frames_.size() >= limits_.max_depth)
      return fail("the request body nests JSON deeper than " + std::to_string(limits_.max_depth) +
                  " levels");
    json* slot = add(std::move(container));
    if (!slot) return false;
    frames_.push_back({slot, {}, nullptr});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  // Places `v` in the open container (or as the root); returns where it now lives.
  json* add(json v) {
    if (!count()) return nullptr;
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.value->is_array()) {
      auto& arr = f.value->get_ref<json::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    auto& items = static_cast<json::object_t::Container&>(f.value->get_ref<json::object_t&>());
    if (const size_t at = find(f, items); at != items.size()) {
      items[at].second = std::move(v);  // a duplicated key keeps its last value
      return &items[at].second;
    }
    if (f.index) f.index->emplace(f.key, items.size());
    items.emplace_back(std::move(f.key), std::move(v));
    if (!f.index && items.size() >= kIndexFrom) {
      f.index = std::make_unique<std::unordered_map<std::string, size_t>>();
      for (size_t i = 0; i < items.size(); ++i) f.index->emplace(items[i].first, i);
    }
    return &items.back().second;
  }

  static size_t find(const Frame& f, const json::object_t::Container& items) {
    if (f.index) {
      const auto it = f.index->find(f.key);
      return it == f.index->end() ? items.size() : it->second;
    }
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].first == f.key) return i;
    return items.size();
  }

  json& root_;
  const JsonLimits& limits_;
  std::string& error_;
  std::vector<Frame> frames_;
  size_t values_ = 0;
};

}  // namespace

bool parse_json_body(std::string_view body, json& out, std::string& error,
                     const JsonLimits& limits) {
  error.clear();
  json root;
  BoundedBuilder builder(root, limits, error);
  const bool ok = json::sax_parse(body.begin(), body.end(), &builder);
  if (!ok) {
    if (error.empty()) error = "Malformed JSON in the request body";
    return false;
  }
  out = std::move(root);
  return true;
}

std::string dump_json(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace deltaserve::server
