#include "sdxl/batch_runner.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "sdxl/atomic_file.h"
#include "sdxl/lora.h"
#include "sdxl/manifest.h"
#include "sdxl/png_writer.h"
#include "sdxl/report_html.h"
#include "sdxl/sha256.h"

namespace sdxl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct WorkItem {
  const BatchTask* task;
  int index;
  GenerationParams params;  // seed resolved
  std::string file;         // relative to the output folder
  Priority priority = Priority::kMid;
  double deadline_unix = -1;
  int attempts = 0;          // failed attempts so far (retries)
  double not_before_s = 0;   // run clock: retry backoff
};

std::string local_date() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

bool same_settings(const GenerationParams& a, const GenerationParams& b) {
  return a.prompt == b.prompt && a.negative_prompt == b.negative_prompt && a.seed == b.seed && a.steps == b.steps &&
         std::abs(a.cfg - b.cfg) < 1e-9 && a.width == b.width && a.height == b.height && a.sampler == b.sampler &&
         a.schedule == b.schedule && a.guidance_rescale == b.guidance_rescale && a.init_image == b.init_image &&
         a.strength == b.strength && a.hires.scale == b.hires.scale && a.hires.upscaler == b.hires.upscaler &&
         a.hires.steps == b.hires.steps && a.hires.denoise == b.hires.denoise &&
         a.loras == b.loras;
}

// The image path must stay inside the output folder, also through links; the
// check comes before any folder is created so nothing is made outside it.
fs::path checked_output_path(const fs::path& out_dir_canonical, const std::string& rel) {
  const fs::path p = out_dir_canonical / rel;
  std::error_code ec;
  const fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
  const std::string base = out_dir_canonical.string();
  const std::string got = parent.string();
  if (ec || got.compare(0, base.size(), base) != 0 || (got.size() > base.size() && got[base.size()] != '/'))
    throw UsageError("output file '" + rel + "' would leave the output folder '" + base + "' (through a link?)");
  fs::create_directories(p.parent_path(), ec);
  if (ec) throw IoError("cannot create folder '" + p.parent_path().string() + "': " + ec.message());
  return p;
}

// Temporary files of write_file_atomic (".<name>.<pid>.<n>.tmp") left by a run
// that was killed. Files of a live process (another shard) are kept.
int remove_stale_temp_files(const fs::path& dir) {
  int removed = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 6 || name[0] != '.' || name.compare(name.size() - 4, 4, ".tmp") != 0) continue;
    const size_t dot_n = name.rfind('.', name.size() - 5);
    const size_t dot_pid = dot_n == std::string::npos || dot_n == 0 ? std::string::npos : name.rfind('.', dot_n - 1);
    if (dot_pid == std::string::npos) continue;
    const std::string pid_text = name.substr(dot_pid + 1, dot_n - dot_pid - 1);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::stol(pid_text);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;  // still running
    std::error_code rm_ec;
    if (fs::remove(it->path(), rm_ec)) ++removed;
  }
  return removed;
}


double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string image_label(const WorkItem& w) { return w.task->id + "#" + std::to_string(w.index); }

// What is left to make: the shard's images minus those the manifest and the
// files show as done (unless force). Random seeds come from the manifest.
struct WorkList {
  std::vector<WorkItem> work;
  nlohmann::json skipped = nlohmann::json::array();
  int total = 0, skipped_count = 0;
};

WorkList build_work(const BatchFile& batch, const RunOptions& o, const Manifest& manifest, const fs::path& out_dir,
                    const std::string& date, double start_unix) {
  WorkList wl;
  for (size_t pos = 0; pos < batch.tasks.size(); ++pos) {
    if (!in_shard(pos, o.shard_index, o.shard_count)) continue;
    const BatchTask& task = batch.tasks[pos];
    std::int64_t base = task.params.seed;
    if (task.seed_random) {
      const auto recorded = o.force ? std::nullopt : manifest.task_base_seed(task.id);
      base = recorded ? *recorded : random_seed();
    }
    const Priority prio = parse_priority(task.priority).value_or(Priority::kMid);
    const double deadline = task.deadline.empty() ? -1.0 : parse_deadline_unix(task.deadline, start_unix);
    for (int i = 0; i < task.count; ++i) {
      WorkItem w{&task, i, task.params, "", prio, deadline, 0, 0};
      w.params.seed = base + i;
      w.file = output_file_name(task, i, w.params.seed, batch.name_template, date);
      ++wl.total;
      if (!o.force) {
        const auto e = manifest.find(task.id, i);
        if (e && same_settings(e->params, w.params)) {
          const auto sha = sha256_file_hex(out_dir / e->file);
          if (sha && *sha == e->sha256) {
            ++wl.skipped_count;
            wl.skipped.push_back({{"task", task.id}, {"index", i}, {"seed", e->seed}, {"file", e->file}});
            continue;
          }
          spdlog::info("{} #{}: {} is missing or changed since it was recorded; generating it again", task.id, i, e->file);
        }
      }
      wl.work.push_back(std::move(w));
    }
  }
  return wl;
}

TaskQueue make_queue(const std::vector<WorkItem>& work, const RunOptions& o, double start_unix) {
  TaskQueue q(o.queue);
  for (size_t k = 0; k < work.size(); ++k) {
    QueuedImage qi;
    qi.handle = k;
    qi.priority = work[k].priority;
    qi.deadline_s = work[k].deadline_unix < 0 ? -1.0 : std::max(0.0, work[k].deadline_unix - start_unix);
    qi.group = batch_group_key(work[k].params);
    qi.lora_set = lora_set_key(work[k].params);
    q.push(qi);
  }
  return q;
}

// One finished image on its way to disk.
struct WriteJob {
  WorkItem item;
  GeneratedImage image;
  double start_s = 0, generate_s = 0;
  int batch_size = 1;
  std::uint64_t memory_bytes = 0;
  std::string device;
};

// A queue of at most `capacity` items between threads: push() waits while it
// is full, pop() while it is empty; after close(), pop() drains what is left
// and then returns nothing. Stages hand batches on through these, so what is
// in flight (and its memory) stays bounded.
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}
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
  size_t capacity_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<T> items_;
  bool closed_ = false;
};

// Encodes and writes PNGs on background threads so the device starts the next
// batch at once; finished images never pile up in memory (bounded queue).
class WriterPool {
 public:
  WriterPool(int threads, size_t capacity, std::function<void(WriteJob&)> work)
      : jobs_(capacity), work_(std::move(work)) {
    for (int i = 0; i < std::max(1, threads); ++i)
      threads_.emplace_back([this] {
        while (auto job = jobs_.pop()) work_(*job);
      });
  }
  ~WriterPool() { finish(); }
  void push(WriteJob job) { jobs_.push(std::move(job)); }
  // Waits for every queued job, then stops the threads.
  void finish() {
    jobs_.close();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  BoundedQueue<WriteJob> jobs_;
  std::function<void(WriteJob&)> work_;
  std::vector<std::thread> threads_;
};

// Seconds during which at least one / at least two of the intervals are open.
std::pair<double, double> busy_and_overlap(std::vector<std::pair<double, double>> iv) {
  std::vector<std::pair<double, int>> ev;
  for (const auto& [a, b] : iv)
    if (b > a) {
      ev.emplace_back(a, +1);
      ev.emplace_back(b, -1);
    }
  std::sort(ev.begin(), ev.end());
  double busy = 0, overlap = 0, last = 0;
  int open = 0;
  for (const auto& [t, d] : ev) {
    if (open >= 1) busy += t - last;
    if (open >= 2) overlap += t - last;
    open += d;
    last = t;
  }
  return {busy, overlap};
}

}  // namespace

std::string report_file_name(int shard_index, int shard_count) {
  if (shard_count <= 1) return "report.json";
  return "report-shard-" + std::to_string(shard_index) + "-of-" + std::to_string(shard_count) + ".json";
}

std::string lora_set_key(const GenerationParams& p) {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return std::string(buf);
  };
  std::string key;
  for (const auto& l : p.loras) key += l.path.string() + ":" + num(l.weight) + ";";
  for (const auto& t : extract_lora_tags(p.prompt).tags) key += "<" + t.name + ":" + num(t.weight) + ">;";
  return key;
}

std::string batch_group_key(const GenerationParams& p) {
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return std::string(buf);
  };
  std::string key = std::to_string(p.width) + "x" + std::to_string(p.height) + "|" + std::to_string(p.steps) + "|" +
                    p.sampler + "|" + p.schedule + "|cfg" + num(p.cfg);
  if (p.guidance_rescale != 0) key += "|rescale" + num(p.guidance_rescale);
  if (!p.init_image.empty()) key += "|img2img" + num(p.strength);
  if (p.hires_on())
    key += "|hires" + num(p.hires.scale) + ":" + p.hires.upscaler + ":" + std::to_string(p.hires.steps) + ":" +
           num(p.hires.denoise);
  const std::string loras = lora_set_key(p);
  if (!loras.empty()) key += "|loras:" + loras;
  return key;
}

namespace {

// A batch on its way through a lane's pipeline.
struct Batch {
  std::vector<QueuedImage> picked;
  std::vector<GenerationParams> params;
  int n = 0;
  int est_w = 0, est_h = 0;                // the size its memory and time are keyed by (hires: the output size)
  std::optional<std::uint64_t> est_peak;   // estimated work bytes (accounted lanes only)
  bool solo = false;                       // size never measured: runs with nothing else on its lane
  bool lora_switch = false;                // its LoRA set differs from the lane's previous batch
  bool sampled = false;                    // through the sample stage (or failed before it)
  bool alone = true;                       // no other batch of its lane was in sample/decode meanwhile
  double timeout = 0;                      // per image (s), 0: none
  double picked_s = 0;
  double text_s[2] = {0, 0}, sample_s[2] = {0, 0}, decode_s[2] = {0, 0};  // run clock
  std::uint64_t base_allocated = 0;        // lane's allocation when it was taken in
  std::uint64_t sample_peak = 0, decode_peak = 0;  // work bytes above base (measured alone)
  std::uint64_t sample_frag = 0, decode_frag = 0;  // reserved - allocated after the stage
  StageHandle handle;
};
using BatchPtr = std::shared_ptr<Batch>;

struct Lane {
  explicit Lane(DeviceLane d, int i) : dl(std::move(d)), index(i) {}
  DeviceLane dl;
  int index;
  bool alive = true, overlap = true, started = false;
  std::string failure;                 // why it was given up
  std::string current_lora;            // the LoRA set of the last batch taken in
  std::string prefetched_lora;         // the last set whose files were loaded ahead
  std::vector<BatchPtr> in_flight;     // taken in, not finished
  std::vector<BatchPtr> active;        // in the sample or decode stage now
  int unsampled = 0;                   // in_flight not through the sample stage yet
  int failures_in_a_row = 0;
  BoundedQueue<BatchPtr> to_sample{1}, to_decode{1};
  std::thread encode_thread, sample_thread, decode_thread;
  // figures for the report
  int images = 0, batches = 0, failed_batches = 0, oom = 0;
  double text_total = 0, sample_total = 0, decode_total = 0;
  std::vector<std::pair<double, double>> intervals;  // every stage's [start, end]
  std::uint64_t base_allocated = 0;   // allocated when the lane was last idle (weights, LoRA cache)
  std::uint64_t weights_bytes = 0, peak_allocated = 0, peak_reserved = 0;
  std::uint64_t sample_peak = 0, decode_peak = 0, sample_frag = 0, decode_frag = 0;
};

}  // namespace

RunResult run_batch(const BatchFile& batch, const RunOptions& o, const GenerateBatchFn& generate) {
  // The whole generation runs as the sample stage; text and decode only hand it on.
  DeviceLane lane;
  lane.name = "device";
  lane.device = o.device;
  lane.device_name = o.device_name;
  lane.load_seconds = o.load_seconds;
  lane.lora_stats = o.lora_stats;
  lane.stages.encode = [](const std::vector<GenerationParams>& ps) -> StageHandle {
    return std::make_shared<std::vector<GenerationParams>>(ps);
  };
  lane.stages.sample = [&generate](const StageHandle& h, const StepHook& hook) -> StageHandle {
    const auto& ps = *static_cast<const std::vector<GenerationParams>*>(h.get());
    return std::make_shared<std::vector<GeneratedImage>>(generate(ps, hook));
  };
  lane.stages.decode = [](const StageHandle& h) { return std::move(*static_cast<std::vector<GeneratedImage>*>(h.get())); };
  std::vector<DeviceLane> lanes;
  lanes.push_back(std::move(lane));
  return run_batch(batch, o, std::move(lanes));
}

RunResult run_batch(const BatchFile& batch, const RunOptions& o, std::vector<DeviceLane> device_lanes) {
  if (device_lanes.empty()) throw UsageError("run_batch: no device");
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) throw IoError("cannot create output folder '" + o.out_dir.string() + "': " + ec.message());
  const fs::path out_dir = fs::canonical(o.out_dir);
  if (const int n = remove_stale_temp_files(out_dir); n > 0)
    spdlog::info("removed {} temporary file(s) left by an interrupted run", n);
  Manifest manifest(out_dir / "manifest.jsonl");
  if (manifest.torn_lines() > 0)
    spdlog::warn("{}: ignored {} torn line(s) left by an interrupted run", manifest.path().string(), manifest.torn_lines());
  const std::string date = local_date();
  const std::string started = utc_now_iso8601();
  const double start_unix = unix_now();

  RunResult res;
  nlohmann::json images = nlohmann::json::array(), failures = nlohmann::json::array(),
                 batches = nlohmann::json::array(), deadline_misses = nlohmann::json::array(),
                 device_events = nlohmann::json::array();
  for (const auto& [id, error] : o.invalid_tasks) {
    ++res.total;
    ++res.failed;
    failures.push_back({{"task", id}, {"index", 0}, {"seed", 0}, {"error", "invalid task: " + error}});
  }
  WorkList wl = build_work(batch, o, manifest, out_dir, date, start_unix);
  std::vector<WorkItem>& work = wl.work;
  res.total += wl.total;
  res.skipped = wl.skipped_count;
  spdlog::info("{} image(s): {} to generate, {} already done{}", res.total, work.size(), res.skipped,
               o.shard_count > 1 ? " (shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) + ")" : "");
  TaskQueue queue = make_queue(work, o, start_unix);

  std::vector<std::unique_ptr<Lane>> lanes;
  for (auto& d : device_lanes) lanes.push_back(std::make_unique<Lane>(std::move(d), static_cast<int>(lanes.size())));
  const bool many = lanes.size() > 1;

  const auto t_run = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_run).count(); };
  // One lock for the queue, the counters, the report records and every
  // lane's bookkeeping; `cv` wakes lanes waiting for work or for room.
  std::mutex mu;
  std::condition_variable cv;
  std::string fatal;                 // an output error: the run stops
  std::exception_ptr model_error;    // a model that cannot load on the last device: rethrown
  int dropped = 0;                   // generated but not written after an output error
  std::map<std::string, int> oom_cap;  // group -> batch size that is known to fit after an OOM
  std::vector<QueuedImage> waiting;    // retries in backoff
  int images_since_release = 0;

  auto record_failure = [&](const WorkItem& w, const std::string& error) {  // mu held
    spdlog::error("{} failed: {}", image_label(w), error);
    failures.push_back({{"task", w.task->id}, {"index", w.index}, {"seed", w.params.seed}, {"error", error},
                        {"attempts", w.attempts + 1}});
    ++res.failed;
  };
  auto progress = [&](const std::string& file, std::uint64_t mem) {  // mu held
    ProgressInfo pi;
    pi.total = res.total;
    pi.done = res.done;
    pi.skipped = res.skipped;
    pi.failed = res.failed;
    pi.elapsed_s = elapsed();
    const int finished = res.done + res.failed;
    if (finished > 0 && pi.elapsed_s > 0) {
      pi.images_per_minute = 60.0 * finished / pi.elapsed_s;
      const int left = res.total - res.skipped - finished;
      pi.eta_s = pi.elapsed_s / finished * std::max(0, left);
    }
    pi.memory_bytes = mem;
    pi.last_file = file;
    if (o.status_extra) pi.extra = o.status_extra();
    if (many) {  // per device: images made (and a device given up)
      std::string per;
      for (const auto& l : lanes)
        per += (per.empty() ? "" : " ") + l->dl.name + ":" + std::to_string(l->images) + (l->alive ? "" : "(failed)");
      pi.extra = pi.extra.empty() ? per : per + " | " + pi.extra;
    }
    if (o.on_progress) o.on_progress(pi);
  };

  WriterPool writers(o.writer_threads, static_cast<size_t>(std::max(2, 2 * o.writer_threads)), [&](WriteJob& j) {
    {
      std::lock_guard lk(mu);
      if (!fatal.empty()) {  // the run stops on an output error; the image is made again by a rerun
        ++dropped;
        return;
      }
    }
    try {
      const auto t0 = Clock::now();
      const fs::path file = checked_output_path(out_dir, j.item.file);
      const std::vector<std::uint8_t> png = encode_png(j.image.width, j.image.height, 3, j.image.rgb.data(),
                                                       {{"parameters", a1111_parameters(j.item.params, o.model_name, j.image.lora_hashes)}});
      write_file_atomic(file, png);
      const double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
      ManifestEntry e;
      e.task = j.item.task->id;
      e.index = j.item.index;
      e.seed = j.item.params.seed;
      e.file = j.item.file;
      e.sha256 = sha256_hex(png);
      e.seconds = j.generate_s + write_s;
      e.params = j.item.params;
      e.model = o.model_name;
      e.finished = utc_now_iso8601();
      manifest.append(e);
      std::lock_guard lk(mu);
      ++res.done;
      const GenerationParams& p = j.item.params;
      const double end_s = elapsed();
      nlohmann::json rec = {{"task", e.task}, {"index", e.index}, {"seed", e.seed}, {"file", e.file},
                            {"prompt", p.prompt}, {"width", p.width}, {"height", p.height}, {"steps", p.steps},
                            {"cfg", p.cfg}, {"sampler", p.sampler}, {"priority", priority_name(j.item.priority)},
                            {"sha256", e.sha256}, {"start_s", j.start_s}, {"text_s", j.image.seconds.text},
                            {"sample_s", j.image.seconds.sample}, {"decode_s", j.image.seconds.decode},
                            {"write_s", write_s}, {"total_s", end_s - j.start_s}, {"batch_size", j.batch_size},
                            {"memory_bytes", j.memory_bytes}, {"attempts", j.item.attempts + 1},
                            {"device", j.device}};
      if (j.item.deadline_unix >= 0) {
        rec["deadline"] = j.item.task->deadline;
        const bool missed = start_unix + end_s > j.item.deadline_unix;
        rec["deadline_missed"] = missed;
        if (missed) {
          ++res.deadlines_missed;
          deadline_misses.push_back({{"task", e.task}, {"index", e.index}, {"deadline", j.item.task->deadline},
                                     {"late_s", start_unix + end_s - j.item.deadline_unix}});
          spdlog::warn("{} finished {:.0f} s after its deadline {}", image_label(j.item),
                       start_unix + end_s - j.item.deadline_unix, j.item.task->deadline);
        }
      }
      if (!j.image.lora_hashes.empty()) {
        nlohmann::json l = nlohmann::json::array();
        for (const auto& [name, hash] : j.image.lora_hashes) l.push_back({{"name", name}, {"hash", hash}});
        rec["loras"] = l;
        rec["lora_s"] = j.image.lora_s;
      }
      images.push_back(std::move(rec));
      progress(e.file, j.memory_bytes);
    } catch (const IoError& e) {
      std::lock_guard lk(mu);
      if (fatal.empty()) fatal = e.what();
      spdlog::error("{}: {}", image_label(j.item), e.what());
      failures.push_back({{"task", j.item.task->id}, {"index", j.item.index}, {"seed", j.item.params.seed},
                          {"error", std::string(e.what())}});
      ++res.failed;
    } catch (const std::exception& e) {  // e.g. the template leaves the output folder
      std::lock_guard lk(mu);
      spdlog::error("{} failed: {}", image_label(j.item), e.what());
      failures.push_back({{"task", j.item.task->id}, {"index", j.item.index}, {"seed", j.item.params.seed},
                          {"error", std::string(e.what())}});
      ++res.failed;
    }
  });

  auto alive_lanes = [&] {  // mu held
    int n = 0;
    for (const auto& l : lanes) n += l->alive ? 1 : 0;
    return n;
  };
  auto anything_in_flight = [&] {  // mu held
    for (const auto& l : lanes)
      if (!l->in_flight.empty()) return true;
    return false;
  };
  // Why the run stops taking batches ("" = it goes on). mu held.
  auto stop_reason_now = [&]() -> std::string {
    if (!fatal.empty()) return "output error";
    if (model_error) return "the model could not be loaded";
    if (alive_lanes() == 0) return "every device failed";
    if (o.stop && o.stop->load()) return "stopped by a signal";
    if (o.max_runtime_s > 0 && elapsed() >= o.max_runtime_s) return "--max-runtime reached";
    return "";
  };
  auto leave_lane = [&](Lane& l, const BatchPtr& b) {  // mu held: the batch is no longer on the lane
    l.in_flight.erase(std::remove(l.in_flight.begin(), l.in_flight.end(), b), l.in_flight.end());
    l.active.erase(std::remove(l.active.begin(), l.active.end(), b), l.active.end());
    if (!b->sampled) {
      b->sampled = true;
      --l.unsampled;
    }
  };
  // Puts a batch back without counting an attempt (its device was given up,
  // or the run is stopping before it started sampling). mu held.
  auto give_back = [&](Lane& l, const BatchPtr& b) {
    leave_lane(l, b);
    queue.requeue(b->picked);
    cv.notify_all();
  };
  auto fail_lane = [&](Lane& l, const std::string& why) {  // mu held
    if (!l.alive) return;
    l.alive = false;
    l.failure = why;
    ++res.devices_failed;
    device_events.push_back({{"device", l.dl.name}, {"at_s", elapsed()}, {"event", "given up"}, {"reason", why}});
    spdlog::error("device {} given up: {}; its images go back to the queue{}", l.dl.name, why,
                  alive_lanes() > 0 ? " for the other devices" : "");
    cv.notify_all();
  };

  // A batch's stage failed. mu held; returns whether cached blocks should be
  // released (done by the caller after unlocking).
  auto on_failure = [&](Lane& l, const BatchPtr& b, const std::string& error, bool oom, bool retryable,
                        bool device_lost) -> bool {
    leave_lane(l, b);
    ++res.batches;
    ++l.failed_batches;
    nlohmann::json brec = {{"start_s", b->picked_s}, {"size", b->n}, {"group", b->picked.front().group},
                           {"device", l.dl.name}, {"error", error}};
    batches.push_back(brec);
    cv.notify_all();
    // A device that is gone, or that fails batch after batch while another
    // device works, is given up: the batch goes back without an attempt.
    ++l.failures_in_a_row;
    const bool give_up = l.alive && (device_lost || (alive_lanes() > 1 && l.failures_in_a_row >= o.lane_failures));
    if (give_up) {
      fail_lane(l, device_lost ? error
                               : std::to_string(l.failures_in_a_row) + " failed batches in a row, the last: " + error);
      if (alive_lanes() > 0) {
        queue.requeue(b->picked);
        return false;
      }
    }
    if (oom) {
      ++res.oom_recoveries;
      ++l.oom;
      if (l.overlap && o.overlap) spdlog::warn("{}: out of memory with batches overlapping; one batch at a time from now on", l.dl.name);
      l.overlap = false;
      if (b->n > 1) {
        const int smaller = std::max(1, b->n / 2);
        oom_cap[b->picked.front().group] = smaller;
        spdlog::warn("out of device memory with {} image(s) of {}; freed cached blocks, retrying {} at a time", b->n,
                     b->picked.front().group, smaller);
        queue.requeue(b->picked);
        return true;
      }
      spdlog::warn("out of device memory with a single image of {}: {}", b->picked.front().group, error);
    }
    if (b->n > 1) {
      // One image's problem must not fail its batch-mates: each runs alone
      // now (not counted as a retry) and the failure stays with its owner.
      spdlog::warn("a batch of {} failed ({}); running its images one at a time to find which", b->n, error);
      for (auto q : b->picked) {
        q.group += "|alone#" + std::to_string(q.handle);
        queue.requeue({q});
      }
      return oom;
    }
    for (const auto& q : b->picked) {
      WorkItem& w = work[q.handle];
      if (retryable && w.attempts < o.retries) {
        ++w.attempts;
        ++res.retries;
        const double wait = o.retry_backoff_s * std::pow(2.0, w.attempts - 1);
        w.not_before_s = elapsed() + wait;
        spdlog::warn("{} failed (attempt {} of {}): {}; retrying in {:.1f} s", image_label(w), w.attempts,
                     o.retries + 1, error, wait);
        waiting.push_back(q);
      } else {
        record_failure(w, error);
      }
    }
    return oom;
  };

  // Runs one stage of a batch; failures go to on_failure. Returns success.
  auto run_stage = [&](Lane& l, const BatchPtr& b, const char* stage, const std::function<void()>& f) -> bool {
    std::string error;
    bool oom = false, retryable = true, lost = false;
    try {
      f();
      return true;
    } catch (const OutOfMemoryError& e) {
      error = e.what();
      oom = true;
    } catch (const TimeoutError& e) {
      error = e.what();
      retryable = false;
    } catch (const ModelError& e) {
      std::lock_guard lk(mu);
      leave_lane(l, b);
      if (alive_lanes() > 1) {  // another device goes on with the batch
        fail_lane(l, std::string("the model: ") + e.what());
        queue.requeue(b->picked);
      } else {
        queue.requeue(b->picked);
        if (!model_error) model_error = std::current_exception();
        cv.notify_all();
      }
      return false;
    } catch (const UsageError& e) {  // settings this model cannot do: retrying will not help
      error = e.what();
      retryable = false;
    } catch (const Error& e) {
      error = e.what();
      oom = is_out_of_memory_message(error);
      lost = !oom && is_device_lost_message(error);
    } catch (const std::exception& e) {  // anything else from the device libraries: this batch fails, not the run
      error = std::string("unexpected error: ") + e.what();
      oom = is_out_of_memory_message(error);
      lost = !oom && is_device_lost_message(error);
    }
    spdlog::debug("{}: {} stage of a batch of {} failed: {}", l.dl.name, stage, b->n, error);
    bool release = false;
    {
      std::lock_guard lk(mu);
      release = on_failure(l, b, error, oom, retryable, lost);
    }
    if (release && l.dl.device.release_cached && l.alive) l.dl.device.release_cached();
    return false;
  };

  // Loads the files (read, hash, upload) of the LoRA set `set` used by `ps`
  // ahead of its switch, once per set. Only the lane's text thread calls it
  // (so `prefetched_lora` needs no lock), without `mu`. A bad file is said by
  // the text stage later. Returns whether it loaded.
  auto load_ahead = [](Lane& l, const std::string& set, const std::vector<GenerationParams>& ps) -> bool {
    if (!l.dl.stages.prefetch || set == l.prefetched_lora) return false;
    l.prefetched_lora = set;
    try {
      l.dl.stages.prefetch(ps);
    } catch (const std::exception& e) {
      spdlog::debug("{}: loading LoRAs ahead failed ({}); the text stage will say why", l.dl.name, e.what());
    }
    return true;
  };
  // While lane `l` waits for room, the queue head's LoRA set loads, so that
  // its switch does not idle the device later. Returns whether it loaded
  // something (then the caller looks again: the queue may have changed).
  auto prefetch_head = [&](Lane& l, std::unique_lock<std::mutex>& lk, double now) -> bool {
    if (!l.dl.stages.prefetch || queue.empty()) return false;
    const QueuedImage head = queue.ordered(now, l.current_lora).front();
    if (head.lora_set == l.current_lora || head.lora_set == l.prefetched_lora) return false;
    const std::vector<GenerationParams> ps{work[head.handle].params};
    lk.unlock();
    load_ahead(l, head.lora_set, ps);
    lk.lock();
    return true;
  };

  // The next batch for lane `l` (null: nothing more for it). Waits while the
  // lane has no room: memory for the batch on top of what is in flight, at
  // most two batches in flight (one sampling, one decoding), a probe alone.
  auto next_batch = [&](Lane& l, std::unique_lock<std::mutex>& lk) -> BatchPtr {
    while (true) {
      if (!l.alive) return nullptr;
      if (const std::string why = stop_reason_now(); !why.empty()) {
        if (res.stop_reason.empty() && why != "every device failed") res.stop_reason = why;
        return nullptr;
      }
      const double now = elapsed();
      for (auto it = waiting.begin(); it != waiting.end();) {  // retries whose backoff is over
        if (work[it->handle].not_before_s <= now) {
          queue.requeue({*it});
          it = waiting.erase(it);
        } else {
          ++it;
        }
      }
      if (queue.empty()) {
        if (waiting.empty() && !anything_in_flight()) {
          cv.notify_all();
          return nullptr;  // all done
        }
        cv.wait_for(lk, std::chrono::milliseconds(50));
        continue;
      }
      const bool busy = !l.in_flight.empty();
      const bool accounted = o.estimator && l.dl.device.memory;
      MemorySnapshot before;
      if (l.dl.device.memory) before = l.dl.device.memory();
      if (!busy) l.base_allocated = before.allocated;
      if (l.weights_bytes == 0) l.weights_bytes = before.allocated;  // first look: the resident weights
      const bool budget = accounted && before.limit > 0;  // a device with a budget (not the CPU)
      // What the batches in flight may still need (one of them decodes while the new one samples).
      std::uint64_t reserve = 0;
      bool unknown_in_flight = false;
      for (const auto& b : l.in_flight) {
        if (b->est_peak) reserve = std::max<std::uint64_t>(reserve, static_cast<std::uint64_t>(*b->est_peak * o.safety));
        else unknown_in_flight = true;
      }
      if (busy && (!o.overlap || !l.overlap || l.in_flight.size() >= 2 || (budget && unknown_in_flight))) {
        if (!prefetch_head(l, lk, now)) cv.wait_for(lk, std::chrono::milliseconds(200));
        continue;
      }
      const std::uint64_t limit_free = budget ? (before.limit > l.base_allocated ? before.limit - l.base_allocated : 0) : UINT64_MAX;
      const std::uint64_t free_work = limit_free == UINT64_MAX ? UINT64_MAX : (limit_free > reserve ? limit_free - reserve : 0);
      const QueuedImage head = queue.ordered(now, l.current_lora).front();
      const GenerationParams& hp = work[head.handle].params;
      const int hw = hp.hires_on() ? hp.hires_width() : hp.width, hh = hp.hires_on() ? hp.hires_height() : hp.height;
      std::optional<std::uint64_t> head_est;
      if (budget) head_est = o.estimator->peak_bytes(hw, hh, 1);
      if (busy && budget && (!head_est || static_cast<double>(*head_est) * o.safety > static_cast<double>(free_work))) {
        if (!prefetch_head(l, lk, now)) cv.wait_for(lk, std::chrono::milliseconds(200));  // it runs when the lane is empty
        continue;
      }
      // Deadlines that cannot be met any more are said once, early.
      if (o.estimator) {
        if (const auto t = o.estimator->seconds_per_image(hw, hh, 1, hp.steps)) {
          for (const auto& q : queue.newly_hopeless(now, l.current_lora, t->seconds_per_image / std::max(1, alive_lanes())))
            spdlog::warn("{}: its deadline {} can no longer be met (about {:.0f} s of work is ahead of it)",
                         image_label(work[q.handle]), work[q.handle].task->deadline, t->seconds_per_image);
        }
      }
      auto admit = [&](const QueuedImage& h, int available) {
        const GenerationParams& p = work[h.handle].params;
        int n = available;
        if (auto it = oom_cap.find(h.group); it != oom_cap.end()) n = std::min(n, it->second);
        if (budget)
          n = std::min(n, o.estimator->max_batch(p.hires_on() ? p.hires_width() : p.width,
                                                 p.hires_on() ? p.hires_height() : p.height, n, free_work, o.safety));
        return n;
      };
      auto b = std::make_shared<Batch>();
      b->picked = queue.pop_batch(now, l.current_lora, admit);
      for (const auto& q : b->picked) b->params.push_back(work[q.handle].params);
      const GenerationParams& p0 = b->params.front();
      b->n = static_cast<int>(b->picked.size());
      b->est_w = p0.hires_on() ? p0.hires_width() : p0.width;
      b->est_h = p0.hires_on() ? p0.hires_height() : p0.height;
      if (budget) b->est_peak = o.estimator->peak_bytes(b->est_w, b->est_h, b->n);
      b->solo = budget && !b->est_peak;
      b->lora_switch = b->picked.front().lora_set != l.current_lora;
      l.current_lora = b->picked.front().lora_set;
      for (const auto& q : b->picked) {  // timeout: the smallest per-image timeout of the batch
        const double t = work[q.handle].task->timeout_s > 0 ? work[q.handle].task->timeout_s : o.timeout_s;
        if (t > 0) b->timeout = b->timeout == 0 ? t : std::min(b->timeout, t);
      }
      b->picked_s = now;
      b->base_allocated = l.base_allocated;
      l.in_flight.push_back(b);
      ++l.unsampled;
      return b;
    }
  };

  // Stage 1 (and the dispatcher): takes batches for its lane, switches LoRA
  // sets when the lane's sampling is done with the old one, encodes the text.
  auto encode_loop = [&](Lane& l) {
    while (true) {
      if (!l.started) {
        bool has_work;
        {
          std::lock_guard lk(mu);
          has_work = !queue.empty() || !waiting.empty();
        }
        if (!has_work) break;
        l.started = true;
        if (l.dl.start) {
          try {
            l.dl.start();
          } catch (const std::exception& e) {
            std::lock_guard lk(mu);
            if (alive_lanes() > 1) {
              fail_lane(l, std::string("could not start: ") + e.what());
            } else {
              l.alive = false;
              if (!model_error) model_error = std::current_exception();
              cv.notify_all();
            }
            break;
          }
        }
      }
      BatchPtr b;
      {
        std::unique_lock lk(mu);
        b = next_batch(l, lk);
      }
      if (!b) break;
      if (b->lora_switch) {
        // The files load (read, hash, upload) while the earlier batches sample,
        // unless they did while the lane waited; the merge waits for them. A
        // bad file fails in encode below.
        load_ahead(l, b->picked.front().lora_set, b->params);
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return l.unsampled <= 1 || !l.alive; });
        if (!l.alive) {
          give_back(l, b);
          break;
        }
      }
      const double t0 = elapsed();
      if (!run_stage(l, b, "text", [&] { b->handle = l.dl.stages.encode(b->params); })) continue;
      b->text_s[0] = t0;
      b->text_s[1] = elapsed();
      l.to_sample.push(b);
    }
    l.to_sample.close();
  };

  // Stage 2: sampling, with the batch's timeout checked between steps.
  auto sample_loop = [&](Lane& l) {
    while (auto next = l.to_sample.pop()) {
      BatchPtr b = *next;
      {
        std::unique_lock lk(mu);
        // A batch that has not started sampling when the run stops (or its
        // device is given up) goes back to the queue: a rerun makes it.
        if (!l.alive || !stop_reason_now().empty()) {
          give_back(l, b);
          continue;
        }
        if (b->solo) cv.wait(lk, [&] { return l.active.empty() || !l.alive; });
        for (auto& a : l.active) a->alone = b->alone = false;
        l.active.push_back(b);
        if (b->alone && l.dl.device.reset_peak) l.dl.device.reset_peak();
      }
      const auto t0 = Clock::now();
      const double start_s = elapsed();
      const double batch_timeout = b->timeout * b->n;
      StepHook hook = [t0, batch_timeout, timeout = b->timeout](int step, int total) {
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (batch_timeout > 0 && s > batch_timeout)
          throw TimeoutError("timed out after " + std::to_string(static_cast<int>(s)) + " s at step " +
                             std::to_string(step) + "/" + std::to_string(total) + " (limit " +
                             std::to_string(static_cast<int>(timeout)) + " s per image)");
      };
      if (!run_stage(l, b, "sample", [&] { b->handle = l.dl.stages.sample(b->handle, hook); })) continue;
      {
        std::lock_guard lk(mu);
        b->sample_s[0] = start_s;
        b->sample_s[1] = elapsed();
        if (l.dl.device.memory) {
          const MemorySnapshot m = l.dl.device.memory();
          if (b->alone && m.peak_allocated > b->base_allocated) b->sample_peak = m.peak_allocated - b->base_allocated;
          b->sample_frag = m.reserved > m.allocated ? m.reserved - m.allocated : 0;
          l.peak_allocated = std::max(l.peak_allocated, m.peak_allocated);
          l.peak_reserved = std::max(l.peak_reserved, m.peak_reserved);
        }
        b->sampled = true;
        --l.unsampled;
        cv.notify_all();
      }
      l.to_decode.push(b);
    }
    l.to_decode.close();
  };

  // Stage 3: decode; then the images go to the writers.
  auto decode_loop = [&](Lane& l) {
    while (auto next = l.to_decode.pop()) {
      BatchPtr b = *next;
      {
        std::lock_guard lk(mu);
        if (!l.alive) {
          give_back(l, b);
          continue;
        }
        for (auto& a : l.active)
          if (a != b) a->alone = b->alone = false;
        if (b->alone && l.dl.device.reset_peak) l.dl.device.reset_peak();
      }
      const double start_s = elapsed();
      std::vector<GeneratedImage> out;
      if (!run_stage(l, b, "decode", [&] {
            out = l.dl.stages.decode(b->handle);
            if (out.size() != b->params.size())
              throw TaskError("the generator returned " + std::to_string(out.size()) + " image(s) for a batch of " +
                              std::to_string(b->params.size()));
          }))
        continue;
      b->handle.reset();
      std::vector<WriteJob> jobs;
      bool release = false;
      {
        std::lock_guard lk(mu);
        b->decode_s[0] = start_s;
        b->decode_s[1] = elapsed();
        MemorySnapshot m;
        if (l.dl.device.memory) {
          m = l.dl.device.memory();
          if (b->alone && m.peak_allocated > b->base_allocated) b->decode_peak = m.peak_allocated - b->base_allocated;
          b->decode_frag = m.reserved > m.allocated ? m.reserved - m.allocated : 0;
          l.peak_allocated = std::max(l.peak_allocated, m.peak_allocated);
          l.peak_reserved = std::max(l.peak_reserved, m.peak_reserved);
          l.sample_peak = std::max(l.sample_peak, b->sample_peak);
          l.decode_peak = std::max(l.decode_peak, b->decode_peak);
          l.sample_frag = std::max(l.sample_frag, b->sample_frag);
          l.decode_frag = std::max(l.decode_frag, b->decode_frag);
        }
        leave_lane(l, b);
        l.failures_in_a_row = 0;
        ++res.batches;
        ++l.batches;
        l.images += b->n;
        const double text = b->text_s[1] - b->text_s[0], sample = b->sample_s[1] - b->sample_s[0],
                     decode = b->decode_s[1] - b->decode_s[0];
        l.text_total += text;
        l.sample_total += sample;
        l.decode_total += decode;
        l.intervals.emplace_back(b->text_s[0], b->text_s[1]);
        l.intervals.emplace_back(b->sample_s[0], b->sample_s[1]);
        l.intervals.emplace_back(b->decode_s[0], b->decode_s[1]);
        const std::uint64_t work_peak = std::max(b->sample_peak, b->decode_peak);
        nlohmann::json brec = {{"start_s", b->picked_s}, {"seconds", b->decode_s[1] - b->picked_s}, {"size", b->n},
                               {"group", b->picked.front().group}, {"device", l.dl.name},
                               {"text", {b->text_s[0], b->text_s[1]}}, {"sample", {b->sample_s[0], b->sample_s[1]}},
                               {"decode", {b->decode_s[0], b->decode_s[1]}}, {"measured_alone", b->alone},
                               {"reserved_bytes", m.reserved}, {"allocated_bytes", m.allocated}};
        if (b->alone) {
          brec["peak_work_bytes"] = work_peak;
          brec["sample_peak_work_bytes"] = b->sample_peak;
          brec["decode_peak_work_bytes"] = b->decode_peak;
        }
        if (b->est_peak) brec["estimated_work_bytes"] = *b->est_peak;
        batches.push_back(brec);
        if (o.estimator) {
          // Only a device with an allocator budget (CUDA) has a per-batch peak,
          // and only a batch that ran alone on it measures its own.
          if (l.dl.device.memory && m.limit > 0 && b->alone) o.estimator->observe_memory(b->est_w, b->est_h, b->n, work_peak, b->sample_peak);
          o.estimator->observe_time(b->est_w, b->est_h, b->n, b->params.front().steps, text + sample + decode);
        }
        for (size_t k = 0; k < b->picked.size(); ++k) {
          WriteJob j;
          j.item = work[b->picked[k].handle];
          j.image = std::move(out[k]);
          j.start_s = b->picked_s;
          j.generate_s = text + sample + decode;
          j.batch_size = b->n;
          j.memory_bytes = m.allocated;
          j.device = l.dl.name;
          jobs.push_back(std::move(j));
        }
        images_since_release += b->n;
        if (o.release_every > 0 && images_since_release >= o.release_every) {
          release = true;
          images_since_release = 0;
        }
        cv.notify_all();
      }
      for (auto& j : jobs) writers.push(std::move(j));
      if (release && l.dl.device.release_cached) l.dl.device.release_cached();
    }
  };

  // Each lane's threads; an unexpected exception stops the run and comes back here.
  auto guarded = [&](const std::function<void(Lane&)>& body, Lane& lane) {
    return [&mu, &cv, &model_error, body, l = &lane] {
      try {
        body(*l);
      } catch (...) {
        std::lock_guard lk(mu);
        if (!model_error) model_error = std::current_exception();
        l->alive = false;
        cv.notify_all();
      }
    };
  };
  for (auto& l : lanes) {
    l->decode_thread = std::thread(guarded(decode_loop, *l));
    l->sample_thread = std::thread(guarded(sample_loop, *l));
    l->encode_thread = std::thread(guarded(encode_loop, *l));
  }
  for (auto& l : lanes) {
    l->encode_thread.join();
    l->to_sample.close();  // also after an unexpected exception in the encode thread
    l->sample_thread.join();
    l->to_decode.close();
    l->decode_thread.join();
  }
  writers.finish();
  {
    // Not started: what is left in the queue or waiting for a retry.
    res.not_started = static_cast<int>(queue.size() + waiting.size()) + dropped;
    if (res.not_started > 0 && res.stop_reason.empty()) {
      if (!fatal.empty()) res.stop_reason = "output error";
      else if (model_error) res.stop_reason = "the model could not be loaded";
      else if (alive_lanes() == 0) res.stop_reason = "every device failed";
      else res.stop_reason = "output error";
    }
    if (res.not_started > 0)
      spdlog::warn("{}: {} image(s) not started; rerun the same command to finish them", res.stop_reason, res.not_started);
  }
  if (model_error && res.done + res.failed == 0 && lanes.size() == 1) std::rethrow_exception(model_error);

  const double run_s = elapsed();
  // The model loads inside the run (in parallel on several devices); the
  // rate counts the time after it.
  double load_s = 0;
  std::string device_names;
  nlohmann::json devices = nlohmann::json::array();
  std::uint64_t peak_allocated = 0, peak_reserved = 0, max_fragmentation = 0, limit = 0;
  LoraStats lora_total;
  bool any_lora = false;
  for (const auto& l : lanes) {
    const bool used = l->started && l->batches + l->failed_batches > 0;
    const double ls = used && l->dl.load_seconds ? l->dl.load_seconds() : 0.0;
    load_s = std::max(load_s, ls);
    const std::string dn = used && l->dl.device_name ? l->dl.device_name() : "";
    if (!dn.empty()) device_names += (device_names.empty() ? "" : ", ") + dn;
    const auto [busy, overlap] = busy_and_overlap(l->intervals);
    const double span = std::max(run_s - ls, 1e-9);
    MemorySnapshot now;
    if (used && l->dl.device.memory && l->alive) now = l->dl.device.memory();
    limit = std::max(limit, now.limit);
    peak_allocated = std::max(peak_allocated, l->peak_allocated);
    peak_reserved = std::max(peak_reserved, l->peak_reserved);
    max_fragmentation = std::max({max_fragmentation, l->sample_frag, l->decode_frag});
    nlohmann::json d = {{"name", l->dl.name}, {"device", dn}, {"images", l->images}, {"batches", l->batches},
                        {"failed_batches", l->failed_batches}, {"oom", l->oom}, {"failed", !l->failure.empty()},
                        {"load_s", ls}, {"text_s", l->text_total}, {"sample_s", l->sample_total},
                        {"decode_s", l->decode_total}, {"busy_s", busy}, {"overlap_s", overlap},
                        {"busy_fraction", busy / span},
                        {"images_per_hour", l->images * 3600.0 / span},
                        {"memory", {{"weights_bytes", l->weights_bytes}, {"peak_allocated_bytes", l->peak_allocated},
                                    {"peak_reserved_bytes", l->peak_reserved}, {"limit_bytes", now.limit},
                                    {"regions", {{"sample", {{"peak_work_bytes", l->sample_peak},
                                                              {"max_fragmentation_bytes", l->sample_frag}}},
                                                 {"decode", {{"peak_work_bytes", l->decode_peak},
                                                              {"max_fragmentation_bytes", l->decode_frag}}}}}}}};
    if (!l->failure.empty()) d["failure"] = l->failure;
    if (l->dl.engine_counters) {
      const auto counters = l->dl.engine_counters();
      if (!counters.empty()) d["engine"] = counters;
    }
    if (l->dl.lora_stats) {
      const LoraStats s = l->dl.lora_stats();
      if (s.hits + s.misses > 0) {
        any_lora = true;
        d["memory"]["regions"]["lora_cache"] = {{"bytes_held", s.bytes_held}, {"budget_bytes", s.budget_bytes}};
        lora_total.hits += s.hits;
        lora_total.misses += s.misses;
        lora_total.evictions += s.evictions;
        lora_total.bytes_held += s.bytes_held;
        lora_total.budget_bytes += s.budget_bytes;
        lora_total.switches += s.switches;
        lora_total.load_s += s.load_s;
        lora_total.hash_s += s.hash_s;
        lora_total.merge_s += s.merge_s;
      }
    }
    devices.push_back(d);
    if (used)
      spdlog::info("{}: {} image(s) in {} batch(es); busy {:.0f}% of the run, stages overlapping {:.1f} s{}", l->dl.name,
                   l->images, l->batches, 100.0 * busy / span, overlap, l->failure.empty() ? "" : "; given up: " + l->failure);
  }
  const double make_s = std::max(run_s - load_s, 1e-9);
  nlohmann::json report = {{"batch", batch.path.string()},
                           {"model", o.model_name},
                           {"device", device_names},
                           {"started", started},
                           {"shard", {{"index", o.shard_index}, {"count", o.shard_count}}},
                           {"images_total", res.total},
                           {"images_done", res.done},
                           {"images_skipped", res.skipped},
                           {"images_failed", res.failed},
                           {"images_not_started", res.not_started},
                           {"stop_reason", res.stop_reason},
                           {"load_s", load_s},
                           {"run_s", run_s},
                           {"images_per_hour", res.done * 3600.0 / make_s},
                           {"peak_memory_bytes", peak_allocated},
                           {"memory", {{"peak_allocated_bytes", peak_allocated},
                                       {"peak_reserved_bytes", peak_reserved},
                                       {"max_fragmentation_bytes", max_fragmentation},
                                       {"limit_bytes", limit},
                                       {"allocator", o.allocator ? o.allocator() : std::string()},
                                       {"safety_factor", o.safety}}},
                           {"queue", {{"batches", res.batches},
                                      {"max_batch", o.queue.max_batch},
                                      {"aging_s", o.queue.aging_s},
                                      {"oom_recoveries", res.oom_recoveries},
                                      {"retries", res.retries},
                                      {"deadlines_missed", res.deadlines_missed}}},
                           {"pipeline", {{"overlap", o.overlap}}},
                           {"devices", devices},
                           {"device_events", device_events},
                           {"batches", batches},
                           {"deadline_misses", deadline_misses},
                           {"images", images},
                           {"skipped", wl.skipped},
                           {"failures", failures}};
  if (o.status_extra) report["status"] = o.status_extra();
  if (any_lora) {
    const LoraStats& ls = lora_total;
    report["lora"] = {{"hits", ls.hits}, {"misses", ls.misses}, {"evictions", ls.evictions},
                      {"bytes_held", ls.bytes_held}, {"budget_bytes", ls.budget_bytes}, {"switches", ls.switches},
                      {"load_s", ls.load_s}, {"hash_s", ls.hash_s}, {"merge_s", ls.merge_s}};
    spdlog::info("LoRA cache: {} hits, {} misses, {} evictions, {:.1f} MiB held of {:.1f} MiB; {} switches, load {:.2f} s, merge {:.2f} s",
                 ls.hits, ls.misses, ls.evictions, ls.bytes_held / 1048576.0, ls.budget_bytes / 1048576.0, ls.switches,
                 ls.load_s, ls.merge_s);
  }
  res.report_path = out_dir / report_file_name(o.shard_index, o.shard_count);
  write_file_atomic(res.report_path, report.dump(2) + "\n");
  try {
    fs::path html = res.report_path;
    write_report_html(out_dir, report, html.replace_extension(".html").filename().string());
  } catch (const std::exception& e) {  // the page is a convenience; report.json is what counts
    spdlog::warn("could not write the HTML report: {}", e.what());
  }
  spdlog::info("done: {} generated, {} already done, {} failed, {} not started of {}; {} batch(es); {:.1f} s; report {}",
               res.done, res.skipped, res.failed, res.not_started, res.total, res.batches, run_s,
               res.report_path.string());
  if (!fatal.empty()) throw IoError(fatal);
  if (model_error) std::rethrow_exception(model_error);
  return res;
}

BatchPlan plan_batch(const BatchFile& batch, const RunOptions& o, std::uint64_t free_bytes) {
  BatchPlan plan;
  plan.free_bytes = free_bytes;
  std::error_code ec;
  const fs::path out_dir = fs::exists(o.out_dir, ec) ? fs::canonical(o.out_dir) : o.out_dir;
  const Manifest manifest(out_dir / "manifest.jsonl");  // read only: nothing is created
  const double start_unix = unix_now();
  WorkList wl = build_work(batch, o, manifest, out_dir, local_date(), start_unix);
  plan.total = wl.total;
  plan.skipped = wl.skipped_count;
  plan.to_make = static_cast<int>(wl.work.size());
  TaskQueue queue = make_queue(wl.work, o, start_unix);
  double clock = 0, total_s = 0;
  std::string plan_lora;
  bool all_timed = true;
  while (!queue.empty()) {
    auto admit = [&](const QueuedImage& head, int available) {
      const GenerationParams& p = wl.work[head.handle].params;
      if (!o.estimator || free_bytes == UINT64_MAX) return available;  // no budget given: --max-batch decides
      return o.estimator->max_batch(p.hires_on() ? p.hires_width() : p.width, p.hires_on() ? p.hires_height() : p.height,
                                    available, free_bytes, o.safety);
    };
    const auto picked = queue.pop_batch(clock, plan_lora, admit);
    plan_lora = picked.front().lora_set;
    const WorkItem& w0 = wl.work[picked.front().handle];
    PlannedBatch pb;
    pb.group = picked.front().group;
    pb.width = w0.params.width;
    pb.height = w0.params.height;
    pb.steps = w0.params.steps;
    pb.priority = priority_name(w0.priority);
    for (const auto& q : picked) pb.images.push_back(image_label(wl.work[q.handle]));
    const int n = static_cast<int>(picked.size());
    const int est_w = w0.params.hires_on() ? w0.params.hires_width() : pb.width;
    const int est_h = w0.params.hires_on() ? w0.params.hires_height() : pb.height;
    if (o.estimator) {
      if (const auto m = o.estimator->peak_bytes(est_w, est_h, n)) pb.est_peak_bytes = static_cast<std::int64_t>(*m);
      if (const auto t = o.estimator->seconds_per_image(est_w, est_h, n, pb.steps)) {
        pb.est_seconds = t->seconds_per_image * n;
        pb.time_measured = t->measured;
      }
    }
    if (pb.est_seconds < 0) all_timed = false;
    else total_s += pb.est_seconds;
    clock += pb.est_seconds > 0 ? pb.est_seconds : 0;
    plan.batches.push_back(std::move(pb));
  }
  plan.est_seconds = all_timed ? total_s : -1;
  return plan;
}

}  // namespace sdxl
