#include "dist/heartbeat.hpp"
#include "engine/sinks/sinks.hpp"

namespace kiln::engine {

namespace {

class HeartbeatSink final : public RunSink {
 public:
  explicit HeartbeatSink(dist::Heartbeat& heartbeat) : heartbeat_(heartbeat) {}
  void step(const StepReport& r) override { heartbeat_.set_step(r.record.step); }

 private:
  dist::Heartbeat& heartbeat_;
};

}  // namespace

std::unique_ptr<RunSink> heartbeat_sink(dist::Heartbeat* heartbeat) {
  if (heartbeat == nullptr) return nullptr;
  return std::make_unique<HeartbeatSink>(*heartbeat);
}

}  // namespace kiln::engine
