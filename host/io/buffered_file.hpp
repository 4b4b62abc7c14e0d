// An open file with a buffer of whole records in front of it, for Kiln's append-only logs
// (metrics lines, TensorBoard events): a write is a system call, which costs a dispatch-bound
// CPU step more than its own time (docs/speed.md), so records leave in batches.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <string>

namespace kiln::io {

class BufferedFile {
 public:
  BufferedFile() = default;  // nothing open until attach()
  ~BufferedFile();           // flushes (a failure is logged) and closes
  BufferedFile(const BufferedFile&) = delete;
  BufferedFile& operator=(const BufferedFile&) = delete;

  // Takes `fd` (closed by the destructor or close()). Buffered records go to the OS once they
  // reach `flush_bytes` or the last flush is `flush_age` old (flush_if_due), and on flush().
  // A failed write throws std::runtime_error "<path>: cannot write <what>: <reason>".
  void attach(int fd, std::string path, std::string what,
              std::chrono::steady_clock::duration flush_age, size_t flush_bytes = 64 * 1024);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

  // Append whole records here; kept between flushes, so appending allocates nothing in the end.
  fmt::memory_buffer& buffer() { return pending_; }
  void flush_if_due();
  // Writes the buffer to the OS. On a failure what did not go out stays for the next flush.
  void flush();
  // Closes without writing what is buffered (a writer whose set-up failed).
  void close();

 private:
  int fd_ = -1;
  std::string path_, what_;
  std::chrono::steady_clock::duration flush_age_{};
  size_t flush_bytes_ = 0;
  fmt::memory_buffer pending_;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace kiln::io
