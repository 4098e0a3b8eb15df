// TaskQueue: the order in which a run makes its images, and which of them
// share one UNet call. torch-free, deterministic (a function of the pushed
// images, the clock values passed in and the admission callback), not
// thread-safe (one dispatcher owns it).
//
// Order, best first:
//  1. effective priority class: high, mid, low; an image waiting longer than
//     `aging_s` moves up one class per `aging_s` waited, so low-priority work
//     cannot starve behind a stream of high-priority work;
//  2. within a class, images with a deadline first, earliest deadline first;
//  3. then images that use the LoRA set already applied (fewer switches);
//  4. then arrival order (FIFO).
// A batch is the best image plus the next compatible ones (same `group`: size,
// steps, sampler, LoRA set...) in that order, as many as the admission callback
// allows (the memory budget). Empty places of a batch are filled with
// compatible images of lower classes only when `fill_lower` is on: one UNet
// call for n images costs less than n calls, so they ride along for little.
//
// Cost: the order is sorted once and kept (with each group's images in that
// order) while it cannot change — the same LoRA set, no image's class changed
// by aging, nothing pushed or requeued — so popping every image of n in
// batches takes O(n log n) plus a sort per change, not a sort per batch.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "batch/priority.h"

namespace sdxl {

struct QueuedImage {
  std::size_t handle = 0;       // the caller's index of the image
  Priority priority = Priority::kMid;
  double deadline_s = -1;       // on the run clock (seconds since start); < 0: none
  std::string group;            // images with equal groups may share a UNet call
  std::string lora_set;         // "" = no LoRA; used to avoid switches
  double enqueued_s = 0;        // run clock when it was queued (aging)
  std::uint64_t sequence = 0;   // set by push(): arrival order
};

// The library's default of --max-batch (sdxl_batch::RunOptions::max_batch takes it): one image per UNet
// call, every image bit-identical to the same seed made alone.
inline constexpr int kDefaultMaxBatch = 1;

struct QueuePolicy {
  double aging_s = 900;  // a waiting image moves up one class per aging_s (<= 0: no aging)
  int max_batch = kDefaultMaxBatch;  // images per UNet call at most
  bool fill_lower = true;
  // Strictly the order images were pushed (the batch file's): no classes,
  // deadlines, aging or LoRA affinity. A baseline to measure the queue against.
  bool file_order = false;
};

class TaskQueue {
 public:
  explicit TaskQueue(QueuePolicy policy = {}) : policy_(policy) {}

  void push(QueuedImage image);
  bool empty() const { return alive_ == 0; }
  std::size_t size() const { return alive_; }
  const QueuePolicy& policy() const { return policy_; }

  // Class after aging at time `now_s` (0 = high).
  int effective_class(const QueuedImage& image, double now_s) const;

  // Removes and returns the next batch (empty when the queue is). `admit(head,
  // available)` returns how many images of head's group may run together now
  // (clamped to 1..available); `current_lora` is the LoRA set applied now.
  std::vector<QueuedImage> pop_batch(double now_s, const std::string& current_lora,
                                     const std::function<int(const QueuedImage& head, int available)>& admit);

  // Images whose deadline can no longer be met: now + the estimated time until
  // each would finish (its position in the order times `seconds_per_image`) is
  // past its deadline. Each image is returned once per run.
  std::vector<QueuedImage> newly_hopeless(double now_s, const std::string& current_lora, double seconds_per_image);

  // Puts images back (a batch that was split after an out-of-memory, a retry)
  // keeping their original arrival order and waiting time.
  void requeue(std::vector<QueuedImage> images);

  // The whole queue in the order it would run, without removing anything.
  std::vector<QueuedImage> ordered(double now_s, const std::string& current_lora) const;
  // The image pop_batch would start its batch with (the queue must not be empty).
  QueuedImage front(double now_s, const std::string& current_lora);

 private:
  bool before(const QueuedImage& a, const QueuedImage& b, double now_s, const std::string& lora) const;
  // The earliest time after now_s at which aging may change `image`'s class (a
  // little early, so rounding never lets a change pass unseen); +inf for never.
  double next_class_change(const QueuedImage& image, double now_s) const;
  // Makes order_ the order at (now_s, lora), sorting again only when it may differ.
  void ensure_order(double now_s, const std::string& lora);
  std::size_t head_index();

  // The order of the images not taken, valid for now_s in [built_s, until_s)
  // and one LoRA set; indices into items_.
  struct Order {
    bool valid = false;
    std::string lora;
    double built_s = 0, until_s = 0;
    std::vector<std::size_t> all;  // best first; all[next..] may hold images not taken
    std::size_t next = 0;
    struct Group {
      std::vector<std::size_t> members;  // in the order of `all`
      std::size_t next = 0;              // members before it are taken
    };
    std::unordered_map<std::string, Group> groups;
  };

  QueuePolicy policy_;
  std::vector<QueuedImage> items_;  // images pushed; taken_ marks those popped since the last sort
  std::vector<char> taken_;
  std::size_t alive_ = 0;
  Order order_;
  std::vector<std::uint64_t> reported_hopeless_;  // sequences, sorted
  std::uint64_t next_sequence_ = 0;
};

}  // namespace sdxl
