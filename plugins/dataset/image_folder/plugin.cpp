// kiln_image_folder — the "image_folder" dataset: torchvision's ImageFolder (root/<class>/<image>,
// classes the sorted sub-folder names, labels 0..C-1, samples class by class in sorted order),
// the "image_list" dataset: images a CSV file lists with their classes (multi-label data,
// ABI 1.10; image_list.hpp), and the "coco" dataset: the images of a COCO annotation file with
// the categories of their annotations (multi-label; coco.hpp). All decode JPEG and PNG as PIL
// decodes them (Image.open(path).convert("RGB") or "L").
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coco.hpp"
#include "image.hpp"
#include "image_list.hpp"
#include "index.hpp"
#include "kiln/dataset.h"
#include "kiln/sdk.hpp"

namespace kiln::image_folder {
namespace {

constexpr const char* kName = "image_folder";
constexpr const char* kList = "image_list";
constexpr const char* kCoco = "coco";
// torchvision's IMG_EXTENSIONS: files with these endings that the options leave out are counted
// and reported, since ImageFolder would have taken them.
const std::vector<std::string> kImageExtensions = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                   ".pgm", ".tif",  ".tiff", ".webp"};

// The host of the latest create, for statuses of calls that come without an instance.
std::atomic<const kiln_host_api*> g_host{nullptr};

// One split of either component: class folders (index) or a list (listed, list).
struct Dataset {
  const kiln_host_api* host = nullptr;
  Index index;
  bool listed = false;
  ImageList list;
  int channels = 3;
  uint64_t max_pixels = 0;               // kiln_dataset_open.max_pixels (0: none, or a 1.12 host)
  std::vector<const char*> class_names;  // into classes()

  int64_t size() const { return listed ? list.size() : index.size(); }
  std::string path(int64_t i) const { return listed ? list.path(i) : index.path(i); }
  // A list's samples have rows; their label is 0 (ABI 1.10: in range, unused).
  int64_t label(int64_t i) const { return listed ? 0 : index.label(i); }
  const std::vector<std::string>& classes() const {
    return listed ? list.classes() : index.classes();
  }
};

[[noreturn]] void refuse_as(const char* component, const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, std::string(component) + ": " + what);
}

[[noreturn]] void refuse(const std::string& what) { refuse_as(kName, what); }

std::string string_option(const kiln_options* options, const char* name, const char* fallback) {
  const kiln_option_value* v = find_option(options, name, KILN_OPT_STRING, kName);
  return v != nullptr && v->string_value != nullptr ? v->string_value : fallback;
}

std::vector<std::string> extensions_option(const kiln_options* options) {
  const kiln_option_value* v = find_option(options, "extensions", KILN_OPT_STRING_LIST, kName);
  if (v == nullptr) return {".jpg", ".jpeg", ".png"};
  std::vector<std::string> out;
  for (size_t i = 0; i < v->list_length; ++i) {
    std::string e = v->string_list[i] != nullptr ? v->string_list[i] : "";
    // Matching ignores case, as torchvision lower-cases the file name (not the extensions).
    for (char& c : e) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    if (e.size() < 2 || e[0] != '.') {
      refuse("option 'extensions': '" + e + "' is not an extension (\".jpg\")");
    }
    if (!decodable_extension(e)) {
      refuse("option 'extensions': '" + e +
             "' files cannot be decoded (JPEG and PNG only: .jpg, .jpeg, .jpe, .jfif, .png)");
    }
    out.push_back(e);
  }
  if (out.empty()) refuse("option 'extensions' is empty");
  return out;
}

std::string names(const std::vector<std::string>& list) {
  std::string out;
  for (size_t i = 0; i < list.size() && i < 10; ++i) out += (i ? ", '" : "'") + list[i] + "'";
  if (list.size() > 10) out += " and " + std::to_string(list.size() - 10) + " more";
  return out;
}

// How many images from the start of a split are tried for its first readable one.
constexpr int64_t kFirstTries = 64;

// The paths of samples 0, 1, ... of `count` (kFirstTries at most).
template <typename Path>
std::vector<std::string> first_paths(int64_t count, Path path) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < count && i < kFirstTries; ++i) out.push_back(path(i));
  return out;
}

// The header of the first of `paths` (a split's first, first_paths) that can be read. One
// that cannot, sorted first, is the loader's to stop at or skip (data.on_error) like any other;
// when none can, the folder or list is wrong: refused naming `option` and the first's fault.
Header first_header(const char* component, const std::string& option,
                    const std::vector<std::string>& paths) {
  std::string first_error;
  for (const std::string& path : paths) {
    try {
      return probe_image(path);
    } catch (const Error& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  refuse_as(component,
            "option '" + option + "': cannot read the first image" +
                (paths.size() > 1 ? " nor the next " + std::to_string(paths.size() - 1) : "") +
                ": " + first_error);
}

// val_root's classes must be root's: a label means the same class in both splits.
void check_same_classes(const std::string& root, const std::vector<std::string>& train,
                        const std::string& val_root, const std::vector<std::string>& val) {
  std::vector<std::string> missing, extra;
  std::set_difference(train.begin(), train.end(), val.begin(), val.end(),
                      std::back_inserter(missing));
  std::set_difference(val.begin(), val.end(), train.begin(), train.end(),
                      std::back_inserter(extra));
  if (missing.empty() && extra.empty()) return;
  std::string what = "option 'val_root': the class folders of '" + val_root +
                     "' differ from those of option 'root' ('" + root + "'):";
  if (!missing.empty()) what += " missing " + names(missing) + (extra.empty() ? "" : ";");
  if (!extra.empty()) what += " not in root " + names(extra);
  refuse(what);
}

// Writes `full` into the caller's struct, only the fields inside its struct_size.
template <typename T>
void write_out(T* out, const T& full, size_t v1_size, const char* what) {
  if (out == nullptr || out->struct_size < v1_size) {
    refuse(std::string(what) + ": the output is NULL or smaller than its version 1");
  }
  const size_t keep = out->struct_size;
  std::memcpy(static_cast<void*>(out), &full, std::min(keep, sizeof(T)));
  out->struct_size = keep;
}

Dataset& instance_of(void* instance) {
  if (instance == nullptr) refuse("NULL instance");
  return *static_cast<Dataset*>(instance);
}

void check_index(const Dataset& d, int64_t index) {
  if (index < 0 || index >= d.size()) {
    refuse("sample " + std::to_string(index) + " is outside 0.." + std::to_string(d.size() - 1));
  }
}

const kiln_host_api* host_of(void* instance) {
  return instance != nullptr ? static_cast<Dataset*>(instance)->host : g_host.load();
}

// A host that passes no services table breaks the contract, and no status can be made without
// one: nothing is reported (create leaves *out NULL).
kiln_status* no_host_status() { return nullptr; }

// What create does for both components: the contract's checks of its arguments, then `make`
// opens the split (throwing kiln::Error), and the class names are taken from what it opened.
template <typename Make>
kiln_status* create_with(const kiln_host_api* host, const kiln_dataset_open* open, void** out,
                         Make make) {
  if (host == nullptr) {
    if (out != nullptr) *out = nullptr;
    return no_host_status();
  }
  g_host.store(host);
  return KILN_GUARD(host, {
    if (out == nullptr) refuse("create: NULL out");
    *out = nullptr;
    if (open == nullptr || open->struct_size < KILN_SIZE_UP_TO(kiln_dataset_open, reserved)) {
      refuse("create: kiln_dataset_open is NULL or smaller than its version 1");
    }
    if (open->split != KILN_SPLIT_TRAIN && open->split != KILN_SPLIT_VAL) {
      refuse("create: unknown split " + std::to_string(open->split));
    }
    std::unique_ptr<Dataset> d = make(*open);
    d->host = host;
    if (KILN_HAS_FIELD(open, kiln_dataset_open, max_pixels)) d->max_pixels = open->max_pixels;
    for (const std::string& c : d->classes()) d->class_names.push_back(c.c_str());
    *out = d.release();
  });
}

// image_folder: the split's class folders, as torchvision's ImageFolder lists them.
std::unique_ptr<Dataset> open_folder(const kiln_host_api* host, const kiln_options* options,
                                     const kiln_dataset_open& open) {
  const std::string root = string_option(options, "root", "");
  const std::string val_root = string_option(options, "val_root", "");
  const std::string color = string_option(options, "color", "rgb");
  const std::vector<std::string> extensions = extensions_option(options);
  if (root.empty())
    refuse("option 'root' is empty: name the training folder (root/<class>/<image>)");
  if (color != "rgb" && color != "gray" && color != "auto") {
    refuse("option 'color': '" + color + "' is not one of rgb, gray, auto");
  }
  const bool val = open.split == KILN_SPLIT_VAL;
  if (val && val_root.empty()) {
    refuse("option 'val_root' is empty: the dataset has no validation split");
  }
  const std::vector<std::string> classes = list_classes(root, "root");
  if (!val_root.empty())
    check_same_classes(root, classes, val_root, list_classes(val_root, "val_root"));

  std::vector<std::string> ignored;
  for (const std::string& e : kImageExtensions) {
    if (std::find(extensions.begin(), extensions.end(), e) == extensions.end()) {
      ignored.push_back(e);
    }
  }
  auto d = std::make_unique<Dataset>();
  int64_t skipped = 0;
  std::vector<std::string> cycles;
  d->index = val ? Index::build(val_root, "val_root", extensions, ignored, &skipped, &cycles)
                 : Index::build(root, "root", extensions, ignored, &skipped, &cycles);
  if (!cycles.empty() && host->log != nullptr) {
    const std::string message = "did not follow " + std::to_string(cycles.size()) +
                                " folder link(s) that lead back to the root or above it (a " +
                                "cycle: its images would be listed again under another " +
                                "class): " + names(cycles);
    host->log(KILN_LOG_WARN, kName, message.c_str());
  }
  if (skipped > 0 && host->log != nullptr) {
    const std::string message = "left out " + std::to_string(skipped) + " image file(s) of '" +
                                (val ? val_root : root) +
                                "' whose extension option 'extensions' does not list "
                                "(torchvision's ImageFolder would take them)";
    host->log(KILN_LOG_WARN, kName, message.c_str());
  }
  if (color == "auto") {
    // Both splits follow the training folder's first readable image, so they agree.
    const std::vector<std::string> first =
        val ? first_samples(root, classes, extensions, kFirstTries)
            : first_paths(d->index.size(), [&](int64_t i) { return d->index.path(i); });
    if (first.empty()) refuse("option 'root': '" + root + "/" + classes[0] + "' holds no image");
    d->channels = first_header(kName, "root", first).channels;
  } else {
    d->channels = color == "gray" ? 1 : 3;
  }
  return d;
}

kiln_status* create(const kiln_host_api* host, const kiln_options* options,
                    const kiln_dataset_open* open, void** out) {
  return create_with(host, open, out,
                     [&](const kiln_dataset_open& o) { return open_folder(host, options, o); });
}

bool bool_option(const kiln_options* options, const char* name, bool fallback) {
  const kiln_option_value* v = find_option(options, name, KILN_OPT_BOOL, kName);
  return v != nullptr ? v->bool_value != 0 : fallback;
}

// What image_list and coco check first: rows need the targets slot (an older host would train
// on the labels alone), `train` names a file, `color` is known, and a validation split has its
// file. Returns the options' train, val and color.
struct ListedOptions {
  std::string train, val, color;
};
ListedOptions listed_options(const char* component, const kiln_host_api* host,
                             const kiln_options* options, const kiln_dataset_open& open,
                             const char* train_is) {
  if (host->abi_minor < 10) {
    const std::string minor = std::to_string(host->abi_minor);
    refuse_as(component,
              "multi-label targets need a Kiln host of ABI 1.10 or later; this one is 1." + minor);
  }
  ListedOptions o{string_option(options, "train", ""), string_option(options, "val", ""),
                  string_option(options, "color", "rgb")};
  if (o.train.empty()) refuse_as(component, std::string("option 'train' is empty: ") + train_is);
  if (o.color != "rgb" && o.color != "gray" && o.color != "auto") {
    refuse_as(component, "option 'color': '" + o.color + "' is not one of rgb, gray, auto");
  }
  if (open.split == KILN_SPLIT_VAL && o.val.empty()) {
    refuse_as(component, "option 'val' is empty: the dataset has no validation split");
  }
  return o;
}

// The channels of a listed split, after its first readable image: a wrong image folder shows
// there, before the run, named by `folder_option`.
void probe_first(const char* component, Dataset& d, const std::string& color,
                 const std::string& folder_option) {
  const Header h =
      first_header(component, folder_option,
                   first_paths(d.list.size(), [&](int64_t i) { return d.list.path(i); }));
  d.channels = color == "auto" ? h.channels : color == "gray" ? 1 : 3;
}

// image_list: the split's CSV, paths relative to `root` (or to the list's folder); the classes
// those of the training list, so that a column means the same class in both splits.
std::unique_ptr<Dataset> open_list(const kiln_host_api* host, const kiln_options* options,
                                   const kiln_dataset_open& open) {
  const ListedOptions o =
      listed_options(kList, host, options, open, "name the training list (path,classes)");
  const std::string root = string_option(options, "root", "");
  ListFormat format;
  format.separator = string_option(options, "separator", " ");
  format.header = bool_option(options, "header", true);
  const bool is_val = open.split == KILN_SPLIT_VAL;
  auto d = std::make_unique<Dataset>();
  d->listed = true;
  d->list = ImageList::read(o.train, "train", root, format, {});
  if (is_val) d->list = ImageList::read(o.val, "val", root, format, d->list.classes());
  probe_first(kList, *d, o.color, root.empty() ? (is_val ? "val" : "train") : "root");
  return d;
}

// coco: the split's annotation file, image paths relative to its images option (or to the
// file's folder); a validation file must have the training file's categories.
std::unique_ptr<Dataset> open_coco(const kiln_host_api* host, const kiln_options* options,
                                   const kiln_dataset_open& open) {
  const ListedOptions o = listed_options(kCoco, host, options, open,
                                         "name the training annotation file (instances_*.json)");
  const std::string unannotated = string_option(options, "unannotated", "keep");
  if (unannotated != "keep" && unannotated != "skip") {
    refuse_as(kCoco, "option 'unannotated': '" + unannotated + "' is not one of keep, skip");
  }
  CocoFormat format;
  format.skip_unannotated = unannotated == "skip";
  const bool is_val = open.split == KILN_SPLIT_VAL;
  const std::string images = string_option(options, is_val ? "val_images" : "train_images", "");
  auto d = std::make_unique<Dataset>();
  d->listed = true;
  d->list = is_val ? read_coco(o.val, "val", images, format, read_coco_categories(o.train, "train"))
                   : read_coco(o.train, "train", images, format, {});
  const std::string file_option = is_val ? "val" : "train";
  probe_first(kCoco, *d, o.color, images.empty() ? file_option : file_option + "_images");
  return d;
}

kiln_status* create_coco(const kiln_host_api* host, const kiln_options* options,
                         const kiln_dataset_open* open, void** out) {
  return create_with(host, open, out,
                     [&](const kiln_dataset_open& o) { return open_coco(host, options, o); });
}

kiln_status* create_list(const kiln_host_api* host, const kiln_options* options,
                         const kiln_dataset_open* open, void** out) {
  return create_with(host, open, out,
                     [&](const kiln_dataset_open& o) { return open_list(host, options, o); });
}

void destroy(void* instance) { delete static_cast<Dataset*>(instance); }

kiln_status* info(void* instance, kiln_dataset_info* out) {
  const kiln_host_api* host = host_of(instance);
  if (host == nullptr) return no_host_status();
  return KILN_GUARD(host, {
    const Dataset& d = instance_of(instance);
    kiln_dataset_info full{};
    full.struct_size = sizeof full;
    full.num_samples = d.size();
    full.num_classes = static_cast<int64_t>(d.classes().size());
    full.channels = d.channels;
    full.height = 0;  // sizes differ; probe gives each
    full.width = 0;
    full.class_names = d.class_names.data();
    full.target_kind = d.listed ? KILN_TARGET_MULTI_LABEL : KILN_TARGET_CLASS;
    write_out(out, full, KILN_SIZE_UP_TO(kiln_dataset_info, class_names), "info");
  });
}

kiln_status* probe(void* instance, int64_t index, kiln_sample_header* out) {
  const kiln_host_api* host = host_of(instance);
  if (host == nullptr) return no_host_status();
  return KILN_GUARD(host, {
    const Dataset& d = instance_of(instance);
    check_index(d, index);
    const std::string path = d.path(index);
    const Header h = probe_image(path);
    check_pixels(path, h.height, h.width, d.max_pixels);
    kiln_sample_header full{};
    full.struct_size = sizeof full;
    full.height = h.height;
    full.width = h.width;
    full.label = d.label(index);
    write_out(out, full, KILN_SIZE_UP_TO(kiln_sample_header, label), "probe");
  });
}

kiln_status* decode(void* instance, int64_t index, const kiln_decode_request* request,
                    kiln_decoded_sample* out) {
  const kiln_host_api* host = host_of(instance);
  if (host == nullptr) return no_host_status();
  return KILN_GUARD(host, {
    const Dataset& d = instance_of(instance);
    check_index(d, index);
    if (request == nullptr ||
        request->struct_size < KILN_SIZE_UP_TO(kiln_decode_request, capacity)) {
      refuse("decode: the request is NULL or smaller than its version 1");
    }
    const int s = request->scale_denom;
    if (s != 1 && s != 2 && s != 4 && s != 8) {
      refuse("decode: scale_denom " + std::to_string(s) + " is not 1, 2, 4 or 8");
    }
    if (request->pixels == nullptr) refuse("decode: NULL pixels");
    if (out == nullptr || out->struct_size < KILN_SIZE_UP_TO(kiln_decoded_sample, reserved)) {
      refuse("decode: the output is NULL or smaller than its version 1");
    }
    const Decoded r = decode_image(d.path(index), s, d.channels, request->pixels, request->capacity,
                                   d.max_pixels);
    kiln_decoded_sample full{};
    full.struct_size = sizeof full;
    full.height = r.height;
    full.width = r.width;
    full.label = d.label(index);
    full.scale = r.scale;
    write_out(out, full, KILN_SIZE_UP_TO(kiln_decoded_sample, reserved), "decode");
  });
}

kiln_status* targets(void* instance, int64_t index, float* out, int64_t count) {
  const kiln_host_api* host = host_of(instance);
  if (host == nullptr) return no_host_status();
  return KILN_GUARD(host, {
    const Dataset& d = instance_of(instance);
    check_index(d, index);
    if (!d.listed) refuse("targets: image_folder has one class per sample");
    if (out == nullptr || count != static_cast<int64_t>(d.classes().size())) {
      refuse("targets: a row of " + std::to_string(count) + " values; the list has " +
             std::to_string(d.classes().size()) + " classes");
    }
    d.list.row(index, out);
  });
}

// ABI 1.13: a sample is named by its file in the host's messages.
kiln_status* sample_name(void* instance, int64_t index, char* out, size_t capacity) {
  const kiln_host_api* host = host_of(instance);
  if (host == nullptr) return no_host_status();
  return KILN_GUARD(host, {
    const Dataset& d = instance_of(instance);
    check_index(d, index);
    if (out == nullptr || capacity == 0) refuse("sample_name: no room for the name");
    const std::string path = d.path(index);
    const size_t n = std::min(path.size(), capacity - 1);
    std::memcpy(out, path.data(), n);
    out[n] = '\0';
  });
}

const kiln_dataset_vtable kVtable =
    KILN_DATASET_VTABLE_NAMED_INIT(create, destroy, info, probe, decode, nullptr, sample_name);
const kiln_dataset_vtable kListVtable =
    KILN_DATASET_VTABLE_NAMED_INIT(create_list, destroy, info, probe, decode, targets, sample_name);

const kiln_option_spec kOptions[] = {
    KILN_OPTION_INIT("root", KILN_OPT_STRING, nullptr,
                     "the training folder: root/<class>/<image>, classes the sorted sub-folder "
                     "names (labels 0..C-1), images found in sub-folders too (torchvision's "
                     "ImageFolder)"),
    KILN_OPTION_INIT("val_root", KILN_OPT_STRING, "\"\"",
                     "the validation folder, with the same class folders as root; empty: none"),
    KILN_OPTION_CHOICES_INIT("color", "rgb,gray,auto", "\"rgb\"",
                             "channels decoded: rgb (3; gray images expanded, PIL's "
                             "convert(\"RGB\")), gray (1; PIL's convert(\"L\")), auto (those of "
                             "root's first image)"),
    KILN_OPTION_INIT("extensions", KILN_OPT_STRING_LIST, "[\".jpg\", \".jpeg\", \".png\"]",
                     "file name endings taken as images, case-insensitive (JPEG and PNG files: "
                     ".jpg, .jpeg, .jpe, .jfif, .png)"),
};

const kiln_option_spec kListOptions[] = {
    KILN_OPTION_INIT("train", KILN_OPT_STRING, nullptr,
                     "CSV file of the training split: a record per image, path,classes (classes "
                     "split by separator; none is allowed; a field in double quotes may hold "
                     "commas), the first record a header unless header = false; classes are the "
                     "sorted names it uses"),
    KILN_OPTION_INIT("val", KILN_OPT_STRING, "\"\"",
                     "CSV file of the validation split, as train, classes among train's; empty: "
                     "none"),
    KILN_OPTION_INIT("root", KILN_OPT_STRING, "\"\"",
                     "folder the listed paths are relative to; empty: each list's own folder"),
    KILN_OPTION_INIT("separator", KILN_OPT_STRING, "\" \"", "between an image's classes"),
    KILN_OPTION_INIT("header", KILN_OPT_BOOL, "true", "the lists' first line names the columns"),
    KILN_OPTION_CHOICES_INIT("color", "rgb,gray,auto", "\"rgb\"",
                             "channels decoded: rgb (3), gray (1), auto (those of the first "
                             "listed image), as image_folder's"),
};

const kiln_dataset_vtable kCocoVtable =
    KILN_DATASET_VTABLE_NAMED_INIT(create_coco, destroy, info, probe, decode, targets, sample_name);

const kiln_option_spec kCocoOptions[] = {
    KILN_OPTION_INIT("train", KILN_OPT_STRING, nullptr,
                     "COCO annotation file of the training split (instances_train2017.json or an "
                     "export in its format): a sample per image in ascending id, its classes "
                     "those of its annotations; classes are the categories in ascending id"),
    KILN_OPTION_INIT("val", KILN_OPT_STRING, "\"\"",
                     "COCO annotation file of the validation split, with train's categories; "
                     "empty: none"),
    KILN_OPTION_INIT(
        "train_images", KILN_OPT_STRING, "\"\"",
        "folder train's file_name paths are relative to; empty: the file's own folder"),
    KILN_OPTION_INIT("val_images", KILN_OPT_STRING, "\"\"",
                     "folder val's file_name paths are relative to; empty: the file's own folder"),
    KILN_OPTION_CHOICES_INIT("unannotated", "keep,skip", "\"keep\"",
                             "images no annotation names: keep (a row of zeros, as torchvision's "
                             "CocoDetection lists every image) or skip"),
    KILN_OPTION_CHOICES_INIT("color", "rgb,gray,auto", "\"rgb\"",
                             "channels decoded: rgb (3), gray (1), auto (those of the first "
                             "image), as image_folder's"),
};

const kiln_capabilities kCapabilities = KILN_CAPABILITIES_INIT(KILN_CAP_DEVICE_CPU);

const kiln_component_descriptor kComponent =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, "image_folder", KILN_VERSION_INIT(1, 0, 0),
                                "images in class folders (torchvision's ImageFolder), JPEG and PNG",
                                &kCapabilities, kOptions, &kVtable);

const kiln_component_descriptor kListComponent = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_DATASET, "image_list", KILN_VERSION_INIT(1, 0, 0),
    "images a CSV lists with their classes, several per image (multi-label), JPEG and PNG",
    &kCapabilities, kListOptions, &kListVtable);

const kiln_component_descriptor kCocoComponent = KILN_COMPONENT_OPTIONS_INIT(
    KILN_COMPONENT_DATASET, "coco", KILN_VERSION_INIT(1, 0, 0),
    "images a COCO annotation file lists, classes those of their annotations (multi-label), JPEG "
    "and PNG",
    &kCapabilities, kCocoOptions, &kCocoVtable);

const kiln_component_descriptor* const kComponents[] = {&kComponent, &kListComponent,
                                                        &kCocoComponent};

const kiln_plugin_descriptor kDescriptor = KILN_PLUGIN_DESCRIPTOR_INIT(
    "kiln-image-folder", KILN_VERSION_INIT(1, 0, 0), kComponents, nullptr);

}  // namespace
}  // namespace kiln::image_folder

KILN_DEFINE_PLUGIN_PROBE()

const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kiln::image_folder::kDescriptor; }
