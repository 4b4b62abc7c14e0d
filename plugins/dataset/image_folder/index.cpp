#include "index.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

[[noreturn]] void refuse(const std::string& option, const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, "image_folder: option '" + option + "': " + what);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// One folder's entries, split as os.scandir's is_dir() splits them (links followed).
struct Listing {
  std::vector<std::string> dirs;
  std::vector<std::string> files;
};

// false when `dir` cannot be opened (errno set); os.walk skips such folders silently.
bool list(const std::string& dir, Listing* out) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  while (const dirent* e = readdir(d)) {
    const char* name = e->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_LNK || e->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_dir = stat(join(dir, name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    }
    (is_dir ? out->dirs : out->files).emplace_back(name);
  }
  closedir(d);
  return true;
}

bool has_extension(const std::string& name, const std::vector<std::string>& extensions) {
  for (const std::string& ext : extensions) {
    if (name.size() < ext.size()) continue;
    bool same = true;
    for (size_t i = 0; i < ext.size() && same; ++i) {
      char c = name[name.size() - ext.size() + i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      same = c == ext[i];
    }
    if (same) return true;
  }
  return false;
}

using Folder = std::pair<std::string, std::vector<std::string>>;  // path below root, file names
using FolderId = std::pair<dev_t, ino_t>;

// The folders from `root` up to "/" (device and inode of each, the physical path's): a link to
// any of them leads back into the root.
std::vector<FolderId> root_and_above(const std::string& root) {
  std::vector<FolderId> out;
  char* resolved = realpath(root.c_str(), nullptr);
  if (resolved == nullptr) return out;
  std::string path = resolved;
  std::free(resolved);
  for (;;) {
    struct stat st {};
    if (stat(path.empty() ? "/" : path.c_str(), &st) == 0) out.emplace_back(st.st_dev, st.st_ino);
    const size_t slash = path.rfind('/');
    if (path.empty() || slash == std::string::npos) break;
    path.resize(slash);
  }
  return out;
}

// os.walk(top, followlinks=True): every folder below `rel` with its files. A folder on the way
// down from "/" (device and inode in `way`: a link cycle such as c0/up -> ..) is not entered:
// Python would recurse until paths overflow, and entering the root again would list other
// classes' images under this one. Its path goes to `cycles`, for a warning.
void walk(const std::string& root, const std::string& rel, std::vector<FolderId>* way,
          std::vector<Folder>* out, std::vector<std::string>* cycles) {
  const std::string dir = join(root, rel);
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return;
  const FolderId id(st.st_dev, st.st_ino);
  if (std::find(way->begin(), way->end(), id) != way->end()) {
    cycles->push_back(dir);
    return;
  }
  Listing listing;
  if (!list(dir, &listing)) return;
  out->emplace_back(rel, std::move(listing.files));
  way->push_back(id);
  for (const std::string& sub : listing.dirs) walk(root, join(rel, sub), way, out, cycles);
  way->pop_back();
}

// The files of class folder `name` that end in one of `extensions`, below the root, in
// ImageFolder's order; `skipped` counts those left out that end in one of `ignored`, `cycles`
// receives the links not followed because they lead back up (`above`: root_and_above(root)).
std::vector<std::string> class_samples(const std::string& root, const std::string& name,
                                       const std::vector<std::string>& extensions,
                                       const std::vector<std::string>& ignored,
                                       const std::vector<FolderId>& above, int64_t* skipped,
                                       std::vector<std::string>* cycles) {
  std::vector<Folder> folders;
  std::vector<FolderId> way = above;
  walk(root, name, &way, &folders, cycles);
  // sorted(os.walk(...)): folders by their whole path, then each folder's files by name.
  std::sort(folders.begin(), folders.end(),
            [](const Folder& a, const Folder& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (Folder& folder : folders) {
    std::sort(folder.second.begin(), folder.second.end());
    for (const std::string& file : folder.second) {
      if (has_extension(file, extensions)) {
        out.push_back(join(folder.first, file));
      } else if (has_extension(file, ignored)) {
        ++*skipped;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<std::string> list_classes(const std::string& root, const std::string& option) {
  struct stat st {};
  if (stat(root.c_str(), &st) != 0) {
    refuse(option, "'" + root + "' cannot be read: " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) refuse(option, "'" + root + "' is not a folder");
  Listing listing;
  if (!list(root, &listing)) {
    refuse(option, "'" + root + "' cannot be listed: " + std::strerror(errno));
  }
  if (listing.dirs.empty()) {
    refuse(option, "'" + root + "' holds no class folder (the layout is root/<class>/<image>)");
  }
  // Python's sorted() on str: code point order, which byte order of UTF-8 names keeps.
  std::sort(listing.dirs.begin(), listing.dirs.end());
  return listing.dirs;
}

Index Index::build(const std::string& root, const std::string& option,
                   const std::vector<std::string>& extensions,
                   const std::vector<std::string>& ignored, int64_t* skipped,
                   std::vector<std::string>* cycles) {
  Index index;
  index.root_ = root;
  index.classes_ = list_classes(root, option);
  *skipped = 0;
  cycles->clear();
  const std::vector<FolderId> above = root_and_above(root);
  std::vector<std::string> empty;
  for (size_t c = 0; c < index.classes_.size(); ++c) {
    const std::vector<std::string> files =
        class_samples(root, index.classes_[c], extensions, ignored, above, skipped, cycles);
    if (files.empty()) empty.push_back(index.classes_[c]);
    for (const std::string& file : files) {
      index.offsets_.push_back(index.names_.size());
      index.names_ += file;
      index.names_.push_back('\0');
      index.labels_.push_back(static_cast<int32_t>(c));
    }
  }
  if (!empty.empty()) {
    std::string names;
    for (size_t i = 0; i < empty.size() && i < 10; ++i) {
      names += (i ? ", '" : "'") + join(root, empty[i]) + "'";
    }
    if (empty.size() > 10) names += " and " + std::to_string(empty.size() - 10) + " more";
    std::string exts;
    for (const std::string& e : extensions) exts += (exts.empty() ? "" : ", ") + e;
    refuse(option, std::string(empty.size() == 1 ? "class folder " : "class folders ") + names +
                       " hold" + (empty.size() == 1 ? "s" : "") + " no file ending in " + exts +
                       " (option 'extensions')");
  }
  return index;
}

std::vector<std::string> first_samples(const std::string& root,
                                       const std::vector<std::string>& classes,
                                       const std::vector<std::string>& extensions, int64_t count) {
  std::vector<std::string> out;
  int64_t skipped = 0;
  std::vector<std::string> cycles;  // Index::build warns of them
  const std::vector<FolderId> above = root_and_above(root);
  for (size_t c = 0; c < classes.size() && static_cast<int64_t>(out.size()) < count; ++c) {
    for (const std::string& file :
         class_samples(root, classes[c], extensions, {}, above, &skipped, &cycles)) {
      if (static_cast<int64_t>(out.size()) == count) break;
      out.push_back(join(root, file));
    }
  }
  return out;
}

std::string Index::path(int64_t i) const {
  return join(root_, names_.c_str() + offsets_[static_cast<size_t>(i)]);
}

}  // namespace kiln::image_folder
