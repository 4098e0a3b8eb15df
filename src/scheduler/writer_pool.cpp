#include "scheduler/writer_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "core/atomic_file.h"
#include "core/fault_point.h"
#include "core/error.h"
#include "core/sha256.h"
#include "image/png_writer.h"
#include "scheduler/output_folder.h"
#include "scheduler/run_state.h"

namespace sdxl {

namespace {

// The report's record of a written image (mu held); counts a missed deadline.
nlohmann::json image_record(RunState& run, const WriteJob& j, const ManifestEntry& e, double write_s) {
  const GenerationParams& p = j.item.params;
  const double end_s = run.elapsed();
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
    const double late_s = run.start_unix + end_s - j.item.deadline_unix;
    rec["deadline_missed"] = late_s > 0;
    if (late_s > 0) {
      ++run.res.deadlines_missed;
      run.rec.deadline_misses.push_back(
          {{"task", e.task}, {"index", e.index}, {"deadline", j.item.task->deadline}, {"late_s", late_s}});
      spdlog::warn("{} finished {:.0f} s after its deadline {}", image_label(j.item), late_s, j.item.task->deadline);
    }
  }
  if (p.clip_skip != 0) rec["clip_skip"] = p.clip_skip;
  if (!p.detailer.empty()) rec["detailer"] = j.detailer.is_null() ? nlohmann::json::array() : j.detailer;
  if (!j.image.lora_hashes.empty()) {
    nlohmann::json l = nlohmann::json::array();
    for (const auto& [name, hash] : j.image.lora_hashes) l.push_back({{"name", name}, {"hash", hash}});
    rec["loras"] = l;
    rec["lora_s"] = j.image.lora_s;
  }
  for (size_t k = 0; k < p.controlnets.size(); ++k) {
    const ControlNetUse& c = p.controlnets[k];
    nlohmann::json cn = {{"model", c.model}, {"image", c.image}, {"strength", c.strength}, {"start", c.start},
                         {"end", c.end}};
    if (k < j.image.controlnets.size()) {
      cn["name"] = j.image.controlnets[k].first;
      cn["hash"] = j.image.controlnets[k].second;
    }
    rec["controlnets"].push_back(cn);
  }
  if (p.ip_adapter.on()) {
    nlohmann::json ip = {{"model", p.ip_adapter.model}, {"scale", p.ip_adapter.scale},
                         {"name", j.image.ip_adapter_name}, {"hash", j.image.ip_adapter_hash}};
    for (size_t k = 0; k < p.ip_adapter.images.size(); ++k)
      ip["images"].push_back({{"file", p.ip_adapter.images[k]},
                              {"hash", k < j.image.ip_images.size() ? j.image.ip_images[k].second : ""}});
    rec["ip_adapter"] = ip;
  }
  return rec;
}

void record_write_failure(RunState& run, const WriteJob& j, const std::string& error) {  // mu held
  run.rec.failures.push_back({{"task", j.item.task->id}, {"index", j.item.index}, {"seed", j.item.params.seed},
                              {"error", error}});
  ++run.res.failed;
  if (run.opts.on_failure) run.opts.on_failure({j.item.task->id, j.item.index, j.item.params.seed, error});
}

}  // namespace

void write_image(RunState& run, WriteJob& j) {
  {
    std::lock_guard lk(run.mu);
    if (!run.fatal.empty()) {  // the run stops on an output error; the image is made again by a rerun
      ++run.dropped;
      return;
    }
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const std::filesystem::path file = checked_output_path(run.out_dir, j.item.file);
    ImageSources sources = run.opts.model_sources;
    sources.model_name = run.opts.model_name;
    add_image_sources(sources, j.item.params, j.image);
    const std::vector<std::uint8_t> png = encode_png(j.image.width, j.image.height, 3, j.image.rgb.data(),
                                                     {{"parameters", a1111_parameters(j.item.params, sources)}});
    write_file_atomic(file, png);
    fault_point("png-written");
    const double write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ManifestEntry e;
    e.task = j.item.task->id;
    e.index = j.item.index;
    e.seed = j.item.params.seed;
    e.file = j.item.file;
    e.sha256 = sha256_hex(png);
    e.seconds = j.generate_s + write_s;
    e.params = j.item.params;
    e.model = run.opts.model_name;
    e.unet_precision = run.opts.model_sources.unet_precision;
    e.finished = utc_now_iso8601();
    e.source_prompt = j.item.task->source_prompt;
    e.characters = j.item.task->characters;
    e.style = j.item.task->style;
    e.wildcards = j.item.wildcard_choices;
    run.manifest.append(e);
    std::lock_guard lk(run.mu);
    ++run.res.done;
    run.rec.images.push_back(image_record(run, j, e, write_s));
    if (run.opts.on_image) run.opts.on_image({e.task, e.index, e.seed, e.file, file});
    run.progress(e.file, j.memory_bytes);
  } catch (const IoError& e) {
    std::lock_guard lk(run.mu);
    if (run.fatal.empty()) run.fatal = e.what();
    spdlog::error("{}: {}", image_label(j.item), e.what());
    record_write_failure(run, j, e.what());
  } catch (const std::exception& e) {  // e.g. the template leaves the output folder
    std::lock_guard lk(run.mu);
    spdlog::error("{} failed: {}", image_label(j.item), e.what());
    record_write_failure(run, j, e.what());
  }
}

WriterPool::WriterPool(RunState& run, int threads)
    : jobs_(static_cast<size_t>(std::max(2, 2 * threads))) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this, &run] {
      while (auto job = jobs_.pop()) write_image(run, *job);
    });
}

void WriterPool::finish() {
  jobs_.close();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

}  // namespace sdxl
