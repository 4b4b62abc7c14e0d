#include "csv.hpp"

namespace kiln::image_folder {

bool CsvReader::next(std::vector<std::string>& fields, int64_t& line) {
  std::string text;
  if (!std::getline(in_, text)) return false;
  line = ++lines_;
  fields.assign(1, std::string());
  bool quoted = false;      // inside a quoted field
  bool was_quoted = false;  // the current field's quotes have closed
  for (;;) {
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (quoted) {
        if (c != '"') {
          fields.back() += c;
        } else if (i + 1 < text.size() && text[i + 1] == '"') {
          fields.back() += '"';  // a quote written twice
          ++i;
        } else {
          quoted = false;
          was_quoted = true;
        }
      } else if (c == ',') {
        fields.emplace_back();
        was_quoted = false;
      } else if (c == '"' && fields.back().empty() && !was_quoted) {
        quoted = true;
      } else if (was_quoted) {
        // A Windows line end after the closing quote is the line's, not the field's.
        if (c == '\r' && i + 1 == text.size()) continue;
        throw CsvError(line,
                       "text after a quoted field's closing quote (a quote inside a quoted "
                       "field is written twice)");
      } else {
        fields.back() += c;
      }
    }
    if (!quoted) return true;
    // A line break inside quotes belongs to the field: the record goes on.
    if (!std::getline(in_, text)) {
      throw CsvError(line, "a quoted field is not closed before the end of the file");
    }
    ++lines_;
    fields.back() += '\n';
  }
}

}  // namespace kiln::image_folder
