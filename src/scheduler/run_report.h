// The run report: report.json (report-shard-K-of-N.json with shards) and its
// HTML page beside it, written atomically when the run ends, from the records
// and per-device figures the run collected. The log gets each device's summary
// and the LoRA cache's. torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace sdxl {

struct RunState;

// Seconds during which at least one / at least two of the intervals are open.
std::pair<double, double> busy_and_overlap(std::vector<std::pair<double, double>> intervals);

// Writes the report of a finished run (its lane threads joined) and returns
// its path. run_s: the run's length in seconds.
std::filesystem::path write_run_report(RunState& run, double run_s);

// "report.json", or "report-shard-K-of-N.json" when sharded.
std::string report_file_name(int shard_index, int shard_count);

}  // namespace sdxl
