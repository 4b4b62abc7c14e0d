// Writing a whole buffer to a file descriptor, for Kiln's file writers (metrics, TensorBoard
// events, safetensors).
#pragma once

#include <cstddef>

namespace kiln::io {

// Writes `size` bytes from `data` to `fd`, going on after short writes and EINTR. Returns how
// many bytes were written: `size`, or fewer when a write failed, with errno saying why.
size_t write_all(int fd, const void* data, size_t size);

}  // namespace kiln::io
