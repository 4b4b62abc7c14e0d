#include "engine/init_weights.hpp"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <regex>
#include <set>
#include <stdexcept>

#include "io/safetensors.hpp"

namespace kiln::engine {
namespace {

// At most `limit` names, then how many more: a long list stays one readable line.
std::string abbreviate(const std::vector<std::string>& names, std::size_t limit = 8) {
  if (names.size() <= limit) return fmt::format("{}", fmt::join(names, ", "));
  const std::vector<std::string> head(names.begin(), names.begin() + static_cast<long>(limit));
  return fmt::format("{}, ... ({} more)", fmt::join(head, ", "), names.size() - limit);
}

// torch's BatchNorm counter of training batches; Kiln's norm layers keep no such buffer.
bool is_batch_counter(const std::string& name) {
  static const std::string kLeaf = "num_batches_tracked";
  return name == kLeaf ||
         (name.size() > kLeaf.size() &&
          name.compare(name.size() - kLeaf.size() - 1, std::string::npos, "." + kLeaf) == 0);
}

// The patterns for `names` as a TOML array, one per module, at most four.
std::string skip_advice(const std::vector<std::string>& names) {
  std::vector<std::string> patterns;
  std::set<std::string> seen;
  for (const std::string& name : names) {
    std::string p = "\"" + skip_pattern_for(name) + "\"";
    if (seen.insert(p).second) patterns.push_back(p);
  }
  return fmt::format("model.init_skip = [{}]", abbreviate(patterns, 4));
}

// The file's side of the summary: its tensors the model lacks, by pattern, counter or neither;
// and the skipped model tensors the file has, which count as skipped there too.
template <typename Skipped>
void sort_file_tensors(const io::SafetensorsFile& file, const std::set<std::string>& model_names,
                       const Skipped& skipped, InitSummary& summary) {
  for (const auto& [name, t] : file.tensors) {
    if (model_names.count(name) != 0) continue;
    if (skipped(name)) {
      summary.file_skips.push_back(name);
    } else if (is_batch_counter(name)) {
      ++summary.batch_counters;
    } else {
      summary.unused.push_back(name);
    }
  }
  for (const std::string& name : summary.kept) {
    if (file.find(name) != nullptr) summary.file_skips.push_back(name);
  }
}

// One line for the log (a warning first when the file holds tensors the model lacks).
void log_summary(const std::string& path, const InitSummary& summary) {
  if (!summary.unused.empty()) {
    spdlog::warn("{}: {} tensors the model does not have were ignored: {}", path,
                 summary.unused.size(), abbreviate(summary.unused));
  }
  std::string line =
      fmt::format("initial weights from {}: {} tensors loaded", path, summary.loaded.size());
  if (!summary.kept.empty()) {
    line += fmt::format("; {} left at the model's initialisation by model.init_skip ({})",
                        summary.kept.size(), abbreviate(summary.kept));
  }
  if (!summary.file_skips.empty()) {
    line += fmt::format("; {} in the file skipped", summary.file_skips.size());
  }
  if (!summary.unused.empty()) {
    line += fmt::format("; {} in the file not in the model", summary.unused.size());
  }
  if (summary.batch_counters > 0) {
    line += fmt::format("; {} num_batches_tracked counters ignored (Kiln keeps none)",
                        summary.batch_counters);
  }
  spdlog::info("{}", line);
}

}  // namespace

std::string skip_pattern_for(const std::string& tensor) {
  const std::size_t dot = tensor.rfind('.');
  const std::string module = dot == std::string::npos ? tensor : tensor.substr(0, dot);
  std::string pattern = "^";
  for (char c : module) {
    // Escape what ECMAScript treats as special, doubled for the TOML string.
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) pattern += "\\\\";
    pattern += c;
  }
  return pattern + (dot == std::string::npos ? "$" : "\\\\.");
}

InitSummary load_weights(torch::nn::Module& model, const std::string& path,
                         const std::vector<std::string>& skip) {
  at::NoGradGuard no_grad;
  std::vector<std::regex> patterns;
  for (const std::string& p : skip) patterns.emplace_back(p);
  auto skipped = [&](const std::string& name) {
    for (const auto& re : patterns) {
      if (std::regex_search(name, re)) return true;
    }
    return false;
  };
  const io::SafetensorsFile file = io::read_safetensors(path);
  InitSummary summary;
  std::set<std::string> model_names;
  std::vector<std::string> missing, mismatched;
  std::string first_mismatch;
  std::vector<std::pair<at::Tensor, const at::Tensor*>> copies;
  auto plan = [&](const std::string& name, const at::Tensor& target) {
    model_names.insert(name);
    if (skipped(name)) {
      summary.kept.push_back(name);
      return;
    }
    const at::Tensor* source = file.find(name);
    if (source == nullptr) {
      missing.push_back(name);
    } else if (source->sizes() != target.sizes()) {
      mismatched.push_back(name);
      if (first_mismatch.empty()) {
        first_mismatch =
            fmt::format("{} has {} in the file, the model's is {}", name,
                        fmt::join(source->sizes(), "x"), fmt::join(target.sizes(), "x"));
      }
    } else {
      copies.emplace_back(target, source);
      summary.loaded.push_back(name);
    }
  };
  for (const auto& item : model.named_parameters()) plan(item.key(), item.value());
  for (const auto& item : model.named_buffers()) plan(item.key(), item.value());
  if (!mismatched.empty()) {
    const std::string others =
        mismatched.size() > 1 ? fmt::format(" (and {} more: {})", mismatched.size() - 1,
                                            abbreviate({mismatched.begin() + 1, mismatched.end()}))
                              : "";
    throw std::runtime_error(fmt::format(
        "{}: {}{}: a new head or another input? To leave these at the model's initialisation, "
        "add {}",
        path, first_mismatch, others, skip_advice(mismatched)));
  }
  if (!missing.empty()) {
    throw std::runtime_error(
        fmt::format("{}: no weights for {} of the model's tensors: {}. To leave them at the "
                    "model's initialisation, add {}",
                    path, missing.size(), abbreviate(missing), skip_advice(missing)));
  }
  for (auto& [target, source] : copies) target.copy_(*source);
  sort_file_tensors(file, model_names, skipped, summary);
  log_summary(path, summary);
  return summary;
}

}  // namespace kiln::engine
