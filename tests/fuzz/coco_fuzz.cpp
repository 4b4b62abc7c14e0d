// libFuzzer target: arbitrary bytes as a COCO annotation file through the coco dataset's reader
// (plugins/dataset/image_folder/coco.cpp, nlohmann's SAX parser): read_coco_categories, then
// read_coco as the training file (every image), then as the validation file with the training
// file's categories and the unannotated images skipped.
//
// Input: the annotation file as it is.
//
// A kiln::Error is the expected answer to a bad file. Anything else aborts, and so is a finding:
// another exception type, a sanitizer report, or an accepted file that breaks what the reader
// promises: categories of unique ascending ids and non-empty names, the same ones read_coco
// names its classes; a sample at least, no empty path, rows of 0 and 1; the validation read
// keeping exactly the samples with a class, in order, and refusing other categories.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "coco.hpp"
#include "fuzz_finding.hpp"
#include "fuzz_list_checks.hpp"
#include "fuzz_scratch.hpp"
#include "kiln/sdk.hpp"

namespace {

using kiln::fuzz::row;
using kiln::image_folder::CocoCategory;
using kiln::image_folder::CocoFormat;
using kiln::image_folder::ImageList;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("coco_fuzz", what); }

const kiln::fuzz::Scratch& scratch() {
  static const kiln::fuzz::Scratch s("coco_fuzz");
  return s;
}

// read_coco, with a kiln::Error as false.
bool read(const std::string& file, bool skip_unannotated, const std::vector<CocoCategory>& expected,
          ImageList* out) {
  CocoFormat format;
  format.skip_unannotated = skip_unannotated;
  try {
    *out = kiln::image_folder::read_coco(file, "annotations", "", format, expected);
    return true;
  } catch (const kiln::Error&) {
    return false;  // a rejected file: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("read_coco threw a non-kiln::Error exception: ") + e.what());
  }
}

bool any(const std::vector<float>& r) {
  for (const float v : r) {
    if (v != 0.0F) return true;
  }
  return false;
}

void check(const ImageList& list, const std::vector<CocoCategory>& categories) {
  std::vector<std::string> names;
  for (const CocoCategory& c : categories) names.push_back(c.second);
  if (list.classes() != names) finding("read_coco's classes are not its categories' names");
  if (list.size() <= 0) finding("accepted a file of no sample");
  kiln::fuzz::check_samples(list, finding);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = scratch().write("annotations.json", data, size);

  std::vector<CocoCategory> categories;
  bool have_categories = false;
  try {
    categories = kiln::image_folder::read_coco_categories(file, "annotations");
    have_categories = true;
  } catch (const kiln::Error&) {
  } catch (const std::exception& e) {
    finding(std::string("read_coco_categories threw a non-kiln::Error exception: ") + e.what());
  }
  if (have_categories) {
    if (categories.empty()) finding("accepted no category");
    for (size_t k = 0; k < categories.size(); ++k) {
      if (categories[k].second.empty()) finding("accepted an empty category name");
      if (k > 0 && categories[k - 1].first >= categories[k].first) {
        finding("categories not in ascending, unique ids");
      }
    }
  }

  ImageList train;
  if (!read(file, false, {}, &train)) return 0;
  // read_coco reads the categories as read_coco_categories does, and the rest besides.
  if (!have_categories) finding("read_coco accepted a file read_coco_categories refused");
  check(train, categories);

  int64_t annotated = 0;
  for (int64_t i = 0; i < train.size(); ++i) annotated += any(row(train, i)) ? 1 : 0;
  ImageList val;
  if (!read(file, true, categories, &val)) {
    if (annotated > 0) finding("the validation read refused a file with annotated images");
    return 0;
  }
  check(val, categories);
  if (val.size() != annotated)
    finding("the validation read kept other samples than those annotated");
  int64_t j = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    if (!any(row(train, i))) continue;
    if (val.path(j) != train.path(i) || row(val, j) != row(train, i)) {
      finding("the validation read gave sample " + std::to_string(i) + " otherwise");
    }
    ++j;
  }

  // Categories other than the training file's: one name changed.
  std::vector<CocoCategory> other = categories;
  other.back().second += "x";
  if (read(file, false, other, &val)) finding("accepted categories other than the training file's");
  return 0;
}
