// run.profile_steps: a Chrome trace of a few optimizer steps from torch's own profiler (Kineto),
// the host's ATen ops and, on CUDA, the device's kernels and copies: what torch.profiler gives a
// Python loop, so the two can be read side by side.
#include <ATen/record_function.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <boost/filesystem/operations.hpp>
#include <optional>
#include <set>

#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

namespace prof = torch::profiler::impl;

class ProfileSink final : public RunSink {
 public:
  ProfileSink(ProfileWindow window, c10::Device device)
      : window_(std::move(window)), device_(device) {
    // Steps count from 1; a resumed run whose next step is inside the window starts at once.
    maybe_start(window_.resumed_at + 1);
  }
  ProfileSink(const ProfileSink&) = delete;
  ProfileSink& operator=(const ProfileSink&) = delete;
  ~ProfileSink() override {
    // A run that failed mid-window: leave the profiler off, keep no partial trace.
    if (!active_) return;
    try {
      step_mark_.reset();
      torch::autograd::profiler::disableProfiler();
    } catch (...) {
    }
  }

  void step(const StepReport& r) override {
    const int64_t step = r.record.step;
    if (active_) {
      last_ = step;
      if (step >= end()) {
        stop();
        return;
      }
      mark(step + 1);
    }
    maybe_start(step + 1);
  }
  void run_end() override {
    if (active_) stop();
  }

 private:
  void maybe_start(int64_t next) {
    if (active_ || done_ || next < window_.first || next > end()) return;
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
    try {
      torch::autograd::profiler::prepareProfiler(config, activities);
      torch::autograd::profiler::enableProfiler(config, activities);
    } catch (const std::exception& e) {
      // E.g. a profiler the embedding program runs already: the training goes on untraced.
      spdlog::warn("run.profile_steps: no trace of step {} on: {}", next, e.what());
      done_ = true;
      return;
    }
    active_ = true;
    begun_ = next;
    last_ = next - 1;
    mark(next);
  }

  // The last step traced: the window's, or the run's when it ends first.
  int64_t end() const {
    const int64_t last = window_.first + window_.steps - 1;
    return window_.max_steps > 0 ? std::min(last, window_.max_steps) : last;
  }

  // A span per optimizer step, named as torch.profiler's schedule names them.
  void mark(int64_t step) {
    step_mark_.reset();
    step_mark_.emplace(at::RecordScope::USER_SCOPE);
    if (step_mark_->isActive()) step_mark_->before("ProfilerStep#" + std::to_string(step));
  }

  void stop() {
    step_mark_.reset();
    std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
        torch::autograd::profiler::disableProfiler();
    active_ = false;
    done_ = true;
    if (last_ < begun_) return;  // the run ended before a step inside the window finished
    const std::string path =
        window_.dir + "/steps_" + std::to_string(begun_) + "-" + std::to_string(last_) + ".json";
    try {
      boost::filesystem::create_directories(window_.dir);
      result->save(path);
      spdlog::info("profile of steps {}-{} written to {} (open it in ui.perfetto.dev)", begun_,
                   last_, path);
    } catch (const std::exception& e) {
      // A trace is a diagnostic: failing to write one does not end the training run.
      spdlog::warn("profile of steps {}-{} not written to {}: {}", begun_, last_, path, e.what());
    }
  }

  ProfileWindow window_;
  c10::Device device_;
  bool active_ = false;
  bool done_ = false;
  int64_t begun_ = 0;  // the first step inside the trace
  int64_t last_ = 0;   // the last step finished inside it
  std::optional<at::RecordFunction> step_mark_;
};

}  // namespace

std::unique_ptr<RunSink> profile_sink(ProfileWindow window, c10::Device device) {
  if (window.steps <= 0) return nullptr;
  return std::make_unique<ProfileSink>(std::move(window), device);
}

}  // namespace kiln::engine
