// What a person reads of an exception: its message without the C++ stack trace that c10::Error
// (LibTorch's TORCH_CHECK) appends to what(), wherever the message travelled on the way (a
// plugin's status, a wrapping exception). `kiln -v` logs the full text at debug level.
#pragma once

#include <string>

namespace kiln::io {

// `message` with each of LibTorch's stack traces cut out: the line "Exception raised from …
// (most recent call first):" and the "frame #N: …" lines after it. Any other text is kept.
std::string without_backtrace(const std::string& message);

}  // namespace kiln::io
