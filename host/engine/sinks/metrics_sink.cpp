#include "engine/sinks/sinks.hpp"
#include "io/metrics.hpp"

namespace kiln::engine {

namespace {

class MetricsSink final : public RunSink {
 public:
  MetricsSink(const std::string& path, bool append, const std::vector<std::string>& groups)
      : writer_(path, append) {
    writer_.set_lr_groups(groups);
  }
  void step(const StepReport& r) override { writer_.write(r.record); }
  void eval(const io::EvalRecord& e) override { writer_.write(e); }
  void flush() override { writer_.flush(); }

 private:
  io::MetricsWriter writer_;
};

}  // namespace

std::unique_ptr<RunSink> metrics_sink(const std::string& path, bool append,
                                      const std::vector<std::string>& group_names) {
  return std::make_unique<MetricsSink>(path, append, group_names);
}

}  // namespace kiln::engine
