#include "coco.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

using json = nlohmann::json;

[[noreturn]] void refuse(const std::string& option, const std::string& file,
                         const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, "coco: option '" + option + "': " + file + ": " + what);
}

// What a file is parsed for: the keys whose values are kept (at any depth).
const std::vector<std::string> kSampleKeys = {"images",    "annotations", "categories",  "id",
                                              "file_name", "image_id",    "category_id", "name"};
const std::vector<std::string> kCategoryKeys = {"categories", "id", "name"};

// Parses `file` keeping only the values under `keep`'s keys: the rest (segmentation polygons,
// boxes, captions, licences: most of a COCO file) is read past without being stored.
json parse_keeping(const std::string& file, const std::string& option,
                   const std::vector<std::string>& keep) {
  std::ifstream in(file, std::ios::binary);
  if (!in) refuse(option, file, "cannot open");
  const json::parser_callback_t filter = [&keep](int, json::parse_event_t event, json& parsed) {
    if (event != json::parse_event_t::key) return true;
    return std::find(keep.begin(), keep.end(), parsed.get_ref<const std::string&>()) != keep.end();
  };
  json doc;
  try {
    doc = json::parse(in, filter);
  } catch (const json::parse_error& e) {
    // e.what() is "[json.exception.parse_error.101] parse error at line L, column C: ...".
    const std::string what = e.what();
    const size_t start = what.find("] ");
    refuse(option, file, start == std::string::npos ? what : what.substr(start + 2));
  }
  if (!doc.is_object()) {
    refuse(option, file,
           "is not a JSON object (a COCO file holds images, annotations, categories)");
  }
  return doc;
}

// Reading one file's values, each refusal naming the option and file.
struct Reader {
  const std::string& option;
  const std::string& file;

  [[noreturn]] void fail(const std::string& what) const { refuse(option, file, what); }

  const json& array(const json& doc, const char* key) const {
    const auto it = doc.find(key);
    if (it == doc.end() || !it->is_array()) {
      fail(std::string("no '") + key +
           "' array (a COCO file holds images, annotations and "
           "categories)");
    }
    return *it;
  }

  const json& object(const json& list, size_t i, const std::string& what) const {
    if (!list[i].is_object()) fail(what + " " + std::to_string(i) + " is not an object");
    return list[i];
  }

  int64_t integer(const json& o, const char* key, const std::string& what) const {
    const auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer()) {
      fail(what + ": '" + key + "' is missing or not an integer");
    }
    return it->get<int64_t>();
  }

  const std::string& text(const json& o, const char* key, const std::string& what) const {
    const auto it = o.find(key);
    if (it == o.end() || !it->is_string() || it->get_ref<const std::string&>().empty()) {
      fail(what + ": '" + key + "' is missing, empty or not a string");
    }
    return it->get_ref<const std::string&>();
  }

  // The categories in ascending id.
  std::vector<CocoCategory> categories(const json& doc) const {
    const json& list = array(doc, "categories");
    std::vector<CocoCategory> out;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string what = "category " + std::to_string(i);
      const json& c = object(list, i, "category");
      out.emplace_back(integer(c, "id", what), text(c, "name", what));
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
  return Reader{option, file}.categories(parse_keeping(file, option, kCategoryKeys));
}

ImageList read_coco(const std::string& file, const std::string& option, const std::string& images,
                    const CocoFormat& format, const std::vector<CocoCategory>& expected) {
  const Reader read{option, file};
  const json doc = parse_keeping(file, option, kSampleKeys);
  const std::vector<CocoCategory> categories = read.categories(doc);
  if (!expected.empty() && categories != expected) {
    read.fail("its categories are not the training file's: " + difference(expected, categories));
  }
  std::unordered_map<int64_t, size_t> column;
  for (size_t k = 0; k < categories.size(); ++k) column[categories[k].first] = k;

  // Images in ascending id, as torchvision's CocoDetection takes them.
  const json& image_list = read.array(doc, "images");
  std::vector<std::pair<int64_t, const std::string*>> by_id;
  for (size_t i = 0; i < image_list.size(); ++i) {
    const std::string what = "image " + std::to_string(i);
    const json& image = read.object(image_list, i, "image");
    by_id.emplace_back(read.integer(image, "id", what), &read.text(image, "file_name", what));
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
  const json& annotations = read.array(doc, "annotations");
  for (size_t a = 0; a < annotations.size(); ++a) {
    const std::string what = "annotation " + std::to_string(a);
    const json& annotation = read.object(annotations, a, "annotation");
    const int64_t image_id = read.integer(annotation, "image_id", what);
    const int64_t category_id = read.integer(annotation, "category_id", what);
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
