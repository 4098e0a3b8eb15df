// BoundedQueue: a queue of at most `capacity` items between threads. push()
// waits while it is full, pop() while it is empty; after close(), pop() drains
// what is left and then returns nothing. The pipeline's stages hand batches on
// through these, so what is in flight (and its memory) stays bounded.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace sdxl {

template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(std::size_t capacity) : capacity_(std::max<std::size_t>(1, capacity)) {}
  void push(T item) {
    std::unique_lock lk(mu_);
    space_.wait(lk, [&] { return items_.size() < capacity_; });
    items_.push_back(std::move(item));
    ready_.notify_one();
  }
  std::optional<T> pop() {
    std::unique_lock lk(mu_);
    ready_.wait(lk, [&] { return closed_ || !items_.empty(); });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    space_.notify_one();
    return item;
  }
  void close() {
    std::lock_guard lk(mu_);
    closed_ = true;
    ready_.notify_all();
  }

 private:
  std::size_t capacity_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<T> items_;
  bool closed_ = false;
};

}  // namespace sdxl
