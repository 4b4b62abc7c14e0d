// Liveness of the ranks, for naming the one that died or hung when a collective fails. Each
// rank's background thread writes (beat count, step) to the rendezvous store once a second; on
// failure, a rank reads everyone's beat twice, a few seconds apart: a rank whose beat did not
// move is dead or hung (a rank blocked in a collective still beats).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace c10d {
class Store;
}

namespace kiln::dist {

class Heartbeat {
 public:
  // Starts beating on its own connection to `store` (a clone).
  Heartbeat(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
            std::chrono::milliseconds interval = std::chrono::seconds(1));
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The optimizer step this rank has reached (cheap: an atomic store).
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

  // One sentence on which ranks stopped beating, read from the store over about three beat
  // intervals; says so when every rank is alive or the store itself is gone (rank 0 hosts it).
  std::string diagnose() const;

 private:
  void beat_loop();

  c10::intrusive_ptr<c10d::Store> store_;
  const int rank_, world_size_;
  const std::chrono::milliseconds interval_;
  std::atomic<int64_t> step_{0};
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln::dist
