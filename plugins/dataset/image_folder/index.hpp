// The sample index of an image folder as torchvision's ImageFolder builds it: classes are the
// sorted sub-folder names of the root, samples every file below a class folder (symbolic links
// followed) whose name ends in one of the extensions, class by class, in sorted order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::image_folder {

class Index {
 public:
  // Lists `root` (`option` names the option it came from, for messages). Throws kiln::Error
  // (KILN_ERR_INVALID_ARGUMENT) when the root is missing or not a folder, holds no class folder,
  // or a class folder holds no matching file. `extensions` are lower case with their dot.
  // `skipped` receives how many files were left out for an image extension in `ignored` (the
  // ImageFolder extensions this plugin does not decode), for a warning; `cycles` the folder
  // links not followed because they lead back to the root or above it (c0/up -> ..), which
  // would list the images below them twice, under another class.
  static Index build(const std::string& root, const std::string& option,
                     const std::vector<std::string>& extensions,
                     const std::vector<std::string>& ignored, int64_t* skipped,
                     std::vector<std::string>* cycles);

  const std::vector<std::string>& classes() const { return classes_; }
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int64_t label(int64_t i) const { return labels_[static_cast<size_t>(i)]; }
  // The full path of sample `i` (root/class/...).
  std::string path(int64_t i) const;

 private:
  std::string root_;
  std::vector<std::string> classes_;
  // Paths below the root, '\0'-separated in one buffer (an ImageNet holds 1.3 million).
  std::string names_;
  std::vector<uint64_t> offsets_;
  std::vector<int32_t> labels_;
};

// The sorted names of the class folders of `root` (sub-folders, links to folders included);
// throws as Index::build when `root` is missing or holds none.
std::vector<std::string> list_classes(const std::string& root, const std::string& option);

// The paths of `root`'s first `count` samples at most (those Index::build would put first),
// listing no more class folders than it takes; `classes` as list_classes gives them.
std::vector<std::string> first_samples(const std::string& root,
                                       const std::vector<std::string>& classes,
                                       const std::vector<std::string>& extensions, int64_t count);

}  // namespace kiln::image_folder
