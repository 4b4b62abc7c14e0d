// Run folders: each run writes its checkpoints, TensorBoard events and stop weights into a
// folder of its own under the output folder, <output_dir>/version_<N>, numbered as PyTorch
// Lightning's loggers number theirs. A fresh run takes the next number, so it never writes into
// (or prunes) the checkpoints of an earlier run; a resumed run continues in the folder of the
// checkpoint it resumes from.
#pragma once

#include <string>
#include <vector>

namespace kiln::io {

// The version_<N> folders under `output_dir`, newest (highest N) first; none when it is absent.
// Other names, and numbers that do not fit 64 bits, are not run folders and are skipped.
std::vector<std::string> list_run_folders(const std::string& output_dir);

// Creates <output_dir>/version_<N>, N one above the highest there (0 for the first), and
// returns it. A number another process takes meanwhile is skipped. Throws std::runtime_error
// naming the folder when it cannot be created.
std::string create_run_folder(const std::string& output_dir);

struct RunFolder {
  std::string path;     // where the run writes: checkpoints/, tensorboard/, stop weights
  bool is_new = false;  // a new run folder: `path` names the next free one, not yet created
  std::string why;      // for the log: "a new run", "continues ...", ...
};

// The folder a run with `resume` ("", "auto" or a checkpoint folder) writes into:
// - "": a new run folder;
// - "auto": the newest run folder holding a checkpoint (or, from before run folders, the output
//   folder itself when its checkpoints/ holds one), else a new run folder;
// - a checkpoint folder: the run folder it lies in when that is one of `output_dir`'s (so its
//   checkpoints, TensorBoard events and the new ones stay together), else a new run folder.
// Creates nothing: a new folder is made by create_run_folder once the run is sure to start.
RunFolder choose_run_folder(const std::string& output_dir, const std::string& resume);

// The checkpoint `path` leads to: `path` itself when it is a checkpoint folder (holds
// state.toml or is named step-*), else the newest checkpoint of the run folder `path`, else that of
// the newest run under the output folder `path` that holds one. "" when there is none.
std::string newest_checkpoint_in(const std::string& path);

}  // namespace kiln::io
