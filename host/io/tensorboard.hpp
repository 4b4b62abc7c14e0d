// Training scalars as TensorBoard event files, so `tensorboard --logdir <dir>` plots a run.
#pragma once

#include <cstdint>
#include <string>

#include "io/buffered_file.hpp"

namespace kiln::io {

// Scalars as TensorBoard event files (TFRecord-framed Event protos), readable by TensorBoard.
class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new events.out.tfevents.<unix seconds>.<hostname>.<pid>.kiln
  // file in it, starting with the file_version event. Throws std::runtime_error naming the path.
  // A second writer of the same process in the same directory and second gets ".kiln.<n>"
  // (n = 1, 2, ...) instead of overwriting the first one's file.
  explicit TensorBoardWriter(const std::string& dir);

  // One Event with a simple_value (float). Buffered: written to the OS by flush(), by the
  // destructor, and on its own once the buffer is large or a few seconds old, so a live
  // TensorBoard follows the run. Throws std::runtime_error naming the path when a write fails.
  void scalar(const std::string& tag, double value, int64_t step);
  // A SessionLog START event at `step`: a run resumed from a checkpoint of step - 1 says so, and
  // TensorBoard drops the events of step >= `step` that files before this one hold (what the
  // interrupted run logged after its checkpoint), as it does for TensorFlow's restarts.
  void session_start(int64_t step);
  // Writes buffered records to the OS: the trainer calls it with every checkpoint, so a kill
  // after one loses no event of the steps it covers (a resumed run starts after them).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void append_record(const std::string& event);

  std::string path_;
  BufferedFile file_;  // framed records; flushed (a failure logged) and closed on destruction
};

}  // namespace kiln::io
