#include "dist/heartbeat.hpp"

#include <fmt/format.h>

#include <sstream>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace kiln::dist {
namespace {

std::string key(int rank) { return "kiln/heartbeat/" + std::to_string(rank); }

struct Beat {
  bool present = false;
  int64_t count = 0, step = 0;
};

// Every rank's latest beat; throws when the store cannot be reached.
std::vector<Beat> read_beats(c10d::Store& store, int world_size) {
  std::vector<Beat> beats(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    if (!store.check({key(r)})) continue;
    std::istringstream in(store.get_to_str(key(r)));
    Beat& b = beats[static_cast<size_t>(r)];
    b.present = static_cast<bool>(in >> b.count >> b.step);
  }
  return beats;
}

}  // namespace

Heartbeat::Heartbeat(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                     std::chrono::milliseconds interval)
    : store_(store->clone()), rank_(rank), world_size_(world_size), interval_(interval) {
  // A hung store host must not hold a diagnosis for the whole collective timeout.
  store_->setTimeout(5 * interval_);
  thread_ = std::thread([this] { beat_loop(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Heartbeat::beat_loop() {
  int64_t count = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    try {
      store_->set(key(rank_), fmt::format("{} {}", ++count, step_.load()));
    } catch (const std::exception&) {
      return;  // the store is gone (rank 0 ended); nothing left to report to
    }
    stop_cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

std::string Heartbeat::diagnose() const {
  try {
    // The beating connection (TCPStore serialises its operations): a new one would wait the
    // full connect timeout when the store host is gone.
    const std::vector<Beat> before = read_beats(*store_, world_size_);
    std::this_thread::sleep_for(3 * interval_);
    const std::vector<Beat> after = read_beats(*store_, world_size_);
    std::string silent;
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      const Beat& a = before[static_cast<size_t>(r)];
      const Beat& b = after[static_cast<size_t>(r)];
      if (!b.present) {
        silent += fmt::format("{}rank {} (never reported)", silent.empty() ? "" : ", ", r);
      } else if (a.present && a.count == b.count) {
        silent +=
            fmt::format("{}rank {} (last seen at step {})", silent.empty() ? "" : ", ", r, b.step);
      }
    }
    if (silent.empty()) return "every rank is still alive";
    return "stopped responding: " + silent + "; it died or hung";
  } catch (const std::exception&) {
    return "the rendezvous store on rank 0 is unreachable: rank 0 died or hung";
  }
}

}  // namespace kiln::dist
