#include "io/checkpoint.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <boost/filesystem.hpp>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>

#include "io/crc.hpp"
#include "io/safetensors.hpp"

namespace kiln::io {
namespace fs = boost::filesystem;  // libtorch exports a broken std::filesystem
namespace {

const char* const kFiles[] = {"model.safetensors", "trainer.safetensors"};

// Size and CRC-32 of a file's bytes.
std::pair<int64_t, uint32_t> size_and_crc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": missing");
  Crc32 crc;
  int64_t size = 0;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    crc.process_bytes(buffer, static_cast<size_t>(in.gcount()));
    size += in.gcount();
  }
  return {size, crc.checksum()};
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes `text` to `path` and fsyncs it; throws naming the path.
void write_text_durably(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw CheckpointError(path + ": cannot write (disk full or not writable?)");
  }
  fsync_path(path, false);
}

// The step a checkpoint folder's name holds; -1 when the name is not "step-<digits>" or the
// number does not fit (a stray "step-99999999999999999999" is no checkpoint, not an error).
int64_t step_of(const fs::path& dir) {
  const std::string name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() <= 5) return -1;
  const char* first = name.data() + 5;
  const char* last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return -1;
  int64_t step = -1;
  const auto [end, error] = std::from_chars(first, last, step);
  return error == std::errc() && end == last ? step : -1;
}

// A partial checkpoint a write left behind: ".tmp-step-<N>-<pid>"; or the best's record or link
// before its rename: ".tmp-best-<pid>", ".tmp-best.toml-<pid>".
bool is_partial(const fs::path& entry) {
  const std::string name = entry.filename().string();
  return name.rfind(".tmp-step-", 0) == 0 || name.rfind(".tmp-best", 0) == 0;
}

constexpr const char* kBestLink = "best";
constexpr const char* kBestRecord = "best.toml";

}  // namespace

CheckpointRootScan clean_checkpoint_root(const std::string& root) {
  CheckpointRootScan scan;
  boost::system::error_code ec;
  if (!fs::is_directory(root, ec)) return scan;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (is_partial(entry.path())) {
      boost::system::error_code removed;
      fs::remove_all(entry.path(), removed);
      if (!removed) scan.removed_partial.push_back(entry.path().string());
    } else if (const std::string name = entry.path().filename().string();
               name == kBestLink || name == kBestRecord) {
      continue;
    } else if (step_of(entry.path()) < 0 || !fs::is_directory(entry.path(), ec)) {
      scan.ignored.push_back(entry.path().string());
    }
  }
  std::sort(scan.removed_partial.begin(), scan.removed_partial.end());
  std::sort(scan.ignored.begin(), scan.ignored.end());
  return scan;
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  boost::system::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(entry.path());
    if (step >= 0 && fs::is_directory(entry.path(), ec))
      found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> dirs;
  for (auto& f : found) dirs.push_back(std::move(f.second));
  return dirs;
}

std::string write_checkpoint(const std::string& root, const CheckpointData& data, int64_t keep,
                             int64_t protect) {
  const std::string final_dir = root + "/" + checkpoint_name(data.info.step);
  const std::string tmp_dir =
      root + "/.tmp-" + checkpoint_name(data.info.step) + "-" + std::to_string(::getpid());
  try {
    fs::create_directories(root);
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    write_safetensors(tmp_dir + "/model.safetensors", data.model,
                      {{"format", "pt"}, {"step", std::to_string(data.info.step)}});
    write_safetensors(tmp_dir + "/trainer.safetensors", data.trainer);

    const CheckpointInfo& i = data.info;
    toml::table state{{"format", kCheckpointFormat},
                      {"step", i.step},
                      {"epoch", i.epoch},
                      {"batches_in_epoch", i.batches_in_epoch},
                      {"lr_counted", i.lr_counted},
                      {"loss_scale", i.loss_scale},
                      {"skipped_total", i.skipped_total},
                      {"skipped_in_a_row", i.skipped_in_a_row},
                      {"config_hash", i.config_hash}};
    toml::array rule;
    for (double v : i.scale_rule) rule.push_back(v);
    state.insert("scale_rule", rule);
    if (!i.lr_state.empty()) {
      toml::array lr;
      for (double v : i.lr_state) lr.push_back(v);
      state.insert("lr_state", lr);
    }
    toml::table plugins;
    for (const auto& [slot, what] : i.plugins) plugins.insert(slot, what);
    state.insert("plugins", plugins);
    toml::table config;
    for (const auto& [key, value] : i.config) config.insert(key, value);
    state.insert("config", config);
    toml::table files;
    for (const char* file : kFiles) {
      const auto [size, crc] = size_and_crc(tmp_dir + "/" + file);
      files.insert(file, toml::table{{"size", size}, {"crc32", static_cast<int64_t>(crc)}});
    }
    state.insert("files", files);
    std::ostringstream text;
    text << state << "\n";
    write_text_durably(tmp_dir + "/state.toml", text.str());
    fsync_path(tmp_dir, true);

    // A checkpoint of the same step (a rerun) is replaced only once the new one is complete.
    if (fs::exists(final_dir)) fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_path(root, true);
  } catch (const fs::filesystem_error& e) {
    boost::system::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw CheckpointError(final_dir + ": cannot write checkpoint: " + e.what());
  } catch (const std::runtime_error& e) {
    boost::system::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw CheckpointError(final_dir + ": cannot write checkpoint: " + e.what());
  }

  prune_checkpoints(root, data.info.step, keep, protect);
  return final_dir;
}

std::string checkpoint_name(int64_t step) { return fmt::format("step-{:09d}", step); }

void prune_checkpoints(const std::string& root, int64_t newest, int64_t keep, int64_t protect) {
  int64_t kept = 0;
  for (const std::string& dir : list_checkpoints(root)) {
    const int64_t step = step_of(dir);
    if (step > newest || step == protect) continue;
    if (++kept > keep) {
      boost::system::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  }
}

void write_best(const std::string& root, const BestCheckpoint& best) {
  const std::string pid = std::to_string(::getpid());
  const std::string record = root + "/" + kBestRecord, link = root + "/" + kBestLink;
  const std::string record_tmp = root + "/.tmp-best.toml-" + pid,
                    link_tmp = root + "/.tmp-best-" + pid;
  try {
    toml::array since;
    for (int64_t step : best.since) since.push_back(step);
    std::ostringstream text;
    text << toml::table{{"step", best.step},
                        {"metric", best.metric},
                        {"value", best.value},
                        {"since", since}}
         << "\n";
    write_text_durably(record_tmp, text.str());
    fs::rename(record_tmp, record);
    fs::remove(link_tmp);
    fs::create_directory_symlink(checkpoint_name(best.step),
                                 link_tmp);  // relative: the run may move
    fs::rename(link_tmp, link);
    fsync_path(root, true);
  } catch (const std::runtime_error& e) {  // fs::filesystem_error, or the record's write
    boost::system::error_code ignored;
    fs::remove(record_tmp, ignored);
    fs::remove(link_tmp, ignored);
    throw CheckpointError(record + ": cannot write the best checkpoint's record: " + e.what());
  }
}

std::optional<BestCheckpoint> read_best(const std::string& root) {
  const std::string path = root + "/" + kBestRecord;
  boost::system::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  try {
    const toml::table t = toml::parse_file(path);
    BestCheckpoint best;
    best.step = t["step"].value_or(int64_t{-1});
    best.metric = t["metric"].value_or(std::string());
    best.value = t["value"].value_or(0.0);
    if (const toml::array* since = t["since"].as_array()) {
      for (const toml::node& step : *since) best.since.push_back(step.value_or(int64_t{-1}));
    }
    if (best.step < 0 || best.metric.empty()) return std::nullopt;
    return best;
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
}

CheckpointData read_checkpoint(const std::string& dir) {
  auto fail = [&](const std::string& why) { return CheckpointError(dir + ": " + why); };
  CheckpointData data;
  const CheckpointState state = read_checkpoint_state(dir + "/state.toml");
  data.info = state.info;
  for (const char* file : kFiles) {
    const auto want = state.files.find(file);
    if (want == state.files.end()) throw fail(std::string("state.toml does not describe ") + file);
    std::pair<int64_t, uint32_t> got;
    try {
      got = size_and_crc(dir + "/" + file);
    } catch (const CheckpointError&) {
      throw fail(std::string(file) + " is missing");
    }
    if (got.first != want->second.size) {
      throw fail(fmt::format("{} is {} bytes, {} were written (truncated?)", file, got.first,
                             want->second.size));
    }
    if (got.second != want->second.crc32) {
      throw fail(fmt::format("{} fails its CRC-32 check (corrupted)", file));
    }
  }
  try {
    data.model = read_safetensors(dir + "/model.safetensors").tensors;
    data.trainer = read_safetensors(dir + "/trainer.safetensors").tensors;
  } catch (const std::runtime_error& e) {
    throw CheckpointError(e.what());  // names the file, under `dir`
  }
  return data;
}

}  // namespace kiln::io
