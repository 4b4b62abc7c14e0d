// What both list readers (image_list's CSV, coco's JSON) promise of every sample of a list they
// accept: a path, and a row of 0 and 1 over the list's classes. Shared by their fuzz targets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image_list.hpp"

namespace kiln::fuzz {

// Sample i's row.
inline std::vector<float> row(const image_folder::ImageList& list, int64_t i) {
  std::vector<float> out(list.classes().size());
  list.row(i, out.data());
  return out;
}

// Calls `finding` (which does not return) for the first sample that breaks the promise.
template <typename Finding>
void check_samples(const image_folder::ImageList& list, Finding&& finding) {
  for (int64_t i = 0; i < list.size(); ++i) {
    if (list.path(i).empty()) finding("accepted an empty path");
    for (const float v : row(list, i)) {
      if (v != 0.0F && v != 1.0F) finding("a row value of " + std::to_string(v));
    }
  }
}

}  // namespace kiln::fuzz
