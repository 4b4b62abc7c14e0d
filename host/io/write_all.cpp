#include "io/write_all.hpp"

#include <unistd.h>

#include <cerrno>

namespace kiln::io {

size_t write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, p + written, size - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    written += static_cast<size_t>(n);
  }
  return written;
}

}  // namespace kiln::io
