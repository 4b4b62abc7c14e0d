#include "io/error_text.hpp"

namespace kiln::io {
namespace {

bool starts_with(const std::string& text, size_t at, const char* prefix) {
  return text.compare(at, std::char_traits<char>::length(prefix), prefix) == 0;
}

}  // namespace

std::string without_backtrace(const std::string& message) {
  std::string out;
  size_t at = 0;  // start of the line being read
  while (at < message.size()) {
    size_t end = message.find('\n', at);
    if (end == std::string::npos) end = message.size();
    if (starts_with(message, at, "Exception raised from ")) {
      // The trace's frames follow, one a line ("<omitting python frames>" among them).
      at = end + 1;
      while (at < message.size() &&
             (starts_with(message, at, "frame #") || starts_with(message, at, "<omitting"))) {
        const size_t next = message.find('\n', at);
        at = next == std::string::npos ? message.size() : next + 1;
      }
      while (!out.empty() && out.back() == '\n') out.pop_back();  // the line break before it
      if (at < message.size()) out += '\n';
      continue;
    }
    out.append(message, at, end - at);
    if (end < message.size()) out += '\n';
    at = end + 1;
  }
  return out;
}

}  // namespace kiln::io
