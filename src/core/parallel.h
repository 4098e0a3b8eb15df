// parallel_ranges: body(begin, end) over [0, n) in contiguous parts, on up to hardware_concurrency()
// threads (at most 32) when `work` (in units of about one multiply-add) is large enough to pay for
// the threads. Each part must write only its own outputs: the result is then the same bytes whatever
// the number of threads. torch-free.
#pragma once

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace sdxl {

template <typename Body>
void parallel_ranges(std::size_t n, double work, Body body) {
  const std::size_t hw = std::max(1U, std::thread::hardware_concurrency());
  const std::size_t parts = std::min({hw, n, static_cast<std::size_t>(work / 2e6) + 1, std::size_t{32}});
  if (parts <= 1) return body(std::size_t{0}, n);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < parts; ++k) threads.emplace_back(body, n * k / parts, n * (k + 1) / parts);
  for (std::thread& t : threads) t.join();
}

}  // namespace sdxl
