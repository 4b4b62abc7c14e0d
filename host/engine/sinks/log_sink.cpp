#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cmath>

#include "engine/loss_scaler.hpp"
#include "engine/lr_driver.hpp"
#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class LogSink final : public RunSink {
 public:
  LogSink(LrDriver& lr, const LossScaler& scaler, const PrecisionPlan& plan)
      : lr_(lr), scaler_(scaler), dynamic_scale_(plan.loss_scaling == KILN_SCALE_DYNAMIC) {}

  void step(const StepReport& r) override {
    const int64_t step = r.record.step;
    const std::string lr_note = lr_.change_note(r.outcome.lr);
    if (!lr_note.empty()) spdlog::info("step {}: {}", step, lr_note);
    if (r.outcome.verdict == StepVerdict::kApply) return;
    const GradCheck& check = r.outcome.check;
    spdlog::warn(
        "step {}: {}; step skipped{}", step,
        check.measured ? fmt::format("non-finite gradients (loss scale {}) in {}",
                                     r.record.loss_scale, fmt::join(check.non_finite, ", "))
        : check.non_finite.empty()
            ? std::string("non-finite loss")
            : fmt::format("non-finite loss and gradients in {}", fmt::join(check.non_finite, ", ")),
        dynamic_scale_ ? fmt::format(", loss scale now {}", scaler_.scale()) : "");
  }

  void eval(const io::EvalRecord& e) override {
    const char* of = e.averaged ? " of the EMA weights" : "";
    if (e.multi_label) {
      spdlog::info("epoch {} evaluation{}: test mAP {:.2f}%  loss {:.4f}", e.epoch, of,
                   100.0 * e.map, e.loss);
      return;
    }
    spdlog::info("epoch {} evaluation{}: test accuracy {:.2f}%  top-5 {:.2f}%  loss {:.4f}",
                 e.epoch, of, 100.0 * e.accuracy, 100.0 * e.accuracy_top5, e.loss);
  }

 private:
  LrDriver& lr_;
  const LossScaler& scaler_;
  bool dynamic_scale_;
};

}  // namespace

std::unique_ptr<RunSink> log_sink(LrDriver& lr, const LossScaler& scaler,
                                  const PrecisionPlan& plan) {
  return std::make_unique<LogSink>(lr, scaler, plan);
}

}  // namespace kiln::engine
