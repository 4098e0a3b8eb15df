// One report for an output folder written by several runs: the shards of a job
// array (report-shard-K-of-N.json each) and reruns. `sdxl-batch report DIR`
// writes it, and so does the last shard of an array to finish. torch-free.
//
// Sources: every report-shard-*.json of the folder and report.json when it is a
// plain run's (not an earlier merge), plus every manifest (the images done are
// what the manifests hold, whichever run made them). The merge is report.json /
// report.html in the folder, with the counts of the whole batch, one row per
// run ("runs": shard, host, images, seconds, images/hour), per-host figures,
// the slowest run, every run's images on one time axis (the earliest start is
// 0) and every failure with the run it happened in.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sdxl {

// The merged report of `out_dir` (nothing written). The folder may be shared
// and is read as hostile input: every file is read as an input (a regular
// file inside the folder, bounded: core/input_file.h). UsageError naming the
// files when the folder has no run report or its reports come from different
// batch files, and naming a manifest or seeds file that is a link or not a
// regular file (as a run refuses it); IoError naming a report that cannot be
// read, is nested deeper than kMaxJsonDepth or is not a JSON object, and when
// no report is left to merge. A report with a key of the wrong type (a JSON
// pointer and why: "merged": {"left_out": [{report, why}]}) is left out with a
// warning; its images still come from the manifests. Runs that started more
// than 31 days from the middle run's start, and times over a year, are left
// off the time axis (their rows' and images' start_s are absent or null).
nlohmann::json merge_run_reports(const std::filesystem::path& out_dir);

// `merged` (merge_run_reports of out_dir), written as out_dir/report.json and
// report.html (atomically); returns the report.json path.
std::filesystem::path write_night_report(const std::filesystem::path& out_dir, const nlohmann::json& merged);

// A shard run of `batch_path` into a folder whose run reports name another batch
// file: UsageError naming both and the report (their tasks would be mixed up).
void check_shard_batch(const std::filesystem::path& out_dir, const std::string& batch_path);

// Whether shard index/count is the array's last to finish: every shard's report
// is in the folder and no other shard's lock is held.
bool array_is_finished(const std::filesystem::path& out_dir, int index, int count);

}  // namespace sdxl
