#include "cli/progress.h"

#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "cli/cli_common.h"

namespace sdxl::cli {

std::string format_eta(double s) {
  if (!(s >= 0) || std::isinf(s)) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

namespace {

// Wraps the stderr sink: clears the status line before a log line and draws
// it again after, so log lines scroll above the bar instead of through it.
class BarSink : public spdlog::sinks::sink {
 public:
  explicit BarSink(spdlog::sink_ptr inner) : inner_(std::move(inner)) {}
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard lk(mu_);
    if (!bar_.empty()) std::fputs("\r\033[K", stderr);
    inner_->log(msg);
    inner_->flush();
    draw_locked();
  }
  void flush() override { inner_->flush(); }
  void set_pattern(const std::string& pattern) override { inner_->set_pattern(pattern); }
  void set_formatter(std::unique_ptr<spdlog::formatter> f) override { inner_->set_formatter(std::move(f)); }
  void set_bar(std::string bar) {
    std::lock_guard lk(mu_);
    bar_ = std::move(bar);
    std::fputs("\r\033[K", stderr);
    draw_locked();
  }
  spdlog::sink_ptr inner() const { return inner_; }

 private:
  void draw_locked() {
    if (!bar_.empty()) std::fputs(bar_.c_str(), stderr);
    std::fflush(stderr);
  }
  spdlog::sink_ptr inner_;
  std::mutex mu_;
  std::string bar_;
};

}  // namespace

struct Progress::Impl {
  bool terminal = false;
  double interval_s = 10;
  std::shared_ptr<BarSink> bar;
  std::chrono::steady_clock::time_point last_line{};
  bool any_line = false;
};

Progress::Progress(bool terminal, double interval_s) : impl_(std::make_unique<Impl>()) {
  impl_->terminal = terminal;
  impl_->interval_s = interval_s;
  if (terminal) {
    auto& sinks = spdlog::default_logger()->sinks();
    if (!sinks.empty()) {
      impl_->bar = std::make_shared<BarSink>(sinks.front());
      sinks.front() = impl_->bar;
    }
  }
}

Progress::~Progress() { finish(); }

bool Progress::stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

std::string Progress::status_line(const sdxl_batch::Progress& p, int bar_width) {
  const int finished = p.done + p.failed + p.skipped;
  std::string bar;
  if (bar_width > 0) {
    const int filled = p.total > 0 ? static_cast<int>(std::lround(static_cast<double>(bar_width) * finished / p.total)) : 0;
    bar = "[" + std::string(static_cast<size_t>(std::clamp(filled, 0, bar_width)), '#') +
          std::string(static_cast<size_t>(bar_width - std::clamp(filled, 0, bar_width)), '.') + "] ";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%d/%d", finished, p.total);
  std::string s = bar + buf;
  if (p.skipped > 0 || p.failed > 0) {
    s += " (";
    if (p.skipped > 0) s += std::to_string(p.skipped) + " already done";
    if (p.skipped > 0 && p.failed > 0) s += ", ";
    if (p.failed > 0) s += std::to_string(p.failed) + " failed";
    s += ")";
  }
  std::snprintf(buf, sizeof buf, " | %.1f img/min | ETA %s | mem %s", p.images_per_minute, format_eta(p.eta_s).c_str(),
                format_bytes(p.memory_bytes).c_str());
  s += buf;
  if (!p.extra.empty()) s += " | " + p.extra;
  return s;
}

void Progress::update(const sdxl_batch::Progress& info) {
  if (impl_->terminal && impl_->bar) {
    impl_->bar->set_bar(status_line(info, 24));
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const bool last = info.done + info.failed + info.skipped >= info.total;
  if (impl_->any_line && !last &&
      std::chrono::duration<double>(now - impl_->last_line).count() < impl_->interval_s)
    return;
  impl_->any_line = true;
  impl_->last_line = now;
  spdlog::info("progress {} | last {}", status_line(info, 0), info.last_file);
}

void Progress::finish() {
  if (!impl_ || !impl_->bar) return;
  impl_->bar->set_bar("");
  auto& sinks = spdlog::default_logger()->sinks();
  if (!sinks.empty() && sinks.front() == impl_->bar) sinks.front() = impl_->bar->inner();
  impl_->bar.reset();
}

}  // namespace sdxl::cli
