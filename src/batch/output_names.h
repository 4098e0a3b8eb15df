// Output paths of a whole batch file, checked before anything runs. torch-free.
//
// Rule: no two images of one batch file may have the same output path. It is
// checked over every task of the file, before a --shard run takes its share, so
// the shards of one folder cannot overwrite each other either. Names are
// compared as a case-insensitive file system (a shared folder on SMB or macOS)
// would compare them: ASCII letters folded. Two kinds of collision are refused,
// each reported at the later task's pointer naming the earlier task:
//  - names that are equal with the seeds known: ids that become the same in a
//    file name ("a b" and "a_b": characters outside [A-Za-z0-9._-] become '_'),
//    a template without {id} and two tasks of one seed, ...;
//  - names that can be equal once a random seed (-1) is drawn at run time:
//    two images of different tasks, one of them with a random seed, whose
//    names differ only in {seed} (digits written next to {seed}, as in
//    "{index}{seed}", count as part of it), e.g. "{seed}.png" with a random
//    task and any other task.
#pragma once

#include <string>
#include <vector>

#include "batch/batch_file.h"

namespace sdxl {

// The collisions of `tasks` written with `tmpl`; `pointers[k]` is the JSON
// pointer of tasks[k] ("/tasks/3"). One problem per colliding task.
std::vector<BatchProblem> output_name_collisions(const std::vector<BatchTask>& tasks,
                                                 const std::vector<std::string>& pointers, const std::string& tmpl);

}  // namespace sdxl
