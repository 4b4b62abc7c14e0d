#include "io/run_folder.hpp"

#include <algorithm>
#include <boost/filesystem.hpp>
#include <charconv>
#include <stdexcept>
#include <utility>

#include "io/checkpoint.hpp"

namespace kiln::io {
namespace fs = boost::filesystem;  // libtorch exports a broken std::filesystem
namespace {

constexpr const char* kPrefix = "version_";

// N of a "version_<N>" name; -1 for any other name.
int64_t version_of(const std::string& name) {
  const std::string prefix = kPrefix;
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return -1;
  int64_t n = -1;
  const auto [end, error] = std::from_chars(first, last, n);
  return error == std::errc() && end == last ? n : -1;
}

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

std::string version_name(int64_t n) { return kPrefix + std::to_string(n); }

int64_t next_version(const std::string& output_dir) {
  const std::vector<std::string> folders = list_run_folders(output_dir);
  return folders.empty() ? 0 : version_of(fs::path(folders.front()).filename().string()) + 1;
}

bool holds_checkpoint(const std::string& run_folder) {
  return !list_checkpoints(join(run_folder, "checkpoints")).empty();
}

// The newest run folder of `output_dir` that holds a checkpoint: a version folder, or the
// output folder itself in the layout from before run folders; "" when none does.
std::string newest_run_with_checkpoint(const std::string& output_dir) {
  for (const std::string& folder : list_run_folders(output_dir)) {
    if (holds_checkpoint(folder)) return folder;
  }
  return holds_checkpoint(output_dir) ? output_dir : "";
}

// The run folder of `output_dir` (a version folder, or the output folder itself in the layout
// from before run folders) that checkpoint folder `checkpoint` lies in; "" when none.
std::string run_folder_of(const std::string& output_dir, const std::string& checkpoint) {
  boost::system::error_code ec;
  const fs::path dir = fs::canonical(checkpoint, ec);
  if (ec || dir.parent_path().filename() != "checkpoints") return "";
  const fs::path run = dir.parent_path().parent_path();
  std::vector<std::string> candidates = list_run_folders(output_dir);
  candidates.push_back(output_dir);
  for (const std::string& candidate : candidates) {
    if (fs::equivalent(candidate, run, ec) && !ec) return candidate;
  }
  return "";
}

}  // namespace

std::vector<std::string> list_run_folders(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  boost::system::error_code ec;
  if (!fs::is_directory(output_dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(output_dir, ec)) {
    const int64_t n = version_of(entry.path().filename().string());
    if (n >= 0 && fs::is_directory(entry.path(), ec)) found.emplace_back(n, entry.path().string());
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> folders;
  for (auto& f : found) folders.push_back(std::move(f.second));
  return folders;
}

std::string create_run_folder(const std::string& output_dir) {
  boost::system::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec)
    throw std::runtime_error(output_dir + ": cannot create the output folder: " + ec.message());
  // create_directory is mkdir: of two runs starting together, one gets the number, the other
  // sees it taken and tries the next.
  for (int64_t n = next_version(output_dir);; ++n) {
    const std::string folder = join(output_dir, version_name(n));
    if (fs::create_directory(folder, ec)) return folder;
    if (ec || !fs::exists(folder)) {
      throw std::runtime_error(folder + ": cannot create the run folder: " +
                               (ec ? ec.message() : std::string("unknown error")));
    }
  }
}

RunFolder choose_run_folder(const std::string& output_dir, const std::string& resume) {
  if (resume == "auto") {
    const std::string folder = newest_run_with_checkpoint(output_dir);
    if (folder == output_dir) {
      return {folder, false,
              "continues the run from before run folders (checkpoints/ directly under the "
              "output folder)"};
    }
    if (!folder.empty()) return {folder, false, "continues the newest run with a checkpoint"};
  } else if (!resume.empty()) {
    const std::string folder = run_folder_of(output_dir, resume);
    if (!folder.empty()) return {folder, false, "continues the run of " + resume};
  }
  const std::string why = resume.empty()     ? "a new run"
                          : resume == "auto" ? "a new run: no checkpoint under " + output_dir
                                             : "a new run: " + resume + " is not in " + output_dir;
  return {join(output_dir, version_name(next_version(output_dir))), true, why};
}

std::string newest_checkpoint_in(const std::string& path) {
  // A checkpoint folder as it is, even a damaged one: reading it says what is wrong.
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  boost::system::error_code ec;
  if (fs::exists(join(path, "state.toml"), ec) ||
      fs::path(trimmed).filename().string().rfind("step-", 0) == 0) {
    return path;
  }
  std::string run = holds_checkpoint(path) ? path : newest_run_with_checkpoint(path);
  if (run.empty()) return "";
  return list_checkpoints(join(run, "checkpoints")).front();
}

}  // namespace kiln::io
