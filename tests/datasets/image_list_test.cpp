// The image_list dataset (multi-label images listed in a CSV, ABI 1.10) through its vtable: the
// image_folder oracle's training images (tests/oracle/image_folder.py: pixels as PIL decodes
// them) listed in reverse order with several classes each; every sample decodes to PIL's pixels
// and carries the row its line names. And its refusals, which name the option, the file and the
// line.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "image_folder_harness.hpp"
#include "scratch.hpp"

namespace {

using kiln::dataset_test::oracle;
using kiln::test::describe;
using kiln::test::Options;
using kiln::test::Status;
using json = nlohmann::json;

const kiln_dataset_vtable& vtable() {
  return *static_cast<const kiln_dataset_vtable*>(
      kiln::test::component_vtable("kiln_image_folder", "image_list"));
}

// Sample k of a list names the classes of the bits of (k + 1) % 8 over these (0: none).
const std::vector<std::string> kClasses = {"sky", "cat", "dog"};  // sorted: cat, dog, sky

std::vector<std::string> classes_of(size_t k) {
  std::vector<std::string> out;
  for (size_t b = 0; b < kClasses.size(); ++b) {
    if ((((k + 1) % 8) >> b) & 1) out.push_back(kClasses[b]);
  }
  return out;
}

struct List {
  void* instance = nullptr;
  Status status;
  ~List() { vtable().destroy(instance); }
};

// Opens image_list with `options` for `split`, on a host of ABI 1.`minor`.
std::unique_ptr<List> open(Options options, int32_t split = KILN_SPLIT_TRAIN,
                           uint32_t minor = KILN_ABI_MINOR) {
  static kiln_host_api host = kiln::test::status_only_host();
  host.abi_minor = minor;
  auto list = std::make_unique<List>();
  const kiln_dataset_open open{sizeof(kiln_dataset_open), split, 0, 0, 89478485};
  list->status = Status(vtable().create(&host, options.get(), &open, &list->instance));
  return list;
}

Options options(const std::string& train, const std::string& root = "", const std::string& val = "",
                const std::string& separator = " ", bool header = true) {
  Options o;
  o.set_string("train", train)
      .set_string("val", val)
      .set_string("root", root)
      .set_string("separator", separator)
      .set_bool("header", header)
      .set_string("color", "rgb");
  return o;
}

// The oracle's training samples, listed last to first with classes_of(k), paths relative to the
// split's root.
std::string write_train_list(const kiln::test::Scratch& dir, const std::string& separator = " ",
                             bool header = true) {
  const json& s = oracle().manifest["splits"]["train"];
  const std::string root = s["root"];
  std::string text = header ? "path,classes\n" : "";
  const size_t n = s["samples"].size();
  for (size_t k = 0; k < n; ++k) {
    const std::string path = s["samples"][n - 1 - k]["path"];
    std::string names;
    for (const std::string& c : classes_of(k)) names += (names.empty() ? "" : separator) + c;
    text += path.substr(root.size() + 1) + "," + names + "\n";
  }
  dir.write_text("train.csv", text);
  return dir.path("train.csv");
}

// Sample k of `list`, decoded at full scale (h x w x 3); its label into `label`. A failed decode
// fails the test and gives no pixels.
std::vector<uint8_t> decoded(const List& list, int64_t k, int64_t h, int64_t w,
                             int32_t* label = nullptr) {
  std::vector<uint8_t> pixels(static_cast<size_t>(h * w * 3));
  kiln_decode_request request{sizeof request, 1, 0, pixels.data(), pixels.size()};
  kiln_decoded_sample out{};
  out.struct_size = sizeof out;
  const Status status(vtable().decode(list.instance, k, &request, &out));
  EXPECT_EQ(status, nullptr) << describe(status.get());
  if (status != nullptr) return {};
  if (label != nullptr) *label = out.label;
  return pixels;
}

std::string refusal(const List& list) {
  EXPECT_NE(list.status, nullptr);
  if (list.status == nullptr) return "";
  EXPECT_EQ(list.status->code, KILN_ERR_INVALID_ARGUMENT) << list.status->message;
  return list.status->message;
}

TEST(ImageList, ListedImagesDecodeAsPilWithTheRowsTheirLinesName) {
  kiln::test::Scratch dir;
  const json& s = oracle().manifest["splits"]["train"];
  for (const auto& [separator, header] : {std::pair<std::string, bool>{" ", true}, {";", false}}) {
    SCOPED_TRACE("separator '" + separator + "'");
    const auto list =
        open(options(write_train_list(dir, separator, header), s["root"], "", separator, header));
    ASSERT_EQ(list->status, nullptr) << describe(list->status.get());
    kiln_dataset_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(Status(vtable().info(list->instance, &info)), nullptr);
    const size_t n = s["samples"].size();
    EXPECT_EQ(info.num_samples, static_cast<int64_t>(n));
    ASSERT_EQ(info.num_classes, 3);
    EXPECT_EQ(info.target_kind, KILN_TARGET_MULTI_LABEL);
    EXPECT_STREQ(info.class_names[0], "cat");
    EXPECT_STREQ(info.class_names[1], "dog");
    EXPECT_STREQ(info.class_names[2], "sky");
    EXPECT_EQ(info.channels, 3);
    for (size_t k = 0; k < n; ++k) {
      const json& e = s["samples"][n - 1 - k];
      SCOPED_TRACE(e["path"].get<std::string>());
      std::vector<float> row(3, -1.0F);
      ASSERT_EQ(Status(vtable().targets(list->instance, static_cast<int64_t>(k), row.data(), 3)),
                nullptr);
      const std::vector<std::string> names = classes_of(k);
      const auto has = [&](const char* c) {
        return std::find(names.begin(), names.end(), c) != names.end() ? 1.0F : 0.0F;
      };
      EXPECT_EQ(row, (std::vector<float>{has("cat"), has("dog"), has("sky")}));
      const int64_t h = e["height"], w = e["width"];
      int32_t label = -1;
      EXPECT_EQ(decoded(*list, static_cast<int64_t>(k), h, w, &label), oracle().pixels(e["RGB"]));
      EXPECT_EQ(label, 0);
    }
  }
}

// A list written by Python's csv module, whose paths and class names hold commas, quotes and a
// line break (tests/oracle/image_list_csv.py): each record reads as csv.reader reads it, its image
// decodes to PIL's pixels, and its row holds the classes its second field names.
TEST(ImageList, AQuotedListReadsAsPythonsCsvReader) {
  kiln::test::Scratch dir;
  const json& s = oracle().manifest["splits"]["train"];
  const std::string root = s["root"];
  json files = json::array();
  for (const json& e : s["samples"])
    files.push_back(e["path"].get<std::string>().substr(root.size() + 1));
  dir.write_text("config.json", json{{"root", root}, {"files", files}}.dump());
  dir.run("image_list_csv.py");
  const json expected = json::parse(dir.read_text("expected.json"));
  ASSERT_EQ(expected.size(), files.size());

  const auto list = open(options(dir.path("list.csv"), dir.path("images"), "", ";"));
  ASSERT_EQ(list->status, nullptr) << describe(list->status.get());
  kiln_dataset_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(Status(vtable().info(list->instance, &info)), nullptr);
  ASSERT_EQ(info.num_samples, static_cast<int64_t>(expected.size()));
  std::set<std::string> used;
  for (const json& e : expected) {
    for (const std::string c : e["classes"]) used.insert(c);
  }
  const std::vector<std::string> classes(used.begin(), used.end());
  ASSERT_EQ(info.num_classes, static_cast<int64_t>(classes.size()));
  for (size_t c = 0; c < classes.size(); ++c) EXPECT_EQ(info.class_names[c], classes[c]);
  EXPECT_NE(used.count("big, dog"), 0U) << "a class name holding a comma";
  for (size_t k = 0; k < expected.size(); ++k) {
    const json& e = expected[k];
    SCOPED_TRACE(e["path"].get<std::string>());
    std::vector<float> row(classes.size(), -1.0F), want(classes.size(), 0.0F);
    for (const std::string c : e["classes"]) {
      want[std::find(classes.begin(), classes.end(), c) - classes.begin()] = 1.0F;
    }
    ASSERT_EQ(Status(vtable().targets(list->instance, static_cast<int64_t>(k), row.data(),
                                      static_cast<int64_t>(row.size()))),
              nullptr);
    EXPECT_EQ(row, want);
    const std::string source = root + "/" + e["source"].get<std::string>();
    int matched = 0;
    for (const json& o : s["samples"]) {
      if (o["path"] != source) continue;
      ++matched;
      EXPECT_EQ(decoded(*list, static_cast<int64_t>(k), o["height"], o["width"]),
                oracle().pixels(o["RGB"]));
    }
    EXPECT_EQ(matched, 1) << "the image the record's link points to";
  }
}

TEST(ImageList, TheValidationListTakesTheTrainingClasses) {
  kiln::test::Scratch dir;
  const json& s = oracle().manifest["splits"]["train"];
  const std::string root = s["root"];
  const std::string first = std::string(s["samples"][0]["path"]).substr(root.size() + 1);
  const std::string train = write_train_list(dir);
  dir.write_text("val.csv", "path,classes\n" + first + ",dog\n" + first + ",\n");
  auto list = open(options(train, root, dir.path("val.csv")), KILN_SPLIT_VAL);
  ASSERT_EQ(list->status, nullptr) << describe(list->status.get());
  kiln_dataset_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(Status(vtable().info(list->instance, &info)), nullptr);
  EXPECT_EQ(info.num_samples, 2);
  EXPECT_EQ(info.num_classes, 3);
  std::vector<float> row(3);
  ASSERT_EQ(Status(vtable().targets(list->instance, 0, row.data(), 3)), nullptr);
  EXPECT_EQ(row, (std::vector<float>{0, 1, 0}));
  ASSERT_EQ(Status(vtable().targets(list->instance, 1, row.data(), 3)), nullptr);
  EXPECT_EQ(row, (std::vector<float>{0, 0, 0}));
  dir.write_text("bird.csv", "path,classes\n" + first + ",dog bird\n");
  EXPECT_NE(refusal(*open(options(train, root, dir.path("bird.csv")), KILN_SPLIT_VAL))
                .find("has class 'bird', which the training list does not use"),
            std::string::npos);
}

TEST(ImageList, RefusalsNameTheOptionFileAndLine) {
  kiln::test::Scratch dir;
  const json& s = oracle().manifest["splits"]["train"];
  const std::string root = s["root"];
  const std::string train = write_train_list(dir);
  EXPECT_NE(refusal(*open(options(dir.path("none.csv"), root))).find("option 'train': "),
            std::string::npos);
  dir.write_text("bad.csv", "path,classes\na.jpg,cat\nb.jpg cat\n");
  EXPECT_NE(refusal(*open(options(dir.path("bad.csv"), root)))
                .find("bad.csv:3: no comma: each line is path,classes"),
            std::string::npos);
  dir.write_text("empty.csv", "path,classes\n");
  EXPECT_NE(refusal(*open(options(dir.path("empty.csv"), root))).find("lists no sample"),
            std::string::npos);
  // Quoting as RFC 4180: the line a broken record starts on.
  dir.write_text("open.csv", "path,classes\na.jpg,cat\n\"b.jpg,cat\nc.jpg,dog\n");
  EXPECT_NE(refusal(*open(options(dir.path("open.csv"), root)))
                .find("open.csv:3: a quoted field is not closed before the end of the file"),
            std::string::npos);
  dir.write_text("after.csv", "path,classes\n\"a.jpg\"x,cat\n");
  EXPECT_NE(refusal(*open(options(dir.path("after.csv"), root)))
                .find("after.csv:2: a misplaced double quote"),
            std::string::npos);
  // An unquoted comma separates fields (RFC 4180): not one class named "cat,dog", and not two
  // classes either; the line is refused, pointing at the quotes it needs.
  dir.write_text("commas.csv", "path,classes\na.jpg,cat\n\nb.jpg,cat,dog\n");
  EXPECT_NE(refusal(*open(options(dir.path("commas.csv"), root)))
                .find("commas.csv:4: 3 fields; each line is path,classes"),
            std::string::npos);
  dir.write_text("quoted.csv", "path,classes\n\"a,\nb.jpg\",cat\nc.jpg,\"cat,\"dog\n");
  EXPECT_NE(refusal(*open(options(dir.path("quoted.csv"), root)))
                .find("quoted.csv:4: a misplaced double quote"),
            std::string::npos);
  // A root that is not the images' is found at the first image, before the run.
  const std::string no_root = refusal(*open(options(train, "/no/such/root")));
  EXPECT_NE(no_root.find("option 'root': cannot read the first image nor the next "),
            std::string::npos)
      << no_root;
  EXPECT_NE(no_root.find(": image_folder: '/no/such/root/"), std::string::npos) << no_root;
  EXPECT_NE(refusal(*open(options(train, root), KILN_SPLIT_VAL)).find("option 'val' is empty"),
            std::string::npos);
  // A host before 1.10 would train on the labels alone.
  EXPECT_NE(refusal(*open(options(train, root), KILN_SPLIT_TRAIN, 9)).find("ABI 1.10 or later"),
            std::string::npos);
}

}  // namespace
