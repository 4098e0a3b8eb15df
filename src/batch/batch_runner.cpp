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

// Work memory the budget leaves: limit minus what is allocated between
// batches (weights, LoRA cache). Unlimited without accounting.
std::uint64_t free_for_work(const MemorySnapshot& m) {
  if (m.limit == 0) return UINT64_MAX;
  return m.limit > m.allocated ? m.limit - m.allocated : 0;
}

// One finished image on its way to disk.
struct WriteJob {
  WorkItem item;
  GeneratedImage image;
  double start_s = 0, generate_s = 0;
  int batch_size = 1;
  std::uint64_t memory_bytes = 0;
};

// Encodes and writes PNGs on background threads so the device starts the next
// batch at once. The queue is bounded: a producer waits when it is full, so
// finished images never pile up in memory.
class WriterPool {
 public:
  WriterPool(int threads, size_t capacity, std::function<void(WriteJob&)> work)
      : capacity_(std::max<size_t>(1, capacity)), work_(std::move(work)) {
    for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { loop(); });
  }
  ~WriterPool() { finish(); }
  void push(WriteJob job) {
    std::unique_lock lk(mu_);
    space_.wait(lk, [&] { return jobs_.size() < capacity_; });
    jobs_.push_back(std::move(job));
    ready_.notify_one();
  }
  // Waits for every queued job, then stops the threads.
  void finish() {
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      closed_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void loop() {
    while (true) {
      WriteJob job;
      {
        std::unique_lock lk(mu_);
        ready_.wait(lk, [&] { return closed_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        space_.notify_one();
      }
      work_(job);
    }
  }
  size_t capacity_;
  std::function<void(WriteJob&)> work_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::deque<WriteJob> jobs_;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

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

RunResult run_batch(const BatchFile& batch, const RunOptions& o, const GenerateBatchFn& generate) {
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
                 batches = nlohmann::json::array(), deadline_misses = nlohmann::json::array();
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

  const auto t_run = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_run).count(); };
  std::mutex mu;  // guards res counters, images, failures, fatal (writer threads)
  std::string fatal;
  int dropped = 0;  // generated but not written after an output error
  std::uint64_t peak_allocated = 0, peak_reserved = 0, max_fragmentation = 0;

  auto record_failure = [&](const WorkItem& w, const std::string& error) {
    std::lock_guard lk(mu);
    spdlog::error("{} failed: {}", image_label(w), error);
    failures.push_back({{"task", w.task->id}, {"index", w.index}, {"seed", w.params.seed}, {"error", error},
                        {"attempts", w.attempts + 1}});
    ++res.failed;
  };
  auto progress = [&](const std::string& file, std::uint64_t mem) {
    // called with mu held
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
                            {"memory_bytes", j.memory_bytes}, {"attempts", j.item.attempts + 1}};
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

  std::map<std::string, int> oom_cap;  // group -> batch size that is known to fit after an OOM
  std::string current_lora;            // the LoRA set of the last batch (applied on the device now)
  std::vector<QueuedImage> waiting;     // retries in backoff
  int images_since_release = 0;
  while (!queue.empty() || !waiting.empty()) {
    {
      std::lock_guard lk(mu);
      if (!fatal.empty()) {
        res.stop_reason = "output error";
        break;
      }
    }
    if (o.stop && o.stop->load()) res.stop_reason = "stopped by a signal";
    else if (o.max_runtime_s > 0 && elapsed() >= o.max_runtime_s) res.stop_reason = "--max-runtime reached";
    if (!res.stop_reason.empty()) break;
    // Retries whose backoff is over go back to the queue.
    const double now = elapsed();
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (work[it->handle].not_before_s <= now) {
        queue.requeue({*it});
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    if (queue.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    // Deadlines that cannot be met any more are said once, early.
    if (o.estimator) {
      const auto& w0 = work[queue.ordered(now, current_lora).front().handle].params;
      if (const auto t = o.estimator->seconds_per_image(w0.width, w0.height, 1, w0.steps)) {
        for (const auto& q : queue.newly_hopeless(now, current_lora, t->seconds_per_image))
          spdlog::warn("{}: its deadline {} can no longer be met (about {:.0f} s of work is ahead of it)",
                       image_label(work[q.handle]), work[q.handle].task->deadline, t->seconds_per_image);
      }
    }
    MemorySnapshot before;
    if (o.device.memory) before = o.device.memory();
    auto admit = [&](const QueuedImage& head, int available) {
      const GenerationParams& p = work[head.handle].params;
      int n = available;
      if (auto it = oom_cap.find(head.group); it != oom_cap.end()) n = std::min(n, it->second);
      if (o.estimator && o.device.memory && before.limit > 0)  // a device with a budget (not the CPU)
        n = std::min(n, o.estimator->max_batch(p.hires_on() ? p.hires_width() : p.width,
                                               p.hires_on() ? p.hires_height() : p.height, n, free_for_work(before),
                                               o.safety));
      return n;
    };
    std::vector<QueuedImage> picked = queue.pop_batch(now, current_lora, admit);
    current_lora = picked.front().lora_set;
    std::vector<GenerationParams> params;
    for (const auto& q : picked) params.push_back(work[q.handle].params);
    const GenerationParams& p0 = params.front();
    const int n = static_cast<int>(picked.size());
    // A hires task's memory and time are those of its larger second pass: keyed by its output size.
    const int est_w = p0.hires_on() ? p0.hires_width() : p0.width, est_h = p0.hires_on() ? p0.hires_height() : p0.height;
    // Timeout: the smallest per-image timeout of the batch, times its size.
    double timeout = 0;
    for (const auto& q : picked) {
      const double t = work[q.handle].task->timeout_s > 0 ? work[q.handle].task->timeout_s : o.timeout_s;
      if (t > 0) timeout = timeout == 0 ? t : std::min(timeout, t);
    }
    const double batch_timeout = timeout * n;
    const double start_s = elapsed();
    const auto t0 = Clock::now();
    StepHook hook = [&, t0, batch_timeout](int step, int total) {
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (batch_timeout > 0 && s > batch_timeout)
        throw TimeoutError("timed out after " + std::to_string(static_cast<int>(s)) + " s at step " +
                           std::to_string(step) + "/" + std::to_string(total) + " (limit " +
                           std::to_string(static_cast<int>(timeout)) + " s per image)");
    };
    if (o.device.reset_peak) o.device.reset_peak();
    std::string error;
    bool oom = false, retryable = true;
    std::vector<GeneratedImage> out;
    try {
      out = generate(params, hook);
      if (out.size() != params.size()) throw TaskError("the generator returned " + std::to_string(out.size()) +
                                                       " image(s) for a batch of " + std::to_string(params.size()));
    } catch (const OutOfMemoryError& e) {
      error = e.what();
      oom = true;
    } catch (const TimeoutError& e) {
      error = e.what();
      retryable = false;
    } catch (const ModelError&) {
      throw;
    } catch (const UsageError& e) {  // settings this model cannot do: retrying will not help
      error = e.what();
      retryable = false;
    } catch (const Error& e) {
      error = e.what();
      oom = is_out_of_memory_message(error);
    } catch (const std::exception& e) {  // anything else from the device libraries: this batch fails, not the run
      error = std::string("unexpected error: ") + e.what();
      oom = is_out_of_memory_message(error);
    }
    const double gen_s = std::chrono::duration<double>(Clock::now() - t0).count();
    ++res.batches;
    MemorySnapshot after;
    if (o.device.memory) after = o.device.memory();
    const std::uint64_t work_peak = after.peak_allocated > before.allocated ? after.peak_allocated - before.allocated : 0;
    peak_allocated = std::max(peak_allocated, after.peak_allocated);
    peak_reserved = std::max(peak_reserved, after.peak_reserved);
    if (after.reserved > after.allocated) max_fragmentation = std::max(max_fragmentation, after.reserved - after.allocated);
    nlohmann::json brec = {{"start_s", start_s}, {"seconds", gen_s}, {"size", n}, {"group", picked.front().group},
                           {"peak_work_bytes", work_peak}, {"reserved_bytes", after.reserved},
                           {"allocated_bytes", after.allocated}};
    if (o.estimator && o.device.memory) {
      if (const auto est = o.estimator->peak_bytes(est_w, est_h, n)) brec["estimated_work_bytes"] = *est;
    }
    if (!error.empty()) brec["error"] = error;
    batches.push_back(brec);
    if (error.empty()) {
      if (o.estimator) {
        // Only a device with an allocator budget (CUDA) has a per-batch peak; the
        // CPU's peak resident set covers the whole process life.
        if (o.device.memory && after.limit > 0) o.estimator->observe_memory(est_w, est_h, n, work_peak);
        o.estimator->observe_time(est_w, est_h, n, p0.steps, gen_s);
      }
      for (size_t k = 0; k < picked.size(); ++k) {
        WriteJob j;
        j.item = work[picked[k].handle];
        j.image = std::move(out[k]);
        j.start_s = start_s;
        j.generate_s = gen_s;
        j.batch_size = n;
        j.memory_bytes = after.allocated;
        writers.push(std::move(j));
      }
      images_since_release += n;
      if (o.release_every > 0 && images_since_release >= o.release_every && o.device.release_cached) {
        o.device.release_cached();
        images_since_release = 0;
      }
      continue;
    }
    if (oom) {
      ++res.oom_recoveries;
      if (o.device.release_cached) o.device.release_cached();
      if (n > 1) {
        const int smaller = std::max(1, n / 2);
        oom_cap[picked.front().group] = smaller;
        spdlog::warn("out of device memory with {} image(s) of {}; freed cached blocks, retrying {} at a time",
                     n, picked.front().group, smaller);
        queue.requeue(picked);
        continue;
      }
      spdlog::warn("out of device memory with a single image of {}: {}", picked.front().group, error);
    }
    if (n > 1) {
      // One image's problem must not fail its batch-mates: each runs alone
      // now (not counted as a retry) and the failure stays with its owner.
      spdlog::warn("a batch of {} failed ({}); running its images one at a time to find which", n, error);
      for (auto q : picked) {
        q.group += "|alone#" + std::to_string(q.handle);
        queue.requeue({q});
      }
      continue;
    }
    for (const auto& q : picked) {
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
  }
  writers.finish();
  {
    // Not started: what is left in the queue or waiting for a retry.
    res.not_started = static_cast<int>(queue.size() + waiting.size()) + dropped;
    if (res.not_started > 0 && res.stop_reason.empty()) res.stop_reason = "output error";
    if (res.not_started > 0)
      spdlog::warn("{}: {} image(s) not started; rerun the same command to finish them", res.stop_reason, res.not_started);
  }

  const double run_s = elapsed();
  // The model loads lazily inside the run; the rate counts the time after it.
  const double load_s = o.load_seconds && res.done + res.failed > 0 ? o.load_seconds() : 0.0;
  const double make_s = std::max(run_s - load_s, 1e-9);
  nlohmann::json report = {{"batch", batch.path.string()},
                           {"model", o.model_name},
                           {"device", o.device_name && res.done + res.failed > 0 ? o.device_name() : ""},
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
                                       {"limit_bytes", o.device.memory ? o.device.memory().limit : 0},
                                       {"safety_factor", o.safety}}},
                           {"queue", {{"batches", res.batches},
                                      {"max_batch", o.queue.max_batch},
                                      {"aging_s", o.queue.aging_s},
                                      {"oom_recoveries", res.oom_recoveries},
                                      {"retries", res.retries},
                                      {"deadlines_missed", res.deadlines_missed}}},
                           {"batches", batches},
                           {"deadline_misses", deadline_misses},
                           {"images", images},
                           {"skipped", wl.skipped},
                           {"failures", failures}};
  if (o.status_extra) report["status"] = o.status_extra();
  if (o.lora_stats) {
    const LoraStats ls = o.lora_stats();
    if (ls.hits + ls.misses > 0) {
      report["lora"] = {{"hits", ls.hits}, {"misses", ls.misses}, {"evictions", ls.evictions},
                        {"bytes_held", ls.bytes_held}, {"budget_bytes", ls.budget_bytes}, {"switches", ls.switches},
                        {"load_s", ls.load_s}, {"hash_s", ls.hash_s}, {"merge_s", ls.merge_s}};
      spdlog::info("LoRA cache: {} hits, {} misses, {} evictions, {:.1f} MiB held of {:.1f} MiB; {} switches, load {:.2f} s, merge {:.2f} s",
                   ls.hits, ls.misses, ls.evictions, ls.bytes_held / 1048576.0, ls.budget_bytes / 1048576.0, ls.switches,
                   ls.load_s, ls.merge_s);
    }
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
