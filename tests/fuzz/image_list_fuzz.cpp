// libFuzzer target: arbitrary bytes as an image_list dataset's CSV list through
// kiln::image_folder::ImageList::read (image_list.cpp over the CSV reader, csv.cpp): read as the
// training list (its classes from the list), again as the validation list with the training
// list's classes, and once more without a header and with "," between classes.
//
// Input: the list file as it is.
//
// A kiln::Error is the expected answer to a bad list. Anything else aborts, and so is a finding:
// another exception type (the CSV reader's own errors included), a sanitizer report, or an
// accepted list that breaks what read promises: a sample at least, no empty path, classes
// (taken from the list) sorted, unique and non-empty, rows of 0 and 1; and the validation read
// must accept what the training read accepted, with the same samples and rows.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_finding.hpp"
#include "fuzz_list_checks.hpp"
#include "fuzz_scratch.hpp"
#include "image_list.hpp"
#include "kiln/sdk.hpp"

namespace {

using kiln::fuzz::row;
using kiln::image_folder::ImageList;
using kiln::image_folder::ListFormat;

[[noreturn]] void finding(const std::string& what) { kiln::fuzz::finding("image_list_fuzz", what); }

const kiln::fuzz::Scratch& scratch() {
  static const kiln::fuzz::Scratch s("image_list_fuzz");
  return s;
}

// read, with a kiln::Error as false.
bool read(const std::string& file, const ListFormat& format,
          const std::vector<std::string>& classes, ImageList* out) {
  try {
    *out = ImageList::read(file, "list", "", format, classes);
    return true;
  } catch (const kiln::Error&) {
    return false;  // a rejected list: the expected outcome for most inputs
  } catch (const std::exception& e) {
    finding(std::string("ImageList::read threw a non-kiln::Error exception: ") + e.what());
  }
}

// What read promises of a list it accepted; `own_classes`: the classes came from the list.
void check(const ImageList& list, bool own_classes) {
  if (list.size() <= 0) finding("accepted a list of no sample");
  const std::vector<std::string>& classes = list.classes();
  if (own_classes) {
    if (classes.empty()) finding("accepted a list whose samples have no class");
    for (size_t k = 0; k < classes.size(); ++k) {
      if (classes[k].empty()) finding("accepted an empty class name");
      if (k > 0 && !(classes[k - 1] < classes[k])) finding("classes not sorted and unique");
    }
  }
  kiln::fuzz::check_samples(list, finding);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  scratch();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = scratch().write("list.csv", data, size);

  ImageList train;
  if (read(file, ListFormat{}, {}, &train)) {
    check(train, true);
    ImageList val;
    if (!read(file, ListFormat{}, train.classes(), &val)) {
      finding("the validation read refused the list the training read accepted");
    }
    check(val, false);
    if (val.classes() != train.classes() || val.size() != train.size()) {
      finding("the validation read gave other classes or samples");
    }
    for (int64_t i = 0; i < train.size(); ++i) {
      if (val.path(i) != train.path(i) || row(val, i) != row(train, i)) {
        finding("the validation read gave sample " + std::to_string(i) + " otherwise");
      }
    }
  } else {
    ImageList val;  // the refusals of a validation list: classes it may not use
    if (read(file, ListFormat{}, {"a", "b"}, &val)) check(val, false);
  }

  ListFormat bare;
  bare.separator = ",";
  bare.header = false;
  ImageList other;
  if (read(file, bare, {}, &other)) check(other, true);
  return 0;
}
