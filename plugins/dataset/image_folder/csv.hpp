// Records of a CSV file as RFC 4180 writes them (and Python's csv module with its default
// dialect): fields split at commas; a field in double quotes may hold commas, line breaks and
// quotes written twice. Used by the image_list dataset, whose paths and class names may hold
// commas.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::image_folder {

// A record that breaks the format; what() says how, line() where it starts.
class CsvError : public std::runtime_error {
 public:
  CsvError(int64_t line, const std::string& what) : std::runtime_error(what), line_(line) {}
  int64_t line() const { return line_; }

 private:
  int64_t line_;
};

class CsvReader {
 public:
  explicit CsvReader(std::istream& in) : in_(in) {}

  // The next record's fields (unquoted, spaces kept) into `fields`, and the 1-based line it
  // starts on into `line`; false at the end of the input. A blank line is a record of one empty
  // field. Throws CsvError for a quote left open at the end of the input, or text between a
  // closing quote and the next comma.
  bool next(std::vector<std::string>& fields, int64_t& line);

 private:
  std::istream& in_;
  int64_t lines_ = 0;  // physical lines read so far
};

}  // namespace kiln::image_folder
