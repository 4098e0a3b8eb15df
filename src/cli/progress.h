// Progress of a run for a person watching: on a terminal, one status line
// redrawn in place (done/total, images/min, ETA, memory, LoRA hit rate) that
// log lines scroll above; otherwise a plain log line at most every
// `interval_s` seconds (and for the last image), for cron mails and CI logs.
#pragma once

#include <memory>
#include <string>

#include <sdxl_batch/sdxl_batch.h>

namespace sdxl::cli {

class Progress {
 public:
  // `terminal`: redraw a bar (call stderr_is_terminal() to decide).
  Progress(bool terminal, double interval_s);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void update(const sdxl_batch::Progress& info);
  void finish();  // clears the bar

  static bool stderr_is_terminal();
  // "[#####.....] 12/64 (3 skipped, 1 failed) | 3.1 img/min | ETA 4m05s | mem 10.65 GiB | <extra>"
  static std::string status_line(const sdxl_batch::Progress& info, int bar_width);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string format_eta(double seconds);

}  // namespace sdxl::cli
