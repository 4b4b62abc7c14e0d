#include "io/buffered_file.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "io/write_all.hpp"

namespace kiln::io {

BufferedFile::~BufferedFile() {
  if (fd_ < 0) return;
  try {
    flush();
  } catch (const std::exception& e) {
    spdlog::warn("{}", e.what());
  }
  close();
}

void BufferedFile::attach(int fd, std::string path, std::string what,
                          std::chrono::steady_clock::duration flush_age, size_t flush_bytes) {
  fd_ = fd;
  path_ = std::move(path);
  what_ = std::move(what);
  flush_age_ = flush_age;
  flush_bytes_ = flush_bytes;
  last_flush_ = std::chrono::steady_clock::now();
}

void BufferedFile::flush_if_due() {
  if (pending_.size() >= flush_bytes_ ||
      std::chrono::steady_clock::now() - last_flush_ >= flush_age_) {
    flush();
  }
}

void BufferedFile::flush() {
  if (fd_ < 0) return;
  const size_t written = write_all(fd_, pending_.data(), pending_.size());
  if (written < pending_.size()) {
    const int error = errno;
    const size_t rest = pending_.size() - written;
    std::memmove(pending_.data(), pending_.data() + written, rest);
    pending_.resize(rest);
    throw std::runtime_error(path_ + ": cannot write " + what_ + ": " + std::strerror(error));
  }
  pending_.clear();
  last_flush_ = std::chrono::steady_clock::now();
}

void BufferedFile::close() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  pending_.clear();
}

}  // namespace kiln::io
