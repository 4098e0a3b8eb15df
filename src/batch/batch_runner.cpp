#include "sdxl/batch_runner.h"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <cerrno>

#include <chrono>
#include <cmath>
#include <ctime>
#include <nlohmann/json.hpp>

#include "sdxl/atomic_file.h"
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
         a.schedule == b.schedule && a.loras == b.loras;
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

std::string format_eta(double s) {
  if (!(s >= 0) || std::isinf(s)) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

}  // namespace

std::string report_file_name(int shard_index, int shard_count) {
  if (shard_count <= 1) return "report.json";
  return "report-shard-" + std::to_string(shard_index) + "-of-" + std::to_string(shard_count) + ".json";
}

RunResult run_batch(const BatchFile& batch, const RunOptions& o, const GenerateFn& generate) {
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

  RunResult res;
  nlohmann::json images = nlohmann::json::array(), failures = nlohmann::json::array(),
                 skipped = nlohmann::json::array();
  for (const auto& [id, error] : o.invalid_tasks) {
    ++res.total;
    ++res.failed;
    failures.push_back({{"task", id}, {"index", 0}, {"seed", 0}, {"error", "invalid task: " + error}});
  }
  std::vector<WorkItem> work;
  for (size_t pos = 0; pos < batch.tasks.size(); ++pos) {
    if (!in_shard(pos, o.shard_index, o.shard_count)) continue;
    const BatchTask& task = batch.tasks[pos];
    std::int64_t base = task.params.seed;
    if (task.seed_random) {
      const auto recorded = o.force ? std::nullopt : manifest.task_base_seed(task.id);
      base = recorded ? *recorded : random_seed();
    }
    for (int i = 0; i < task.count; ++i) {
      WorkItem w{&task, i, task.params, ""};
      w.params.seed = base + i;
      w.file = output_file_name(task, i, w.params.seed, batch.name_template, date);
      ++res.total;
      if (!o.force) {
        const auto e = manifest.find(task.id, i);
        if (e && same_settings(e->params, w.params)) {
          const auto sha = sha256_file_hex(out_dir / e->file);
          if (sha && *sha == e->sha256) {
            ++res.skipped;
            skipped.push_back({{"task", task.id}, {"index", i}, {"seed", e->seed}, {"file", e->file}});
            continue;
          }
          spdlog::info("{} #{}: {} is missing or changed since it was recorded; generating it again", task.id, i, e->file);
        }
      }
      work.push_back(std::move(w));
    }
  }
  spdlog::info("{} image(s): {} to generate, {} already done{}", res.total, work.size(), res.skipped,
               o.shard_count > 1 ? " (shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count) + ")" : "");

  const auto t_run = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_run).count(); };
  std::string fatal;
  for (size_t k = 0; k < work.size(); ++k) {
    if (o.stop && o.stop->load()) {
      res.stop_reason = "stopped by a signal";
    } else if (o.max_runtime_s > 0 && elapsed() >= o.max_runtime_s) {
      res.stop_reason = "--max-runtime reached";
    }
    if (!res.stop_reason.empty()) {
      res.not_started = static_cast<int>(work.size() - k);
      spdlog::warn("{}: {} image(s) not started; rerun the same command to finish them", res.stop_reason, res.not_started);
      break;
    }
    const WorkItem& w = work[k];
    const double start_s = elapsed();
    try {
      const auto t0 = Clock::now();
      GeneratedImage img = generate(w.params);
      const auto t1 = Clock::now();
      const fs::path file = checked_output_path(out_dir, w.file);
      const std::vector<std::uint8_t> png =
          encode_png(img.width, img.height, 3, img.rgb.data(), {{"parameters", a1111_parameters(w.params, o.model_name, img.lora_hashes)}});
      write_file_atomic(file, png);
      const double write_s = std::chrono::duration<double>(Clock::now() - t1).count();
      const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
      ManifestEntry e;
      e.task = w.task->id;
      e.index = w.index;
      e.seed = w.params.seed;
      e.file = w.file;
      e.sha256 = sha256_hex(png);
      e.seconds = total_s;
      e.params = w.params;
      e.model = o.model_name;
      e.finished = utc_now_iso8601();
      manifest.append(e);
      ++res.done;
      const std::uint64_t mem = o.memory_bytes ? o.memory_bytes() : 0;
      images.push_back({{"task", e.task}, {"index", e.index}, {"seed", e.seed}, {"file", e.file},
                        {"prompt", w.params.prompt}, {"width", w.params.width}, {"height", w.params.height},
                        {"steps", w.params.steps}, {"cfg", w.params.cfg}, {"sha256", e.sha256}, {"start_s", start_s},
                        {"text_s", img.seconds.text}, {"sample_s", img.seconds.sample}, {"decode_s", img.seconds.decode},
                        {"write_s", write_s}, {"total_s", total_s}, {"memory_bytes", mem}});
      if (!img.lora_hashes.empty()) {
        nlohmann::json l = nlohmann::json::array();
        for (const auto& [name, hash] : img.lora_hashes) l.push_back({{"name", name}, {"hash", hash}});
        images.back()["loras"] = l;
        images.back()["lora_s"] = img.lora_s;
      }
      const double run_s = elapsed();
      const int finished = res.done + res.failed;
      const double per_image = run_s / std::max(1, finished);
      spdlog::info("[{}/{}] {} ({:.2f} s) | {:.1f} img/min | ETA {} | mem {:.2f} GiB", res.skipped + finished,
                   res.total, w.file, total_s, 60.0 / per_image,
                   format_eta(per_image * static_cast<double>(work.size() - k - 1)),
                   static_cast<double>(mem) / (1024.0 * 1024.0 * 1024.0));
    } catch (const IoError& e) {
      fatal = e.what();
      spdlog::error("{} #{}: {}", w.task->id, w.index, fatal);
      failures.push_back({{"task", w.task->id}, {"index", w.index}, {"seed", w.params.seed}, {"error", fatal}});
      ++res.failed;
      res.not_started = static_cast<int>(work.size() - k - 1);
      res.stop_reason = "output error";
      break;
    } catch (const Error& e) {  // TaskError, UsageError, ModelError from one image: the batch goes on
      if (e.code() == ExitCode::kFatal && dynamic_cast<const ModelError*>(&e)) throw;
      spdlog::error("{} #{} failed: {}", w.task->id, w.index, e.what());
      failures.push_back({{"task", w.task->id}, {"index", w.index}, {"seed", w.params.seed}, {"error", e.what()}});
      ++res.failed;
    }
  }

  const double run_s = elapsed();
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
                           {"load_s", o.load_seconds && res.done + res.failed > 0 ? o.load_seconds() : 0.0},
                           {"run_s", run_s},
                           {"images_per_hour", run_s > 0 ? res.done * 3600.0 / run_s : 0.0},
                           {"peak_memory_bytes", o.peak_memory_bytes && res.done > 0 ? o.peak_memory_bytes() : 0},
                           {"images", images},
                           {"skipped", skipped},
                           {"failures", failures}};
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
  spdlog::info("done: {} generated, {} already done, {} failed, {} not started of {}; {:.1f} s; report {}", res.done,
               res.skipped, res.failed, res.not_started, res.total, run_s, res.report_path.string());
  if (!fatal.empty()) throw IoError(fatal);
  return res;
}

}  // namespace sdxl
