// What every C API function shares: statuses made from exceptions (none crosses the ABI), the
// process-wide lock that serializes training calls, and struct-size checks.
#pragma once

#include <mutex>
#include <string>

#include "kiln/kiln.h"
#include "plugin/status.hpp"

namespace kiln::capi {

// A new status the caller owns; never throws (an allocation failure yields an empty message).
kiln_status* make_status(int32_t code, const std::string& message) noexcept;

// The status for the exception in flight (call inside a catch block): configuration errors are
// KILN_ERR_CONFIG, refused plugins KILN_ERR_PLUGIN_REFUSED, bad_alloc KILN_ERR_OUT_OF_MEMORY,
// anything else `fallback`.
kiln_status* status_from_exception(int32_t fallback) noexcept;

// Runs `f` (returning kiln_status*), turning any exception into a status.
template <typename F>
kiln_status* guarded(int32_t fallback, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return status_from_exception(fallback);
  }
}

// Serializes the calls that create, train, evaluate, checkpoint or destroy sessions: LibTorch's
// default generators are per process (each session swaps its own state in for its calls), and
// so are the settings a session may be allowed to make (KILN_PROCESS_*).
std::mutex& training_lock();

// True on the thread that is inside a metrics callback: serialized calls from there would
// deadlock on training_lock(), so they are refused instead.
bool in_callback();
void set_in_callback(bool inside);

// status_location: where a configuration error's status points (1), or nothing known (0).
int32_t status_location(const kiln_status* status, kiln_status_location* out) noexcept;

// A status when `size` (a caller's struct_size) is below the struct's version-1 size.
kiln_status* check_size(size_t size, size_t v1_size, const char* what) noexcept;

}  // namespace kiln::capi
