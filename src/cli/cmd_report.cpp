// `sdxl-batch report DIR`: one report.json / report.html for an output folder that several runs
// wrote (a job array's shards, reruns): sdxl_batch::write_folder_report. A client of the public API alone.
#include <sdxl_batch/sdxl_batch.h>

#include <iostream>

#include "cli/commands.h"

namespace sdxl::cli {

struct ReportArgs {
  std::string out_dir;
};

CLI::App* add_report(CLI::App& app, std::shared_ptr<ReportArgs>& args) {
  args = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand(
      "report", "Merge every run's report and manifest in an output folder (a job array's shards) into one report");
  cmd->add_option("dir", args->out_dir, "The output folder")->required();
  return cmd;
}

// Exit 0 when every image of the batch is done, 3 when some are not.
int run_report(const ReportArgs& a) {
  const sdxl_batch::FolderReport r = sdxl_batch::write_folder_report(a.out_dir);
  std::cout << "report: " << r.images_done << " of " << r.images_total << " images done, " << r.images_failed
            << " failed, from " << r.runs << " run(s) on " << r.hosts << " host(s); " << r.path << "\n";
  return r.exit_code();
}

}  // namespace sdxl::cli
