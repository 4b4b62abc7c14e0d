#include "dist/attempt_store.hpp"

#include <c10/util/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

namespace kiln::dist {
namespace {

using Clock = std::chrono::steady_clock;

// 128 random bits: a process's slot value, never seen in an earlier attempt.
std::string nonce() {
  std::random_device device;
  std::string out;
  for (int i = 0; i < 4; ++i) out += fmt::format("{:08x}", device());
  return out;
}

std::string slot(int rank) { return "slot/" + std::to_string(rank); }

// Bumped after every slot write: a waiting rank rereads the slots only when it moved.
constexpr const char* kWrites = "writes";

std::string name_of(const std::vector<std::vector<uint8_t>>& slots) {
  std::string joined;
  for (const auto& s : slots) joined.append(s.begin(), s.end()).push_back(';');
  return "attempt/" + c10::sha1(joined).str().substr(0, 16);
}

}  // namespace

c10::intrusive_ptr<c10d::Store> attempt_store(const c10::intrusive_ptr<c10d::Store>& store,
                                              const std::string& run_id, int rank, int world_size,
                                              std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto run = c10::make_intrusive<c10d::PrefixStore>("kiln/" + run_id, store);
  run->set(slot(rank), nonce());
  run->add(kWrites, 1);
  std::vector<std::string> slots;
  for (int r = 0; r < world_size; ++r) slots.push_back(slot(r));
  // Until every slot holds something: this attempt's nonce or, in a kept store, an earlier one's.
  run->wait(slots, timeout);

  std::set<std::string> counted;  // names this rank has counted itself under
  for (;;) {
    const int64_t writes = run->add(kWrites, 0);
    const std::string name = name_of(run->multiGet(slots));
    const std::string joined = name + "/joined";
    if (counted.insert(name).second) run->add(joined, 1);
    for (auto pause = std::chrono::milliseconds(1);;
         pause = std::min(2 * pause, std::chrono::milliseconds(100))) {
      if (run->add(joined, 0) >= world_size)
        return c10::make_intrusive<c10d::PrefixStore>(name, run);
      if (Clock::now() > deadline) {
        throw std::runtime_error(fmt::format(
            "the {} ranks did not all join this attempt within {:g} s: one did not start, or one "
            "of an earlier attempt is still running",
            world_size, std::chrono::duration<double>(timeout).count()));
      }
      std::this_thread::sleep_for(pause);
      if (run->add(kWrites, 0) != writes) break;  // a slot changed: compute the name again
    }
  }
}

}  // namespace kiln::dist
