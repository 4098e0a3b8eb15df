#include "batch/json_fields.h"

namespace sdxl {

using nlohmann::json;

void JsonFields::check_keys(const json& obj, const std::string& pointer, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : obj.items()) {
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      add(pointer + "/" + key, "unknown key (allowed here: " + list + ")");
    }
  }
}

bool JsonFields::get_string(const json& obj, const std::string& pointer, const char* key, std::string& out) {
  if (!obj.contains(key)) return false;
  if (!obj[key].is_string()) {
    add(pointer + "/" + key, "must be a string");
    return false;
  }
  out = obj[key].get<std::string>();
  return true;
}

bool JsonFields::get_int(const json& obj, const std::string& pointer, const char* key, long long lo, long long hi,
                         long long& out) {
  if (!obj.contains(key)) return false;
  const json& v = obj[key];
  if (!v.is_number_integer()) {
    add(pointer + "/" + key, "must be an integer");
    return false;
  }
  long long x = v.get<long long>();
  if (x < lo || x > hi) {
    add(pointer + "/" + key, std::to_string(x) + " is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
    return false;
  }
  out = x;
  return true;
}

bool JsonFields::get_number(const json& obj, const std::string& pointer, const char* key, double lo, double hi,
                            double& out) {
  if (!obj.contains(key)) return false;
  const json& v = obj[key];
  if (!v.is_number()) {
    add(pointer + "/" + key, "must be a number");
    return false;
  }
  double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    add(pointer + "/" + key, "is out of range " + std::to_string(lo) + ".." + std::to_string(hi));
    return false;
  }
  out = x;
  return true;
}

}  // namespace sdxl
