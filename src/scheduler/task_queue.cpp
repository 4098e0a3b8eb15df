#include "scheduler/task_queue.h"

#include <algorithm>
#include <cmath>

namespace sdxl {

void TaskQueue::push(QueuedImage image) {
  image.sequence = next_sequence_++;
  items_.push_back(std::move(image));
}

void TaskQueue::requeue(std::vector<QueuedImage> images) {
  for (auto& im : images) items_.push_back(std::move(im));  // sequence and enqueued_s kept
}

int TaskQueue::effective_class(const QueuedImage& image, double now_s) const {
  int cls = static_cast<int>(image.priority);
  if (policy_.aging_s > 0) {
    const double waited = now_s - image.enqueued_s;
    if (waited > 0) cls -= static_cast<int>(std::floor(waited / policy_.aging_s));
  }
  return std::max(0, cls);
}

bool TaskQueue::before(const QueuedImage& a, const QueuedImage& b, double now_s, const std::string& lora) const {
  if (policy_.file_order) return a.sequence < b.sequence;
  const int ca = effective_class(a, now_s), cb = effective_class(b, now_s);
  if (ca != cb) return ca < cb;
  const bool da = a.deadline_s >= 0, db = b.deadline_s >= 0;
  if (da != db) return da;
  if (da && a.deadline_s != b.deadline_s) return a.deadline_s < b.deadline_s;
  const bool la = a.lora_set == lora, lb = b.lora_set == lora;
  if (la != lb) return la;
  return a.sequence < b.sequence;
}

std::vector<QueuedImage> TaskQueue::ordered(double now_s, const std::string& current_lora) const {
  std::vector<QueuedImage> v = items_;
  std::sort(v.begin(), v.end(),
            [&](const QueuedImage& a, const QueuedImage& b) { return before(a, b, now_s, current_lora); });
  return v;
}

std::vector<QueuedImage> TaskQueue::pop_batch(double now_s, const std::string& current_lora,
                                              const std::function<int(const QueuedImage&, int)>& admit) {
  std::vector<QueuedImage> out;
  if (items_.empty()) return out;
  std::vector<size_t> idx(items_.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(),
            [&](size_t a, size_t b) { return before(items_[a], items_[b], now_s, current_lora); });
  const QueuedImage& head = items_[idx[0]];
  const int head_class = effective_class(head, now_s);
  std::vector<size_t> candidates{idx[0]};
  // Same class first (already in order), then lower classes when allowed.
  for (size_t k = 1; k < idx.size(); ++k) {
    const QueuedImage& q = items_[idx[k]];
    if (q.group != head.group) {
      if (policy_.file_order) break;  // a batch is a run of consecutive compatible images
      continue;
    }
    if (!policy_.fill_lower && effective_class(q, now_s) != head_class) continue;
    candidates.push_back(idx[k]);
  }
  const int available = static_cast<int>(std::min<size_t>(candidates.size(), static_cast<size_t>(std::max(1, policy_.max_batch))));
  int n = admit ? admit(head, available) : available;
  n = std::clamp(n, 1, available);
  candidates.resize(static_cast<size_t>(n));
  for (size_t c : candidates) out.push_back(items_[c]);
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  for (size_t c : candidates) items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(c));
  return out;
}

std::vector<QueuedImage> TaskQueue::newly_hopeless(double now_s, const std::string& current_lora,
                                                   double seconds_per_image) {
  std::vector<QueuedImage> out;
  if (!(seconds_per_image > 0)) return out;
  const std::vector<QueuedImage> order = ordered(now_s, current_lora);
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const QueuedImage& q = order[pos];
    if (q.deadline_s < 0) continue;
    const double finish = now_s + seconds_per_image * static_cast<double>(pos + 1);
    if (finish <= q.deadline_s) continue;
    auto it = std::lower_bound(reported_hopeless_.begin(), reported_hopeless_.end(), q.sequence);
    if (it != reported_hopeless_.end() && *it == q.sequence) continue;
    reported_hopeless_.insert(it, q.sequence);
    out.push_back(q);
  }
  return out;
}

}  // namespace sdxl
