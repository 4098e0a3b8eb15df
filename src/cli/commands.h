// The subcommands. Each add_* registers its flags on the app and returns the
// subcommand; each run_* does the work and returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

namespace sdxl::cli {

struct GenerateArgs;
struct RunArgs;
struct TokensArgs;
struct ValidateArgs;
struct UpscaleArgs;
struct DetectArgs;
struct ReportArgs;
struct KeysArgs;
struct VideoArgs;

CLI::App* add_generate(CLI::App& app, std::shared_ptr<GenerateArgs>& args);
int run_generate(const GenerateArgs& args);

CLI::App* add_run(CLI::App& app, std::shared_ptr<RunArgs>& args);
int run_run(const RunArgs& args);

CLI::App* add_tokens(CLI::App& app, std::shared_ptr<TokensArgs>& args);
int run_tokens(const TokensArgs& args);

CLI::App* add_validate(CLI::App& app, std::shared_ptr<ValidateArgs>& args);
int run_validate(const ValidateArgs& args);

CLI::App* add_upscale(CLI::App& app, std::shared_ptr<UpscaleArgs>& args);
int run_upscale(const UpscaleArgs& args);

CLI::App* add_detect(CLI::App& app, std::shared_ptr<DetectArgs>& args);
int run_detect(const DetectArgs& args);

CLI::App* add_report(CLI::App& app, std::shared_ptr<ReportArgs>& args);
int run_report(const ReportArgs& args);

CLI::App* add_keys(CLI::App& app, std::shared_ptr<KeysArgs>& args);
int run_keys(const KeysArgs& args);

CLI::App* add_video(CLI::App& app, std::shared_ptr<VideoArgs>& args);
int run_video(const VideoArgs& args);

}  // namespace sdxl::cli
