#include "scheduler/task_queue.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace sdxl {

void TaskQueue::push(QueuedImage image) {
  image.sequence = next_sequence_++;
  items_.push_back(std::move(image));
  taken_.push_back(0);
  ++alive_;
  order_.valid = false;
}

void TaskQueue::requeue(std::vector<QueuedImage> images) {
  for (auto& im : images) {  // sequence and enqueued_s kept
    items_.push_back(std::move(im));
    taken_.push_back(0);
    ++alive_;
  }
  order_.valid = false;
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
  std::vector<QueuedImage> v;
  v.reserve(alive_);
  for (size_t i = 0; i < items_.size(); ++i)
    if (!taken_[i]) v.push_back(items_[i]);
  std::sort(v.begin(), v.end(),
            [&](const QueuedImage& a, const QueuedImage& b) { return before(a, b, now_s, current_lora); });
  return v;
}

double TaskQueue::next_class_change(const QueuedImage& image, double now_s) const {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  if (policy_.file_order || !(policy_.aging_s > 0) || effective_class(image, now_s) == 0) return kNever;
  const double waited = now_s - image.enqueued_s;
  const double k = waited > 0 ? std::floor(waited / policy_.aging_s) + 1 : 1;
  const double t = image.enqueued_s + k * policy_.aging_s;
  return t - 1e-9 * (1 + std::abs(t));
}

void TaskQueue::ensure_order(double now_s, const std::string& lora) {
  Order& o = order_;
  if (o.valid && (policy_.file_order || lora == o.lora) && now_s >= o.built_s && now_s < o.until_s) return;
  // Drop the images taken since the last sort, then sort the rest.
  size_t kept = 0;
  for (size_t i = 0; i < items_.size(); ++i)
    if (!taken_[i]) {
      if (kept != i) items_[kept] = std::move(items_[i]);
      ++kept;
    }
  items_.resize(kept);
  taken_.assign(kept, 0);
  o.all.resize(kept);
  for (size_t i = 0; i < kept; ++i) o.all[i] = i;
  std::sort(o.all.begin(), o.all.end(), [&](size_t a, size_t b) { return before(items_[a], items_[b], now_s, lora); });
  o.groups.clear();
  o.until_s = std::numeric_limits<double>::infinity();
  for (const size_t i : o.all) {
    o.groups[items_[i].group].members.push_back(i);
    o.until_s = std::min(o.until_s, next_class_change(items_[i], now_s));
  }
  if (!(o.until_s > now_s)) o.until_s = std::nextafter(now_s, std::numeric_limits<double>::infinity());
  o.next = 0;
  o.lora = lora;
  o.built_s = now_s;
  o.valid = true;
}

size_t TaskQueue::head_index() {
  while (taken_[order_.all[order_.next]]) ++order_.next;
  return order_.all[order_.next];
}

QueuedImage TaskQueue::front(double now_s, const std::string& current_lora) {
  ensure_order(now_s, current_lora);
  return items_[head_index()];
}

std::vector<QueuedImage> TaskQueue::pop_batch(double now_s, const std::string& current_lora,
                                              const std::function<int(const QueuedImage&, int)>& admit) {
  std::vector<QueuedImage> out;
  if (empty()) return out;
  ensure_order(now_s, current_lora);
  const size_t head_i = head_index();
  const QueuedImage& head = items_[head_i];
  const size_t cap = static_cast<size_t>(std::max(1, policy_.max_batch));
  std::vector<size_t> candidates{head_i};
  const int head_class = effective_class(head, now_s);
  if (policy_.file_order) {  // a batch is a run of consecutive compatible images
    for (size_t k = order_.next + 1; k < order_.all.size() && candidates.size() < cap; ++k) {
      const size_t i = order_.all[k];
      if (taken_[i]) continue;
      if (items_[i].group != head.group) break;
      if (!policy_.fill_lower && effective_class(items_[i], now_s) != head_class) continue;
      candidates.push_back(i);
    }
  } else {  // the group's next images: same class first (in order), then lower classes when allowed
    Order::Group& g = order_.groups[head.group];
    while (taken_[g.members[g.next]]) ++g.next;  // members[next] is the head
    for (size_t k = g.next + 1; k < g.members.size() && candidates.size() < cap; ++k) {
      const size_t i = g.members[k];
      if (taken_[i]) continue;
      if (!policy_.fill_lower && effective_class(items_[i], now_s) != head_class) break;  // classes only fall
      candidates.push_back(i);
    }
  }
  const int available = static_cast<int>(candidates.size());
  int n = admit ? admit(head, available) : available;
  n = std::clamp(n, 1, available);
  candidates.resize(static_cast<size_t>(n));
  for (const size_t c : candidates) {
    out.push_back(items_[c]);
    taken_[c] = 1;
  }
  alive_ -= candidates.size();
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
