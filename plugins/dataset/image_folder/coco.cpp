#include "coco.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& option, const std::string& file,
                         const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, "coco: option '" + option + "': " + file + ": " + what);
}

// A file mapped read-only for one parse: no copy of a file of hundreds of megabytes.
class MappedFile {
 public:
  MappedFile(const std::string& file, const std::string& option) {
    fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      close_fd();
      refuse(option, file, "cannot open");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) return;  // parsed as empty: "unexpected end of input"
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      close_fd();
      refuse(option, file, "cannot map it into memory");
    }
    ::madvise(p, size_, MADV_SEQUENTIAL);
    data_ = static_cast<const char*>(p);
  }
  ~MappedFile() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
    close_fd();
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const char* begin() const { return data_; }
  const char* end() const { return data_ + size_; }

 private:
  void close_fd() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The three arrays of a COCO file the index reads.
enum Section : int { kImages = 0, kAnnotations = 1, kCategories = 2, kSections = 3, kOther = 4 };
constexpr const char* kSectionKeys[kSections] = {"images", "annotations", "categories"};

// One element of a section, with the fields the index needs (unset: missing or mistyped).
struct Element {
  bool object = true;
  std::optional<int64_t> id, image_id, category_id;
  std::optional<std::string> file_name, name;
};

struct Parsed {
  bool object = false;                            // the top-level value is an object
  bool array[kSections] = {false, false, false};  // each section is present as an array
  std::vector<Element> elements[kSections];
};

// A SAX handler that keeps the elements of the sections asked for and reads past the rest
// (polygons, boxes, captions, licences): no DOM of a file that is mostly segmentation.
// Depth 1: the top object's keys; 2: a section array's elements; 3: an element's fields.
class CocoSax {
 public:
  CocoSax(Parsed& out, bool samples) : out_(out), samples_(samples) {}

  bool null() { return scalar(); }
  bool boolean(bool) { return scalar(); }
  bool number_integer(int64_t v) { return integer(v); }
  bool number_unsigned(uint64_t v) {
    return v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? integer(static_cast<int64_t>(v))
               : scalar();
  }
  bool number_float(double, const std::string&) { return scalar(); }
  bool string(std::string& v) {
    if (field_target_string() != nullptr) *field_target_string() = std::move(v);
    return scalar();
  }
  bool binary(json::binary_t&) { return scalar(); }
  bool start_object(size_t) { return open(true); }
  bool start_array(size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    if (depth_ == 1) {
      section_ = kOther;
      for (int s = 0; s < kSections; ++s) {
        if (k == kSectionKeys[s] && (samples_ || s == kCategories))
          section_ = static_cast<Section>(s);
      }
    } else if (depth_ == 3) {
      field_ = k;
    }
    return true;
  }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    error_ = e.what();
    const size_t start = error_.find("] ");
    if (start != std::string::npos) error_ = error_.substr(start + 2);
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool in_section() const { return section_ < kSections && out_.array[section_]; }

  // What an element field's value at depth 3 goes into, by its key and type.
  std::optional<int64_t>* field_target_int() {
    if (depth_ != 3 || !in_section() || !element_.object) return nullptr;
    if (field_ == "id") return &element_.id;
    if (field_ == "image_id") return &element_.image_id;
    if (field_ == "category_id") return &element_.category_id;
    return nullptr;
  }
  std::optional<std::string>* field_target_string() {
    if (depth_ != 3 || !in_section() || !element_.object) return nullptr;
    if (field_ == "file_name") return &element_.file_name;
    if (field_ == "name") return &element_.name;
    return nullptr;
  }

  // Any value arriving at the current depth, before a container opens.
  void arrive(bool container, bool is_object) {
    if (depth_ == 0) out_.object = container && is_object;
    if (depth_ == 1 && section_ < kSections) out_.array[section_] = container && !is_object;
    if (depth_ == 2 && in_section()) {
      element_ = Element{};
      element_.object = container && is_object;
      if (!element_.object) out_.elements[section_].push_back(element_);
    }
  }
  bool integer(int64_t v) {
    if (field_target_int() != nullptr) *field_target_int() = v;
    return scalar();
  }
  bool scalar() {
    arrive(false, false);
    return true;
  }
  bool open(bool is_object) {
    arrive(true, is_object);
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    if (depth_ == 2 && in_section() && element_.object) {
      out_.elements[section_].push_back(std::move(element_));
      element_ = Element{};
    }
    if (depth_ == 1) section_ = kOther;
    return true;
  }

  Parsed& out_;
  bool samples_;
  int depth_ = 0;
  Section section_ = kOther;
  std::string field_;
  Element element_;
  std::string error_;
};

// Parses `file`: the three sections (`samples`) or the categories alone.
Parsed parse(const std::string& file, const std::string& option, bool samples) {
  const MappedFile mapped(file, option);
  Parsed out;
  CocoSax sax(out, samples);
  if (!json::sax_parse(mapped.begin(), mapped.end(), &sax)) refuse(option, file, sax.error());
  if (!out.object) {
    refuse(option, file,
           "is not a JSON object (a COCO file holds images, annotations, categories)");
  }
  return out;
}

// Checking one file's elements, each refusal naming the option and file.
struct Reader {
  const std::string& option;
  const std::string& file;

  [[noreturn]] void fail(const std::string& what) const { refuse(option, file, what); }

  const std::vector<Element>& section(const Parsed& p, Section s) const {
    if (!p.array[s]) {
      fail(std::string("no '") + kSectionKeys[s] +
           "' array (a COCO file holds images, annotations and categories)");
    }
    const std::vector<Element>& list = p.elements[s];
    static constexpr const char* kWhat[kSections] = {"image", "annotation", "category"};
    for (size_t i = 0; i < list.size(); ++i) {
      if (!list[i].object)
        fail(std::string(kWhat[s]) + " " + std::to_string(i) + " is not an object");
    }
    return list;
  }

  int64_t integer(const std::optional<int64_t>& v, const char* key, const std::string& what) const {
    if (!v) fail(what + ": '" + key + "' is missing or not an integer");
    return *v;
  }

  const std::string& text(const std::optional<std::string>& v, const char* key,
                          const std::string& what) const {
    if (!v || v->empty()) fail(what + ": '" + key + "' is missing, empty or not a string");
    return *v;
  }

  // The categories in ascending id.
  std::vector<CocoCategory> categories(const Parsed& p) const {
    const std::vector<Element>& list = section(p, kCategories);
    std::vector<CocoCategory> out;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string what = "category " + std::to_string(i);
      out.emplace_back(integer(list[i].id, "id", what), text(list[i].name, "name", what));
    }
    if (out.empty()) fail("lists no category");
    std::sort(out.begin(), out.end());
    for (size_t k = 1; k < out.size(); ++k) {
      if (out[k].first == out[k - 1].first) {
        fail("category id " + std::to_string(out[k].first) + " is given twice");
      }
    }
    return out;
  }
};

std::string named(const CocoCategory& c) {
  return "id " + std::to_string(c.first) + " '" + c.second + "'";
}

// Where `have` first differs from `want`, for a message.
std::string difference(const std::vector<CocoCategory>& want,
                       const std::vector<CocoCategory>& have) {
  for (size_t k = 0; k < want.size() && k < have.size(); ++k) {
    if (want[k] != have[k])
      return named(have[k]) + " where the training file has " + named(want[k]);
  }
  return std::to_string(have.size()) + " categories where the training file has " +
         std::to_string(want.size());
}

}  // namespace

std::vector<CocoCategory> read_coco_categories(const std::string& file, const std::string& option) {
  return Reader{option, file}.categories(parse(file, option, false));
}

ImageList read_coco(const std::string& file, const std::string& option, const std::string& images,
                    const CocoFormat& format, const std::vector<CocoCategory>& expected) {
  const Reader read{option, file};
  const Parsed doc = parse(file, option, true);
  const std::vector<CocoCategory> categories = read.categories(doc);
  if (!expected.empty() && categories != expected) {
    read.fail("its categories are not the training file's: " + difference(expected, categories));
  }
  std::unordered_map<int64_t, size_t> column;
  for (size_t k = 0; k < categories.size(); ++k) column[categories[k].first] = k;

  // Images in ascending id, as torchvision's CocoDetection takes them.
  const std::vector<Element>& image_list = read.section(doc, kImages);
  std::vector<std::pair<int64_t, const std::string*>> by_id;
  for (size_t i = 0; i < image_list.size(); ++i) {
    const std::string what = "image " + std::to_string(i);
    by_id.emplace_back(read.integer(image_list[i].id, "id", what),
                       &read.text(image_list[i].file_name, "file_name", what));
  }
  if (by_id.empty()) read.fail("lists no image");
  std::sort(by_id.begin(), by_id.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::unordered_map<int64_t, size_t> sample;
  for (size_t j = 0; j < by_id.size(); ++j) {
    if (!sample.emplace(by_id[j].first, j).second) {
      read.fail("image id " + std::to_string(by_id[j].first) + " is given twice");
    }
  }

  const size_t width = categories.size();
  std::vector<uint8_t> rows(by_id.size() * width, 0);
  std::vector<bool> annotated(by_id.size(), false);
  const std::vector<Element>& annotations = read.section(doc, kAnnotations);
  for (size_t a = 0; a < annotations.size(); ++a) {
    const std::string what = "annotation " + std::to_string(a);
    const int64_t image_id = read.integer(annotations[a].image_id, "image_id", what);
    const int64_t category_id = read.integer(annotations[a].category_id, "category_id", what);
    const auto j = sample.find(image_id);
    if (j == sample.end()) {
      read.fail(what + ": image_id " + std::to_string(image_id) + " is not among the images");
    }
    const auto k = column.find(category_id);
    if (k == column.end()) {
      read.fail(what + ": category_id " + std::to_string(category_id) +
                " is not among the categories");
    }
    rows[j->second * width + k->second] = 1;
    annotated[j->second] = true;
  }

  std::vector<std::string> paths;
  std::vector<uint8_t> kept;
  for (size_t j = 0; j < by_id.size(); ++j) {
    if (format.skip_unannotated && !annotated[j]) continue;
    paths.push_back(listed_path(file, images, *by_id[j].second));
    kept.insert(kept.end(), rows.begin() + static_cast<std::ptrdiff_t>(j * width),
                rows.begin() + static_cast<std::ptrdiff_t>((j + 1) * width));
  }
  if (paths.empty()) read.fail("no image has an annotation (option 'unannotated' is \"skip\")");
  std::vector<std::string> names;
  for (const CocoCategory& c : categories) names.push_back(c.second);
  return ImageList(std::move(names), std::move(paths), std::move(kept));
}

}  // namespace kiln::image_folder
