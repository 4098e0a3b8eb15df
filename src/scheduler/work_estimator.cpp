#include "scheduler/work_estimator.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "core/atomic_file.h"

namespace sdxl {

namespace {
constexpr size_t kTimeWindow = 8;
}

void WorkEstimator::observe_memory(int width, int height, int batch, std::uint64_t peak_work_bytes,
                                   std::uint64_t sample_peak_bytes, int controlnets) {
  if (batch < 1) return;
  auto& m = memory_[{width, height, controlnets}][batch];
  m = std::max(m, peak_work_bytes);
  if (sample_peak_bytes > 0) {
    auto& s = sample_memory_[{width, height, controlnets}][batch];
    s = std::max(s, std::min(sample_peak_bytes, peak_work_bytes));
  }
}

void WorkEstimator::observe_time(int width, int height, int batch, int steps, double seconds, int controlnets) {
  if (batch < 1 || steps < 1 || !(seconds > 0)) return;
  auto& v = time_[{width, height, controlnets}][batch];
  v.push_back(seconds / batch / steps);
  if (v.size() > kTimeWindow) v.erase(v.begin());
}

void WorkEstimator::observe_detailer_regions(const std::string& detector, int regions) {
  auto& [images, total] = detailer_[detector];
  ++images;
  total += std::max(0, regions);
}

std::optional<double> WorkEstimator::detailer_regions_per_image(const std::string& detector) const {
  const auto it = detailer_.find(detector);
  if (it == detailer_.end() || it->second.first <= 0) return std::nullopt;
  return static_cast<double>(it->second.second) / static_cast<double>(it->second.first);
}

std::optional<std::uint64_t> WorkEstimator::peak_bytes(int width, int height, int batch, int controlnets) const {
  auto it = memory_.find({width, height, controlnets});
  if (it == memory_.end() || it->second.empty() || batch < 1) return std::nullopt;
  const auto& obs = it->second;
  if (auto exact = obs.find(batch); exact != obs.end() && obs.size() == 1) return exact->second;
  if (obs.size() == 1) {
    const auto& [n, p] = *obs.begin();
    std::uint64_t sample = 0;
    if (auto s = sample_memory_.find(it->first); s != sample_memory_.end())
      if (auto sn = s->second.find(n); sn != s->second.end()) sample = sn->second;
    if (sample > 0) {  // only the sampling part grows with the batch
      if (batch <= n) return p;
      const double grow = static_cast<double>(sample) / n * (batch - n);
      return p + static_cast<std::uint64_t>(std::ceil(grow));
    }
    const double per = static_cast<double>(p) / n;
    return static_cast<std::uint64_t>(std::ceil(per * batch));
  }
  // Least-squares a + b*n, then raised so that it covers every observation.
  double sn = 0, sp = 0, snn = 0, snp = 0;
  const double k = static_cast<double>(obs.size());
  for (const auto& [n, p] : obs) {
    sn += n;
    sp += static_cast<double>(p);
    snn += static_cast<double>(n) * n;
    snp += static_cast<double>(n) * static_cast<double>(p);
  }
  const double den = k * snn - sn * sn;
  double b = den != 0 ? (k * snp - sn * sp) / den : 0.0;
  b = std::max(b, 0.0);
  double a = (sp - b * sn) / k;
  double lift = 0;
  for (const auto& [n, p] : obs) lift = std::max(lift, static_cast<double>(p) - (a + b * n));
  a += lift;
  const double est = std::max(a + b * batch, 0.0);
  return static_cast<std::uint64_t>(std::ceil(est));
}

int WorkEstimator::max_batch(int width, int height, int max_n, std::uint64_t free_bytes, double safety,
                             int controlnets) const {
  if (max_n <= 1 || !peak_bytes(width, height, 1, controlnets)) return 1;
  int best = 1;
  for (int n = 2; n <= max_n; ++n) {
    const auto est = peak_bytes(width, height, n, controlnets);
    if (!est || static_cast<double>(*est) * safety > static_cast<double>(free_bytes)) break;
    best = n;
  }
  return best;
}

std::optional<TimeEstimate> WorkEstimator::seconds_per_image(int width, int height, int batch, int steps,
                                                             int controlnets) const {
  if (time_.empty() || steps < 1) return std::nullopt;
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  if (auto it = time_.find({width, height, controlnets}); it != time_.end()) {
    if (auto b = it->second.find(batch); b != it->second.end()) return TimeEstimate{mean(b->second) * steps, true};
    // Nearest batch size of this resolution.
    const auto* best = &*it->second.begin();
    for (const auto& e : it->second)
      if (std::abs(e.first - batch) < std::abs(best->first - batch)) best = &e;
    return TimeEstimate{mean(best->second) * steps, false};
  }
  // Nearest resolution by pixel count (with the same ControlNets first), scaled by pixels.
  const double px = static_cast<double>(width) * height;
  const bool same_known = std::any_of(time_.begin(), time_.end(),
                                      [&](const auto& kv) { return std::get<2>(kv.first) == controlnets; });
  double best_ratio = std::numeric_limits<double>::infinity(), per = 0;
  for (const auto& [res, by_batch] : time_) {
    if (same_known && std::get<2>(res) != controlnets) continue;
    const double rpx = static_cast<double>(std::get<0>(res)) * std::get<1>(res);
    const double ratio = std::abs(std::log(px / rpx));
    if (ratio < best_ratio) {
      best_ratio = ratio;
      const auto* b = &*by_batch.begin();
      for (const auto& e : by_batch)
        if (std::abs(e.first - batch) < std::abs(b->first - batch)) b = &e;
      per = mean(b->second) * px / rpx;
    }
  }
  return TimeEstimate{per * steps, false};
}

namespace {

// side_modules_key in the saved JSON: "controlnets": N (when > 0), "ip_adapter": true, "upscaler": true,
// "regions": N (when > 0).
void add_side_modules(nlohmann::json& j, int key) {
  if (key % kIpAdapterKey > 0) j["controlnets"] = key % kIpAdapterKey;
  if (key % kUpscalerKey >= kIpAdapterKey) j["ip_adapter"] = true;
  if (key % kRegionsKey >= kUpscalerKey) j["upscaler"] = true;
  if (key >= kRegionsKey) j["regions"] = key / kRegionsKey;
}
int side_modules_of(const nlohmann::json& j) {
  return j.value("controlnets", 0) + (j.value("ip_adapter", false) ? kIpAdapterKey : 0) +
         (j.value("upscaler", false) ? kUpscalerKey : 0) + j.value("regions", 0) * kRegionsKey;
}

}  // namespace

std::string WorkEstimator::to_json() const {
  nlohmann::json j = {{"format", 1}, {"device", device_}, {"model", model_}};
  nlohmann::json mem = nlohmann::json::array(), tim = nlohmann::json::array();
  for (const auto& [res, by_batch] : memory_)
    for (const auto& [n, p] : by_batch) {
      nlohmann::json m = {{"width", std::get<0>(res)}, {"height", std::get<1>(res)}, {"batch", n},
                          {"peak_work_bytes", p}};
      add_side_modules(m, std::get<2>(res));
      if (auto s = sample_memory_.find(res); s != sample_memory_.end())
        if (auto sn = s->second.find(n); sn != s->second.end()) m["sample_peak_bytes"] = sn->second;
      mem.push_back(m);
    }
  for (const auto& [res, by_batch] : time_)
    for (const auto& [n, v] : by_batch) {
      nlohmann::json t = {{"width", std::get<0>(res)}, {"height", std::get<1>(res)}, {"batch", n},
                          {"seconds_per_image_step", v}};
      add_side_modules(t, std::get<2>(res));
      tim.push_back(t);
    }
  j["memory"] = mem;
  j["time"] = tim;
  nlohmann::json det = nlohmann::json::array();
  for (const auto& [detector, counts] : detailer_)
    det.push_back({{"detector", detector}, {"images", counts.first}, {"regions", counts.second}});
  if (!det.empty()) j["detailer"] = det;
  return j.dump(1) + "\n";
}

WorkEstimator WorkEstimator::load(const std::filesystem::path& path, const std::string& device,
                                  const std::string& model, std::string* why_not) {
  WorkEstimator e(device, model);
  if (read(path, device, model, e, why_not) != Saved::ok) return WorkEstimator(device, model);
  return e;
}

void WorkEstimator::fill_from(const WorkEstimator& other) {
  for (const auto& [res, by_batch] : other.memory_)
    for (const auto& [n, p] : by_batch) {
      auto& m = memory_[res][n];
      m = std::max(m, p);
    }
  for (const auto& [res, by_batch] : other.sample_memory_)
    for (const auto& [n, p] : by_batch) {
      auto& m = sample_memory_[res][n];
      m = std::max(m, p);
    }
  for (const auto& [res, by_batch] : other.time_)
    for (const auto& [n, v] : by_batch) time_[res].try_emplace(n, v);
  for (const auto& [detector, counts] : other.detailer_) detailer_.try_emplace(detector, counts);
}

WorkEstimator::Saved WorkEstimator::read(const std::filesystem::path& path, const std::string& device,
                                         const std::string& model, WorkEstimator& e, std::string* why_not) {
  std::ifstream in(path);
  if (!in) {
    if (why_not) *why_not = "no saved estimates at " + path.string();
    return Saved::missing;
  }
  try {
    std::stringstream ss;
    ss << in.rdbuf();
    const auto j = nlohmann::json::parse(ss.str());
    if (!j.is_object() || !j.contains("memory") || !j.contains("time"))
      throw std::runtime_error("no \"memory\" and \"time\" figures");
    if (j.value("device", "") != device || j.value("model", "") != model) {
      if (why_not)
        *why_not = path.string() + " holds estimates for " + j.value("model", "?") + " on " + j.value("device", "?") +
                   ", not " + model + " on " + device;
      return Saved::other_device_or_model;
    }
    for (const auto& m : j.at("memory"))
      e.observe_memory(m.at("width").get<int>(), m.at("height").get<int>(), m.at("batch").get<int>(),
                       m.at("peak_work_bytes").get<std::uint64_t>(), m.value("sample_peak_bytes", std::uint64_t{0}),
                       side_modules_of(m));
    for (const auto& t : j.at("time")) {
      auto& v = e.time_[{t.at("width").get<int>(), t.at("height").get<int>(), side_modules_of(t)}]
                       [t.at("batch").get<int>()];
      for (const auto& x : t.at("seconds_per_image_step")) {
        const double s = x.get<double>();
        if (s > 0 && std::isfinite(s)) v.push_back(s);
      }
      if (v.size() > kTimeWindow) v.erase(v.begin(), v.end() - static_cast<std::ptrdiff_t>(kTimeWindow));
    }
    if (j.contains("detailer"))
      for (const auto& d : j.at("detailer")) {
        const long long images = d.at("images").get<long long>(), regions = d.at("regions").get<long long>();
        if (images > 0 && regions >= 0) e.detailer_[d.at("detector").get<std::string>()] = {images, regions};
      }
  } catch (const std::exception& ex) {
    if (why_not) *why_not = path.string() + " is not a valid estimates file (" + ex.what() + "); starting afresh";
    e = WorkEstimator(device, model);
    return Saved::invalid;
  }
  return Saved::ok;
}

void WorkEstimator::save(const std::filesystem::path& path) const { write_file_atomic(path, to_json()); }

}  // namespace sdxl
