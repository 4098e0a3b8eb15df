#include "pipeline/stage_stream.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace sdxl {

StageStream::StageStream() = default;
StageStream::~StageStream() = default;
StageStream::StageStream(StageStream&&) noexcept = default;
StageStream& StageStream::operator=(StageStream&&) noexcept = default;

StageStream::StageStream(const torch::Device& device, bool high_priority) {
  if (!device.is_cuda()) return;
  stream_ = std::make_unique<c10::cuda::CUDAStream>(c10::cuda::getStreamFromPool(high_priority, device.index()));
}

StageStream::Scope::Scope(const StageStream& s) {
  if (s.stream_) guard_ = std::make_unique<c10::cuda::CUDAStreamGuard>(*s.stream_);
}
StageStream::Scope::~Scope() = default;

StageEvent StageStream::record() const {
  StageEvent e;
  if (!stream_) return e;
  auto ev = std::make_shared<at::cuda::CUDAEvent>();
  ev->record(*stream_);
  e.event = ev;
  return e;
}

void StageStream::wait(const StageEvent& e) const {
  if (!stream_ || !e.event) return;
  static_cast<at::cuda::CUDAEvent*>(e.event.get())->block(*stream_);
}

void StageStream::hand_over(const torch::Tensor& t) const {
  if (!stream_ || !t.defined() || !t.is_cuda()) return;
  t.record_stream(c10::Stream(*stream_));
}

void StageStream::synchronize() const {
  if (stream_) stream_->synchronize();
}

}  // namespace sdxl
