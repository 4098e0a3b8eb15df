#include "pipeline/unet_runner.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <spdlog/spdlog.h>
#include <torch/script.h>

#include <chrono>

#include "device/device.h"
#include "core/error.h"
#include "device/device_errors.h"
#include "model/model_config.h"

namespace sdxl {
namespace {

// `waiter` waits for the work queued on `producer` so far.
void stream_wait(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& producer) {
  at::cuda::CUDAEvent ev;
  ev.record(producer);
  ev.block(waiter);
}

}  // namespace

struct UnetRunner::Graph {
  at::cuda::CUDAGraph graph;
  torch::Tensor x, t, context, pooled, time_ids, out;
  std::vector<torch::Tensor> residuals, ip_kv;  // static copies (residuals per step, ip_kv per bind)
  RegionInputs regions;                          // static copies, per bind
  std::uint64_t last_used = 0;
  std::uint64_t bind_generation = 0;  // the bind() whose conditioning the static inputs hold
};

UnetRunner::UnetRunner(SdxlModel& model, bool cuda_graphs, const std::string& backend, std::shared_mutex* device_mu)
    : model_(model), graphs_(cuda_graphs && model.device.is_cuda()), device_mu_(device_mu) {
  std::string why;
  const std::string chosen =
      resolve_unet_backend(model.config, backend, model.device.is_cuda() ? "cuda" : "cpu", dtype_name(model.dtype), &why,
                           cuda_capability(model.device));
  if (backend == "auto") spdlog::info("--unet-backend auto: {} ({})", chosen, why);
  if (chosen == "aoti") aoti_ = std::make_unique<AotiUnet>(model);
}

torch::Tensor UnetRunner::call_method(std::vector<c10::IValue> inputs, const std::vector<torch::Tensor>& residuals,
                                      const std::vector<torch::Tensor>& ip_kv, const RegionInputs& regions) {
  auto tuple = [](const std::vector<torch::Tensor>& v) {
    return c10::ivalue::Tuple::create(std::vector<c10::IValue>(v.begin(), v.end()));
  };
  std::string method = regions.on() ? "forward_regional" : "forward";
  if (regions.on()) inputs.emplace_back(tuple(regions.weights));
  if (!residuals.empty()) {
    inputs.emplace_back(tuple(residuals));
    method += "_control";
  }
  if (!ip_kv.empty()) {
    inputs.emplace_back(tuple(ip_kv));
    if (regions.on()) inputs.emplace_back(tuple(regions.ip_masks));
    method += "_ip";
  }
  return translate_device_errors(("unet.ts " + method).c_str(),
                                 [&] { return model_.unet.get_method(method)(inputs).toTensor(); });
}

torch::Tensor UnetRunner::call(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context,
                               const torch::Tensor& pooled, const torch::Tensor& time_ids,
                               const std::vector<torch::Tensor>& residuals, const std::vector<torch::Tensor>& ip_kv,
                               const RegionInputs& regions) {
  if (!residuals.empty() || !ip_kv.empty() || regions.on())
    return call_method({x, t, context, pooled, time_ids}, residuals, ip_kv, regions);
  if (aoti_) {
    if (aoti_->covers(x, context)) {
      ++aoti_calls_;
      return aoti_->run(x, t, context, pooled, time_ids);
    }
    std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
    key.push_back(context.size(1));
    if (fallback_logged_.insert(key).second)
      spdlog::info("unet.pt2 was compiled for {}; latents [{}, {}, {}, {}] with {} tokens run on {}", aoti_->ranges(),
                   x.size(0), x.size(1), x.size(2), x.size(3), context.size(1), model_.config.unet_file);
    ++fallback_calls_;
  }
  return run_module(model_.unet, "unet", {x, t, context, pooled, time_ids}).toTensor();
}

UnetRunner::~UnetRunner() = default;

void UnetRunner::bind(const torch::Tensor& context, const torch::Tensor& pooled, const torch::Tensor& time_ids,
                      const std::vector<torch::Tensor>& ip_kv, RegionInputs regions) {
  if (release_requested_.exchange(false) && !graphs_by_key_.empty()) {
    release();
    c10::cuda::CUDACachingAllocator::emptyCache();  // the graphs' private pool, back to the driver
  }
  context_ = context;
  pooled_ = pooled;
  time_ids_ = time_ids;
  ip_kv_ = ip_kv;
  regions_ = std::move(regions);
  ++bind_generation_;  // plain calls count on across binds: a prompt edit rebinds at every call it switches
}

void UnetRunner::release() {
  graphs_by_key_.clear();  // the last graph of the pool frees it
  graphs_held_ = 0;
  pool_ = {0, 0};
  plain_key_.clear();
  plain_calls_ = 0;
}

torch::Tensor UnetRunner::operator()(const torch::Tensor& x, const torch::Tensor& t,
                                   const std::vector<torch::Tensor>& residuals) {
  std::vector<std::int64_t> key(x.sizes().begin(), x.sizes().end());
  key.insert(key.end(), context_.sizes().begin(), context_.sizes().end());
  // calls with residuals or IP-Adapter tokens run other methods: shapes of their own
  if (!residuals.empty()) key.push_back(-1);
  if (!ip_kv_.empty()) key.insert(key.end(), {-2, ip_kv_.front().size(1)});
  if (regions_.on()) {  // forward_regional*: the groups' token count too (context's sizes hold the prompts)
    key.push_back(-3);
    if (!ip_kv_.empty()) key.push_back(ip_kv_.front().size(2));
  }
  warm_up(key, x, t, residuals);
  if (!graphs_) return call(x, t, context_, pooled_, time_ids_, residuals, ip_kv_, regions_);
  if (auto it = graphs_by_key_.find(key); it != graphs_by_key_.end()) return replay(*it->second, x, t, residuals);
  // A shape without a graph: a plain call first (the graph is captured at the second).
  if (key != plain_key_) {
    plain_key_ = key;
    plain_calls_ = 0;
  }
  if (++plain_calls_ < 2) return call(x, t, context_, pooled_, time_ids_, residuals, ip_kv_, regions_);
  if (graphs_by_key_.size() >= kMaxGraphs) drop_least_recent_graph();
  return capture(key, x, t, residuals);
}

void UnetRunner::warm_up(const std::vector<std::int64_t>& key, const torch::Tensor& x, const torch::Tensor& t,
                         const std::vector<torch::Tensor>& residuals) {
  // The very first call of a shape in a process is discarded: on CUDA it can
  // differ from every later call by a rounding step, so without it an image
  // would depend on whether it came first on its GPU.
  if (!warmed_.insert(key).second) return;
  // Timed (one sync per shape and process): a new shape's first call pays
  // for kernel loading and cuDNN / cuBLAS plan choice; the report shows it.
  const auto t0 = std::chrono::steady_clock::now();
  (void)call(x, t, context_, pooled_, time_ids_, residuals, ip_kv_, regions_);
  if (model_.device.is_cuda()) c10::cuda::getCurrentCUDAStream(model_.device.index()).synchronize();
  first_call_us_ += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
}

torch::Tensor UnetRunner::replay(Graph& g, const torch::Tensor& x, const torch::Tensor& t,
                                 const std::vector<torch::Tensor>& residuals) {
  g.last_used = ++use_clock_;
  g.x.copy_(x);
  g.t.copy_(t);
  for (size_t i = 0; i < residuals.size(); ++i) g.residuals[i].copy_(residuals[i]);
  if (g.bind_generation != bind_generation_) {  // once per bind(), not per step
    g.context.copy_(context_);
    g.pooled.copy_(pooled_);
    g.time_ids.copy_(time_ids_);
    for (size_t i = 0; i < ip_kv_.size(); ++i) g.ip_kv[i].copy_(ip_kv_[i]);
    for (size_t i = 0; i < regions_.weights.size(); ++i) g.regions.weights[i].copy_(regions_.weights[i]);
    for (size_t i = 0; i < regions_.ip_masks.size(); ++i) g.regions.ip_masks[i].copy_(regions_.ip_masks[i]);
    g.bind_generation = bind_generation_;
  }
  g.graph.replay();
  ++replays_;
  return g.out;
}

void UnetRunner::drop_least_recent_graph() {
  auto lru = graphs_by_key_.begin();
  for (auto it = graphs_by_key_.begin(); it != graphs_by_key_.end(); ++it)
    if (it->second->last_used < lru->second->last_used) lru = it;
  graphs_by_key_.erase(lru);
  graphs_held_ = static_cast<int>(graphs_by_key_.size());
}

torch::Tensor UnetRunner::capture(const std::vector<std::int64_t>& key, const torch::Tensor& x, const torch::Tensor& t,
                                  const std::vector<torch::Tensor>& residuals) {
  // Capture the call on a side stream, then replay it for this step.
  const auto capture_t0 = std::chrono::steady_clock::now();
  auto g = std::make_unique<Graph>();
  g->x = x.clone();
  g->t = t.clone();
  g->context = context_.clone();
  g->pooled = pooled_.clone();
  g->time_ids = time_ids_.clone();
  for (const torch::Tensor& r : residuals) g->residuals.push_back(r.clone());
  for (const torch::Tensor& kv : ip_kv_) g->ip_kv.push_back(kv.clone());
  for (const torch::Tensor& w : regions_.weights) g->regions.weights.push_back(w.clone());
  for (const torch::Tensor& m : regions_.ip_masks) g->regions.ip_masks.push_back(m.clone());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(model_.device.index());
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, model_.device.index());
  stream_wait(side, current);  // the static inputs are filled on `current`
  // The graph allocates from its own pool: hand the plain step's cached blocks
  // back first, so a tight budget (--vram-limit) holds one copy, not two.
  // The other pipeline stages stay off the device during the capture (they
  // hold this lock shared), and the capture is thread-local besides.
  std::unique_lock<std::shared_mutex> exclusive;
  if (device_mu_) exclusive = std::unique_lock<std::shared_mutex>(*device_mu_);
  c10::cuda::CUDACachingAllocator::emptyCache();
  // Every graph of this runner allocates from one pool: they replay one at a
  // time, and each one's output stays allocated (held in Graph::out), so a
  // later capture reuses only the earlier ones' temporaries.
  if (pool_ == std::pair<unsigned long long, unsigned long long>{0, 0}) pool_ = at::cuda::graph_pool_handle();
  bool capturing = false;
  // The guard outlives the try: capture_end() must run on the capturing stream,
  // also when the forward threw, or the stream stays in capture mode and every
  // later CUDA call fails.
  c10::cuda::CUDAStreamGuard guard(side);
  try {
    g->graph.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
    capturing = true;
    g->out = call(g->x, g->t, g->context, g->pooled, g->time_ids, g->residuals, g->ip_kv, g->regions);
    capturing = false;
    g->graph.capture_end();
  } catch (const std::exception& e) {
    if (capturing) end_failed_capture(*g, side);
    guard.reset_stream(current);
    stream_wait(current, side);
    g.reset();
    release();
    c10::cuda::CUDACachingAllocator::emptyCache();
    graphs_ = false;
    spdlog::warn("CUDA graph capture of the UNet failed, continuing without graphs: {}", e.what());
    return call(x, t, context_, pooled_, time_ids_, residuals, ip_kv_, regions_);
  }
  guard.reset_stream(current);
  stream_wait(current, side);
  ++captures_;
  capture_us_ += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - capture_t0).count();
  spdlog::debug("captured the UNet step as a CUDA graph for latents [{}, {}, {}, {}] ({} graph(s) held)", x.size(0),
                x.size(1), x.size(2), x.size(3), graphs_by_key_.size() + 1);
  g->bind_generation = bind_generation_;  // cloned from the bound tensors above
  g->last_used = ++use_clock_;
  Graph& kept = *g;
  graphs_by_key_[key] = std::move(g);
  graphs_held_ = static_cast<int>(graphs_by_key_.size());
  kept.graph.replay();
  ++replays_;
  return kept.out;
}

void UnetRunner::end_failed_capture(Graph& g, const c10::cuda::CUDAStream& side) {
  try {
    g.graph.capture_end();
  } catch (const std::exception&) {
    // an invalidated capture still ends here; the graph is dropped by the caller
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t dropped = nullptr;  // last resort: end the capture by hand
    if (cudaStreamEndCapture(side.stream(), &dropped) == cudaSuccess && dropped) cudaGraphDestroy(dropped);
  }
  (void)cudaGetLastError();  // clear the capture error so later calls do not report it
}

}  // namespace sdxl
