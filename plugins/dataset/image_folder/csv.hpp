// Records of a CSV file as RFC 4180 writes them (and Python's csv module with its default
// dialect): fields split at every unquoted comma; a field in double quotes may hold commas, line
// breaks and quotes written twice. Parsed by libcsv (Debian's libcsv-dev) in strict mode; this
// reader adds the line each record starts on, for messages. Used by the image_list dataset,
// whose paths and class names may hold commas.
#pragma once

#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::image_folder {

// A record that breaks the format; what() says how, line() where.
class CsvError : public std::runtime_error {
 public:
  CsvError(int64_t line, const std::string& what) : std::runtime_error(what), line_(line) {}
  int64_t line() const { return line_; }

 private:
  int64_t line_;
};

struct CsvRecord {
  std::vector<std::string> fields;  // unquoted, spaces kept
  int64_t line = 0;                 // 1-based line the record starts on
};

// Every record of `in`; blank lines are not records. Throws CsvError for a misplaced quote (text
// after a closing quote, a quote inside an unquoted field) with the line it is on, or a quote
// left open at the end of the input with the line its record starts on.
std::vector<CsvRecord> read_csv(std::istream& in);

}  // namespace kiln::image_folder
