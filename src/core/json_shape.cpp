#include "core/json_shape.h"

#include <nlohmann/json.hpp>
#include <set>

namespace sdxl {
namespace {

using json = nlohmann::json;

// A SAX pass (nlohmann's SAX parser keeps its own stack, not the call stack).
class ShapeSax : public nlohmann::json_sax<json> {
 public:
  ShapeSax(int max_depth, JsonShape& out) : max_depth_(max_depth), out_(out) {}

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.key = k;
    if (!f.keys.insert(k).second)
      out_.problems.emplace_back(pointer(), "the key \"" + k + "\" is written twice in this object (JSON keeps only "
                                            "the last one without a word): remove one");
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  struct Frame {
    bool object = false;
    std::set<std::string> keys;
    std::string key;
    std::size_t index = 0;
  };
  std::string pointer() const {
    std::string p;
    for (const Frame& f : stack_) p += "/" + (f.object ? escape_json_pointer(f.key) : std::to_string(f.index));
    return p;
  }
  bool value() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
    return true;
  }
  bool open(bool object) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      out_.too_deep = true;
      out_.problems.emplace_back(pointer(), "nested deeper than " + std::to_string(max_depth_) + " levels");
      return false;
    }
    stack_.push_back({object, {}, {}, 0});
    return true;
  }
  bool close() {
    stack_.pop_back();
    return value();
  }

  int max_depth_;
  JsonShape& out_;
  std::vector<Frame> stack_;
};

}  // namespace

std::string escape_json_pointer(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out.push_back(c);
  }
  return out;
}

JsonShape check_json_shape(const std::string& text, int max_depth) {
  JsonShape shape;
  ShapeSax sax(max_depth, shape);
  json::sax_parse(text, &sax);
  return shape;
}

}  // namespace sdxl
