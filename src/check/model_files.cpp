#include "check/model_files.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "model/detector_config.h"
#include "model/upscaler_config.h"

namespace sdxl {
namespace {

void warn_no_sums(const std::string& dir) {
  spdlog::warn("--verify-model: model.json of '{}' records no sha256 sums (exported before they were); "
               "export it again to verify it", dir);
}

}  // namespace

void verify_model_folder(const ModelConfig& mc) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = verify_model_files(mc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (n == 0) warn_no_sums(mc.dir.string());
  else spdlog::info("--verify-model: {} file(s) match their sha256 ({:.1f} s)", n, s);
}

void verify_task_folders(const std::vector<const GenerationParams*>& params) {
  std::set<std::pair<std::string, std::string>> folders;  // kind, folder
  for (const GenerationParams* p : params) {
    if (!p->vae.empty()) folders.emplace("vae", p->vae);
    for (const ControlNetUse& c : p->controlnets) folders.emplace("controlnet", c.model);
    if (p->ip_adapter.on()) folders.emplace("ip_adapter", p->ip_adapter.model);
    if (p->upscale.uses_model()) folders.emplace("upscaler", p->upscale.model);
    if (p->hires_uses_model()) folders.emplace("upscaler", p->hires.upscaler);
    for (const DetailerUse& d : p->detailer) folders.emplace("detector", d.detector);
  }
  int files = 0;
  for (const auto& [kind, dir] : folders) {
    const std::map<std::string, std::string> sums = kind == "vae"          ? load_vae_config(dir).file_sha256
                                                    : kind == "controlnet" ? load_controlnet_config(dir).file_sha256
                                                    : kind == "upscaler"   ? load_upscaler_config(dir).file_sha256
                                                    : kind == "detector"   ? load_detector_config(dir).file_sha256
                                                                           : load_ip_adapter_config(dir).file_sha256;
    ModelConfig folder;  // verify_model_files reads only the folder and its sums
    folder.dir = dir;
    folder.file_sha256 = sums;
    const int n = verify_model_files(folder);
    if (n == 0) warn_no_sums(dir);
    files += n;
  }
  if (files > 0)
    spdlog::info("--verify-model: {} file(s) of {} folder(s) beside the model match their sha256", files, folders.size());
}

}  // namespace sdxl
