// UnetRunner: the UNet calls of one batch's sampling loop. The conditioning
// (context, pooled, time_ids) is bound once per batch; each step then passes
// the latents and the timestep. With CUDA graphs on, the first step of a new
// shape runs the TorchScript module as usual, the second captures that same
// call into a CUDA graph, and every later step replays it: the interpreter's
// per-op CPU cost (most of a step at batch 1, see bench/results) is paid once.
// Graphs are kept per shape (up to kMaxGraphs, least recently used dropped) and
// share one memory pool: they never replay at the same time, so the pool holds
// the largest shape's activations, not their sum, and a batch file that
// alternates sizes captures each size once instead of at every switch.
// The captured kernels are the ones the interpreter launches, so images match
// the uncaptured path (checked on the GPU by bench/gpu_runtime.sh check). A graph
// that cannot be captured falls back to plain calls with a warning.
// Backends: "torchscript" (unet.ts) or "aoti" (unet.pt2, see model/aoti_unet.h;
// it shares unet.ts's weights, so LoRA patches apply to both). With aoti, a
// shape outside the package's compiled ranges runs on unet.ts (logged once per
// shape); CUDA graphs capture whichever backend the shape runs on. Steps with
// ControlNet residuals or IP-Adapter tokens run unet.ts's methods for them,
// captured as graphs of their own.
// Not thread-safe (the sampling stage's); one per model bundle.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

namespace c10::cuda {
class CUDAStream;
}  // namespace c10::cuda

#include "model/aoti_unet.h"
#include "model/sdxl_model.h"

namespace sdxl {

// A call's regional inputs (unet.ts's forward_regional methods; docs/story-tools.md#regions): for each
// attention grid (model.json unet.regions.downscales) the prompts' weights [rows, prompts, n_d] and, with
// an IP-Adapter, its groups' masks [rows, groups, n_d] (pipeline/region_weights.h). No weights: a plain call.
struct RegionInputs {
  std::vector<torch::Tensor> weights, ip_masks;
  bool on() const { return !weights.empty(); }
};

class UnetRunner {
 public:
  // backend: "torchscript" or "aoti"; anything else throws UsageError, aoti on a
  // model without unet.pt2 (or for another device/dtype) throws ModelError.
  // `device_mu` (optional): taken exclusively while a graph is captured; the
  // other pipeline stages hold it shared while they use the device.
  UnetRunner(SdxlModel& model, bool cuda_graphs, const std::string& backend = "torchscript",
             std::shared_mutex* device_mu = nullptr);
  ~UnetRunner();
  UnetRunner(const UnetRunner&) = delete;
  UnetRunner& operator=(const UnetRunner&) = delete;

  // The conditioning of the calls until the next bind: the text's, and an
  // IP-Adapter's keys and values per cross-attention layer (k_0, v_0, ...,
  // rows as the context's; empty: none). With regions the context is [rows, prompts, L, C], the keys and
  // values [rows, groups, T, C], and every call runs a forward_regional method.
  void bind(const torch::Tensor& context, const torch::Tensor& pooled, const torch::Tensor& time_ids,
            const std::vector<torch::Tensor>& ip_kv = {}, RegionInputs regions = {});
  // Noise prediction for latents x [rows, 4, h, w] at timestep t [rows], with
  // ControlNet residuals added to the UNet's blocks when given (the down
  // residuals, then the mid one). With a graph the result is its static
  // output: use it before the next call. Calls with residuals or IP-Adapter
  // tokens run unet.ts's forward_control / forward_ip / forward_control_ip
  // (never unet.pt2), as shapes of their own: warmed up, then captured as graphs
  // too (the residuals are copied into the graph's inputs at each step).
  torch::Tensor operator()(const torch::Tensor& x, const torch::Tensor& t,
                           const std::vector<torch::Tensor>& residuals = {});
  // The conditioning bound last; a ControlNet of the same call takes the task's own prompt
  // (text_context: with regions, the first of each row's prompts).
  const torch::Tensor& context() const { return context_; }
  torch::Tensor text_context() const { return context_.dim() == 4 ? context_.select(1, 0) : context_; }
  const torch::Tensor& pooled() const { return pooled_; }
  const torch::Tensor& time_ids() const { return time_ids_; }
  static constexpr size_t kMaxGraphs = 8;
  // Drops captured graphs and their memory pool (then empty the allocator cache).
  void release();
  // release() at the next bind(), from any thread (the graph may be replaying now).
  void request_release() { release_requested_ = true; }

  bool graphs_enabled() const { return graphs_; }
  const char* backend() const { return aoti_ ? "aoti" : "torchscript"; }
  // Counters, readable from any thread.
  int aoti_calls() const { return aoti_calls_; }
  int fallback_calls() const { return fallback_calls_; }  // aoti backend, shape outside unet.pt2's ranges
  int captures() const { return captures_; }
  int replays() const { return replays_; }
  int graphs_held() const { return graphs_held_; }
  // Seconds spent in each new shape's first (discarded) call, and capturing graphs.
  double first_call_seconds() const { return static_cast<double>(first_call_us_) / 1e6; }
  double capture_seconds() const { return static_cast<double>(capture_us_) / 1e6; }

 private:
  struct Graph;
  // One UNet call on the selected backend (no graph); with residuals or
  // ip_kv, the unet.ts method that takes them.
  torch::Tensor call(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                     const torch::Tensor& pooled, const torch::Tensor& time_ids,
                     const std::vector<torch::Tensor>& residuals, const std::vector<torch::Tensor>& ip_kv,
                     const RegionInputs& regions);
  // One call of a unet.ts method that takes residuals, IP-Adapter tokens or regions.
  torch::Tensor call_method(std::vector<c10::IValue> inputs, const std::vector<torch::Tensor>& residuals,
                            const std::vector<torch::Tensor>& ip_kv, const RegionInputs& regions);
  // The steps of operator(): a discarded first call per shape, a graph's
  // replay, making room for a graph, capturing one (or falling back to plain
  // calls for good when capture fails).
  void warm_up(const std::vector<std::int64_t>& key, const torch::Tensor& x, const torch::Tensor& t,
               const std::vector<torch::Tensor>& residuals);
  torch::Tensor replay(Graph& g, const torch::Tensor& x, const torch::Tensor& t,
                       const std::vector<torch::Tensor>& residuals);
  void drop_least_recent_graph();
  torch::Tensor capture(const std::vector<std::int64_t>& key, const torch::Tensor& x, const torch::Tensor& t,
                        const std::vector<torch::Tensor>& residuals);
  void end_failed_capture(Graph& g, const c10::cuda::CUDAStream& side);
  SdxlModel& model_;
  std::unique_ptr<AotiUnet> aoti_;
  std::set<std::vector<std::int64_t>> fallback_logged_;
  std::set<std::vector<std::int64_t>> warmed_;  // shapes whose first (discarded) call was made
  std::atomic<int> aoti_calls_{0}, fallback_calls_{0};
  bool graphs_;
  torch::Tensor context_, pooled_, time_ids_;
  std::vector<torch::Tensor> ip_kv_;
  RegionInputs regions_;
  // Captured graphs by shape (latents sizes + context sizes), with the step at
  // which each was last used (for the LRU drop); one shared memory pool.
  std::map<std::vector<std::int64_t>, std::unique_ptr<Graph>> graphs_by_key_;
  std::pair<unsigned long long, unsigned long long> pool_{0, 0};  // at::cuda::MempoolId_t
  std::uint64_t use_clock_ = 0;
  std::uint64_t bind_generation_ = 0;  // a graph copies the bound conditioning once per bind()
  std::vector<std::int64_t> plain_key_;  // the shape of the latest plain calls (any bind)
  int plain_calls_ = 0;
  std::atomic<int> captures_{0}, replays_{0}, graphs_held_{0};
  std::atomic<std::int64_t> first_call_us_{0}, capture_us_{0};
  std::shared_mutex* device_mu_ = nullptr;
  std::atomic<bool> release_requested_{false};
};

}  // namespace sdxl
