#include "csv.hpp"

#include <csv.h>

#include <memory>
#include <new>

namespace kiln::image_folder {
namespace {

// What libcsv's callbacks build. With CSV_REPALL_NL every line end outside quotes reaches
// end_record, so the line after the last one is where the next record starts.
struct Records {
  std::vector<CsvRecord> records;
  CsvRecord current;
  int64_t line = 0;        // the physical line being fed
  int64_t next_start = 1;  // where the next record starts
};

void end_field(void* text, size_t length, void* data) {
  auto* r = static_cast<Records*>(data);
  if (r->current.fields.empty()) r->current.line = r->next_start;
  r->current.fields.emplace_back(static_cast<const char*>(text), length);
}

void end_record(int /*terminator*/, void* data) {
  auto* r = static_cast<Records*>(data);
  r->next_start = r->line + 1;
  if (r->current.fields.empty()) return;  // a blank line, or the LF of a CR LF
  r->records.push_back(std::move(r->current));
  r->current = CsvRecord{};
}

// Spaces belong to the field, as Python's reader keeps them (libcsv trims by default).
int no_spaces(unsigned char /*c*/) { return 0; }

constexpr const char* kMisplacedQuote =
    "a misplaced double quote: a quoted field ends at its closing quote (then a comma or the "
    "line's end), a quote inside one is written twice, and a field without quotes holds none "
    "(RFC 4180)";

}  // namespace

std::vector<CsvRecord> read_csv(std::istream& in) {
  csv_parser parser{};
  if (csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_REPALL_NL) != 0) {
    throw std::bad_alloc();
  }
  const std::unique_ptr<csv_parser, decltype(&csv_free)> owned(&parser, &csv_free);
  csv_set_space_func(&parser, no_spaces);
  Records r;
  std::string text;
  while (std::getline(in, text)) {
    ++r.line;
    text += '\n';  // getline took it; the parser ends records at it
    if (csv_parse(&parser, text.data(), text.size(), end_field, end_record, &r) != text.size()) {
      if (csv_error(&parser) == CSV_ENOMEM) throw std::bad_alloc();
      throw CsvError(r.line, kMisplacedQuote);
    }
  }
  if (csv_fini(&parser, end_field, end_record, &r) != 0) {
    if (csv_error(&parser) == CSV_ENOMEM) throw std::bad_alloc();
    throw CsvError(r.next_start, "a quoted field is not closed before the end of the file");
  }
  return std::move(r.records);
}

}  // namespace kiln::image_folder
