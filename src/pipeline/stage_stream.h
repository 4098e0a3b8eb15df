// StageStream: the CUDA stream of one pipeline stage (text encode, sampling,
// VAE decode) and the events that hand tensors from one stage to the next.
// A stage thread makes its stream current with a Scope; a producer records a
// StageEvent after its last kernel; the consumer's stream waits for that event
// and marks the handed tensors with record_stream, so the caching allocator
// does not give their memory to the producer's stream while the consumer still
// reads it. On the CPU every call is a no-op and the stages are plain threads.
#pragma once

#include <torch/types.h>

#include <memory>
#include <optional>

namespace c10::cuda {
class CUDAStream;
class CUDAStreamGuard;
}  // namespace c10::cuda

namespace sdxl {

// An event recorded on a stage's stream ("no event" on the CPU).
struct StageEvent {
  std::shared_ptr<void> event;  // at::cuda::CUDAEvent when set
};

class StageStream {
 public:
  StageStream();  // CPU: no stream
  // A stream from the device's pool; `high_priority` for the stage that keeps
  // the GPU busy (sampling), normal priority otherwise.
  StageStream(const torch::Device& device, bool high_priority);
  ~StageStream();
  StageStream(StageStream&&) noexcept;
  StageStream& operator=(StageStream&&) noexcept;

  bool is_cuda() const { return stream_ != nullptr; }

  // Makes the stream (and its device) current on this thread until the scope ends.
  class Scope {
   public:
    explicit Scope(const StageStream& s);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::unique_ptr<c10::cuda::CUDAStreamGuard> guard_;
  };

  // An event after everything queued on this stream so far.
  StageEvent record() const;
  // Work queued on this stream from now on waits for `e` (no host wait).
  void wait(const StageEvent& e) const;
  // `t` is used on this stream too: its memory is not reused until this
  // stream's work queued so far is done (Tensor::record_stream).
  void hand_over(const torch::Tensor& t) const;
  // Blocks the calling thread until this stream's queued work is done.
  void synchronize() const;

 private:
  std::unique_ptr<c10::cuda::CUDAStream> stream_;
};

}  // namespace sdxl
