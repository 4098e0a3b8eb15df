// The writer pool: finished images go to disk on background threads, so the
// device starts the next batch at once. Each image is encoded as a PNG with
// its A1111 `parameters`, written atomically inside the output folder, then
// its manifest line is appended and fsynced, then it is counted and recorded
// for the report. An IoError (disk full, permissions) stops the run: later
// images are dropped (a rerun makes them). Finished images never pile up in
// memory: push() waits while the pool's bounded queue is full.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/bounded_queue.h"
#include "scheduler/write_job.h"

namespace sdxl {

struct RunState;

// Writes one image and records it in `run` (takes run.mu itself).
void write_image(RunState& run, WriteJob& job);

class WriterPool {
 public:
  WriterPool(RunState& run, int threads);
  ~WriterPool() { finish(); }
  WriterPool(const WriterPool&) = delete;
  WriterPool& operator=(const WriterPool&) = delete;
  void push(WriteJob job) { jobs_.push(std::move(job)); }
  // Waits for every queued job, then stops the threads.
  void finish();

 private:
  BoundedQueue<WriteJob> jobs_;
  std::vector<std::thread> threads_;
};

}  // namespace sdxl
