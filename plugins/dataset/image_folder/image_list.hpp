// The sample index of an image list: a CSV file that names each sample's image and its classes
// (multi-label data: any number per image, none included), one sample per line,
//   path,classes
// the path relative to a root folder (or absolute), the classes split by a separator (a space
// by default, as Kaggle's Planet and the NUS-WIDE lists write them). A plain CSV: no quoted
// fields, so a path holds no comma. Classes are the sorted names the training list uses (or the
// ones given), each sample's target a row of 0 and 1 over them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::image_folder {

struct ListFormat {
  std::string separator = " ";  // between a sample's classes
  bool header = true;           // the first line names the columns: skipped
};

// Where a listed `path` is: under `root`, or under the folder of the list `file` when `root` is
// empty; an absolute path as it is.
std::string listed_path(const std::string& file, const std::string& root, const std::string& path);

class ImageList {
 public:
  ImageList() = default;
  // A list read elsewhere (coco.hpp): `rows` holds paths.size() x classes.size() values, 0 or 1.
  ImageList(std::vector<std::string> classes, std::vector<std::string> paths,
            std::vector<uint8_t> rows);

  // Reads `file` (`option` names the option it came from, for messages), paths relative to
  // `root` ("": the list's own folder). `classes`: the class names in order, or empty to take
  // the sorted names the list uses. Throws kiln::Error (KILN_ERR_INVALID_ARGUMENT) naming the
  // option, file and line for a list that cannot be read, a line without a comma or with an
  // empty path, a class not among `classes`, or a list of no sample.
  static ImageList read(const std::string& file, const std::string& option, const std::string& root,
                        const ListFormat& format, const std::vector<std::string>& classes);

  const std::vector<std::string>& classes() const { return classes_; }
  int64_t size() const { return static_cast<int64_t>(paths_.size()); }
  const std::string& path(int64_t i) const { return paths_[static_cast<size_t>(i)]; }
  // Sample `i`'s row: classes().size() values, 1 where it has the class.
  void row(int64_t i, float* out) const;

 private:
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;  // root joined
  std::vector<uint8_t> rows_;       // size() x classes, 0 or 1
};

}  // namespace kiln::image_folder
