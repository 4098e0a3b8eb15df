// sdxl-batch: parse the command line, call the public API, map its errors to exit codes.
#include <sdxl_batch/sdxl_batch.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/cli_common.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  using sdxl_batch::ExitCode;
  CLI::App app{"sdxl-batch: turn a JSON batch of scenes into SDXL images on NVIDIA GPUs (or the CPU)", "sdxl-batch"};
  app.set_version_flag("--version", sdxl_batch::program_name() + " " + sdxl_batch::version());
  app.require_subcommand(1);
  std::string log_level, log_file;
  sdxl::cli::add_log_options(app, log_level, log_file);

  std::shared_ptr<sdxl::cli::GenerateArgs> gen;
  std::shared_ptr<sdxl::cli::RunArgs> run;
  std::shared_ptr<sdxl::cli::TokensArgs> tokens;
  std::shared_ptr<sdxl::cli::ValidateArgs> validate;
  std::shared_ptr<sdxl::cli::UpscaleArgs> upscale;
  std::shared_ptr<sdxl::cli::DetectArgs> detect;
  std::shared_ptr<sdxl::cli::ReportArgs> report;
  std::shared_ptr<sdxl::cli::KeysArgs> keys;
  std::shared_ptr<sdxl::cli::VideoArgs> video;
  CLI::App* gen_cmd = sdxl::cli::add_generate(app, gen);
  CLI::App* run_cmd = sdxl::cli::add_run(app, run);
  CLI::App* tok_cmd = sdxl::cli::add_tokens(app, tokens);
  CLI::App* val_cmd = sdxl::cli::add_validate(app, validate);
  CLI::App* up_cmd = sdxl::cli::add_upscale(app, upscale);
  CLI::App* det_cmd = sdxl::cli::add_detect(app, detect);
  CLI::App* rep_cmd = sdxl::cli::add_report(app, report);
  CLI::App* keys_cmd = sdxl::cli::add_keys(app, keys);
  CLI::App* video_cmd = sdxl::cli::add_video(app, video);

  // CLI11 reports an unknown first word only as "A subcommand is required".
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] != '-' && first != "generate" && first != "run" && first != "tokens" &&
      first != "validate" && first != "upscale" && first != "detect" && first != "report" && first != "keys" &&
      first != "video") {
    std::cerr << "unknown command '" << argv[1]
              << "'; commands: generate, run, validate, tokens, upscale, detect, report, keys, video (see --help)\n";
    return static_cast<int>(ExitCode::kUsage);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message naming the flag or value
    return static_cast<int>(ExitCode::kUsage);
  }

  try {
    sdxl::cli::setup_logging(log_level, log_file);
  } catch (const std::exception& e) {
    std::cerr << "--log-file " << log_file << ": " << e.what() << "\n";
    return static_cast<int>(ExitCode::kUsage);
  }
  try {
    if (*gen_cmd) return sdxl::cli::run_generate(*gen);
    if (*run_cmd) return sdxl::cli::run_run(*run);
    if (*tok_cmd) return sdxl::cli::run_tokens(*tokens);
    if (*val_cmd) return sdxl::cli::run_validate(*validate);
    if (*up_cmd) return sdxl::cli::run_upscale(*upscale);
    if (*det_cmd) return sdxl::cli::run_detect(*detect);
    if (*rep_cmd) return sdxl::cli::run_report(*report);
    if (*keys_cmd) return sdxl::cli::run_keys(*keys);
    if (*video_cmd) return sdxl::cli::run_video(*video);
  } catch (const sdxl_batch::Error& e) {  // every library error, with its exit code
    spdlog::error("{}", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return static_cast<int>(ExitCode::kFatal);
  }
  return static_cast<int>(ExitCode::kUsage);
}
