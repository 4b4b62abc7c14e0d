// The sample index of a COCO annotation file (instances_*.json, or any export in its format) as
// multi-label data: a sample per image, its row the categories of the image's annotations
// (crowd ones included, as pycocotools' getAnnIds). Samples in ascending image id, as
// torchvision's CocoDetection lists them; classes the categories in ascending id, named by their
// "name". The file is mapped and read by a SAX parser that keeps only these fields: a file's
// segmentations, boxes and captions are read past, not held.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "image_list.hpp"

namespace kiln::image_folder {

// A category: its id in the file and its name.
using CocoCategory = std::pair<int64_t, std::string>;

struct CocoFormat {
  bool skip_unannotated = false;  // leave out images no annotation names
};

// Reads `file` (`option` names the option it came from, for messages), image paths relative
// to `images` ("": the file's own folder). `expected`: the training file's categories, which a
// validation file must have too (same ids, same names), or empty. Throws kiln::Error
// (KILN_ERR_INVALID_ARGUMENT) naming the option and file for a file that cannot be read or
// parsed (with its line and column), a missing or mistyped key, a duplicate image or category
// id, an annotation of an image or category the file does not have, categories other than
// `expected`, or no image.
ImageList read_coco(const std::string& file, const std::string& option, const std::string& images,
                    const CocoFormat& format, const std::vector<CocoCategory>& expected);

// The categories of `file` in ascending id (the rest of the file is read past).
std::vector<CocoCategory> read_coco_categories(const std::string& file, const std::string& option);

}  // namespace kiln::image_folder
