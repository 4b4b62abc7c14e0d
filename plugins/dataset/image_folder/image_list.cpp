#include "image_list.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <utility>

#include "csv.hpp"
#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

[[noreturn]] void refuse(const std::string& option, const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, "image_list: option '" + option + "': " + what);
}

std::string folder_of(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// `text` split at every `separator`, empty pieces dropped.
std::vector<std::string> split(const std::string& text, const std::string& separator) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = text.find(separator, start);
    const std::string piece = trim(text.substr(start, end - start));
    if (!piece.empty()) out.push_back(piece);
    if (end == std::string::npos) break;
    start = end + separator.size();
  }
  return out;
}

}  // namespace

std::string listed_path(const std::string& file, const std::string& root, const std::string& path) {
  const std::string base = root.empty() ? folder_of(file) : root;
  return path.front() == '/' || base.empty() ? path : base + "/" + path;
}

ImageList::ImageList(std::vector<std::string> classes, std::vector<std::string> paths,
                     std::vector<uint8_t> rows)
    : classes_(std::move(classes)), paths_(std::move(paths)), rows_(std::move(rows)) {}

ImageList ImageList::read(const std::string& file, const std::string& option,
                          const std::string& root, const ListFormat& format,
                          const std::vector<std::string>& classes) {
  if (format.separator.empty()) refuse("separator", "is empty");
  std::ifstream in(file);
  if (!in) refuse(option, file + ": cannot open");
  std::vector<std::string> paths;
  std::vector<std::vector<std::string>> names;
  std::vector<CsvRecord> records;
  try {
    records = read_csv(in);
  } catch (const CsvError& e) {
    refuse(option, file + ":" + std::to_string(e.line()) + ": " + e.what());
  }
  for (size_t r = format.header ? 1 : 0; r < records.size(); ++r) {
    const std::vector<std::string>& fields = records[r].fields;
    if (fields.size() == 1 && trim(fields[0]).empty()) continue;
    const std::string where = file + ":" + std::to_string(records[r].line) + ": ";
    if (fields.size() < 2) refuse(option, where + "no comma: each line is path,classes");
    // An unquoted comma separates fields (RFC 4180): a third field is not read as more classes.
    if (fields.size() > 2) {
      refuse(option, where + std::to_string(fields.size()) +
                         " fields; each line is path,classes: put a path or classes that hold "
                         "a comma in double quotes (a.jpg,\"cat,dog\")");
    }
    const std::string path = trim(fields[0]);
    if (path.empty()) refuse(option, where + "the path is empty");
    paths.push_back(listed_path(file, root, path));
    names.push_back(split(fields[1], format.separator));
  }
  if (paths.empty()) refuse(option, file + ": lists no sample");

  ImageList list;
  if (classes.empty()) {
    std::set<std::string> used;
    for (const auto& n : names) used.insert(n.begin(), n.end());
    if (used.empty()) refuse(option, file + ": no sample has a class");
    list.classes_.assign(used.begin(), used.end());
  } else {
    list.classes_ = classes;
  }
  std::map<std::string, size_t> column;
  for (size_t k = 0; k < list.classes_.size(); ++k) column[list.classes_[k]] = k;
  const size_t width = list.classes_.size();
  list.rows_.assign(paths.size() * width, 0);
  for (size_t i = 0; i < paths.size(); ++i) {
    for (const std::string& name : names[i]) {
      const auto it = column.find(name);
      if (it == column.end()) {
        refuse(option, file + ": sample " + std::to_string(i) + " (" + paths[i] + ") has class '" +
                           name + "', which the training list does not use");
      }
      list.rows_[i * width + it->second] = 1;
    }
  }
  list.paths_ = std::move(paths);
  return list;
}

void ImageList::row(int64_t i, float* out) const {
  const size_t width = classes_.size();
  const uint8_t* r = rows_.data() + static_cast<size_t>(i) * width;
  for (size_t k = 0; k < width; ++k) out[k] = static_cast<float>(r[k]);
}

}  // namespace kiln::image_folder
