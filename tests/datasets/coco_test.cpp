// The coco dataset (a COCO annotation file's images as multi-label data, ABI 1.10) through its
// vtable, against torchvision's CocoDetection (pycocotools): tests/oracle/coco.py writes an
// annotation file over the image_folder oracle's training images and what CocoDetection lists
// (order, each image's categories); every sample decodes to PIL's pixels with that row. And
// its refusals, which name the option and file.
#include <gtest/gtest.h>

#include <memory>
#include <string>
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
      kiln::test::component_vtable("kiln_image_folder", "coco"));
}

struct Coco {
  void* instance = nullptr;
  Status status;
  ~Coco() { vtable().destroy(instance); }
};

struct Config {
  std::string train, val, train_images, val_images, unannotated = "keep";
};

Config cfg(const std::string& train, const std::string& val, const std::string& train_images,
           const std::string& val_images = "", const std::string& unannotated = "keep") {
  return Config{train, val, train_images, val_images, unannotated};
}

// Opens coco with `c` for `split`, on a host of ABI 1.`minor`.
std::unique_ptr<Coco> open(const Config& c, int32_t split = KILN_SPLIT_TRAIN,
                           uint32_t minor = KILN_ABI_MINOR) {
  static kiln_host_api host = kiln::test::status_only_host();
  host.abi_minor = minor;
  Options o;
  o.set_string("train", c.train)
      .set_string("val", c.val)
      .set_string("train_images", c.train_images)
      .set_string("val_images", c.val_images)
      .set_string("unannotated", c.unannotated)
      .set_string("color", "rgb");
  auto coco = std::make_unique<Coco>();
  const kiln_dataset_open open{sizeof(kiln_dataset_open), split, 0, 0, 89478485};
  coco->status = Status(vtable().create(&host, o.get(), &open, &coco->instance));
  return coco;
}

// The oracle's annotation file over the image_folder oracle's training images, and what
// CocoDetection makes of it; made once per process.
struct Annotations {
  std::unique_ptr<kiln::test::Scratch> dir = std::make_unique<kiln::test::Scratch>();
  std::string root;  // the images' folder
  json expected;
  std::string file() const { return dir->path("instances.json"); }
};

const Annotations& annotations() {
  static const Annotations a = [] {
    Annotations r;
    const json& s = oracle().manifest["splits"]["train"];
    r.root = s["root"];
    json files = json::array();
    for (const json& e : s["samples"]) {
      files.push_back(e["path"].get<std::string>().substr(r.root.size() + 1));
    }
    r.dir->write_text("config.json", json{{"root", r.root}, {"files", files}}.dump());
    r.dir->run("coco.py");
    r.expected = json::parse(r.dir->read_text("expected.json"));
    return r;
  }();
  return a;
}

// The pixels the image_folder oracle wrote for the image at `path` (as PIL's convert("RGB")).
std::vector<uint8_t> pil_pixels(const std::string& path, int64_t* height, int64_t* width) {
  for (const json& e : oracle().manifest["splits"]["train"]["samples"]) {
    if (e["path"] == path) {
      *height = e["height"];
      *width = e["width"];
      return oracle().pixels(e["RGB"]);
    }
  }
  ADD_FAILURE() << "the image_folder oracle has no " << path;
  return {};
}

std::string refusal(const Coco& coco) {
  EXPECT_NE(coco.status, nullptr);
  if (coco.status == nullptr) return "";
  EXPECT_EQ(coco.status->code, KILN_ERR_INVALID_ARGUMENT) << coco.status->message;
  return coco.status->message;
}

// Writes `doc` to `name` in `dir` and returns its path.
std::string write_json(const kiln::test::Scratch& dir, const std::string& name, const json& doc) {
  dir.write_text(name, doc.dump());
  return dir.path(name);
}

TEST(Coco, ImagesComeInCocoDetectionsOrderWithTheirAnnotationsCategories) {
  const Annotations& a = annotations();
  for (const std::string unannotated : {"keep", "skip"}) {
    SCOPED_TRACE("unannotated = " + unannotated);
    const json& want = a.expected[unannotated];
    const auto coco = open(cfg(a.file(), "", a.root, "", unannotated));
    ASSERT_EQ(coco->status, nullptr) << describe(coco->status.get());
    kiln_dataset_info info{};
    info.struct_size = sizeof info;
    ASSERT_EQ(Status(vtable().info(coco->instance, &info)), nullptr);
    ASSERT_EQ(info.num_samples, static_cast<int64_t>(want.size()));
    EXPECT_EQ(info.target_kind, KILN_TARGET_MULTI_LABEL);
    ASSERT_EQ(info.num_classes, static_cast<int64_t>(a.expected["classes"].size()));
    for (size_t k = 0; k < a.expected["classes"].size(); ++k) {
      EXPECT_EQ(info.class_names[k], a.expected["classes"][k].get<std::string>());
    }
    for (size_t i = 0; i < want.size(); ++i) {
      const std::string path = want[i]["path"];
      SCOPED_TRACE(path);
      std::vector<float> row(static_cast<size_t>(info.num_classes), -1.0F);
      ASSERT_EQ(Status(vtable().targets(coco->instance, static_cast<int64_t>(i), row.data(),
                                        info.num_classes)),
                nullptr);
      EXPECT_EQ(row, want[i]["row"].get<std::vector<float>>());
      int64_t h = 0, w = 0;
      const std::vector<uint8_t> expected = pil_pixels(path, &h, &w);
      std::vector<uint8_t> pixels(static_cast<size_t>(h * w * 3));
      kiln_decode_request request{sizeof request, 1, 0, pixels.data(), pixels.size()};
      kiln_decoded_sample out{};
      out.struct_size = sizeof out;
      ASSERT_EQ(Status(vtable().decode(coco->instance, static_cast<int64_t>(i), &request, &out)),
                nullptr);
      EXPECT_EQ(pixels, expected);
    }
  }
  // The oracle's file leaves one image without annotations.
  EXPECT_EQ(a.expected["keep"].size(), a.expected["skip"].size() + 1);
}

TEST(Coco, TheValidationFileMustHaveTheTrainingCategories) {
  const Annotations& a = annotations();
  kiln::test::Scratch dir;
  json val = json::parse(a.dir->read_text("instances.json"));
  const std::string same = write_json(dir, "val.json", val);
  const auto coco = open(cfg(a.file(), same, a.root, a.root), KILN_SPLIT_VAL);
  ASSERT_EQ(coco->status, nullptr) << describe(coco->status.get());
  kiln_dataset_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(Status(vtable().info(coco->instance, &info)), nullptr);
  EXPECT_EQ(info.num_samples, static_cast<int64_t>(a.expected["keep"].size()));

  for (json& c : val["categories"]) {
    if (c["id"] == 3) c["name"] = "truck";
  }
  EXPECT_NE(refusal(*open(cfg(a.file(), write_json(dir, "renamed.json", val), a.root, a.root),
                          KILN_SPLIT_VAL))
                .find("option 'val': " + dir.path("renamed.json") +
                      ": its categories are not the training file's: id 3 'truck' where the "
                      "training file has id 3 'car'"),
            std::string::npos);
  EXPECT_NE(refusal(*open(cfg(a.file(), "", a.root), KILN_SPLIT_VAL)).find("option 'val' is empty"),
            std::string::npos);
}

TEST(Coco, RefusalsNameTheOptionAndFile) {
  const Annotations& a = annotations();
  kiln::test::Scratch dir;
  const json doc = json::parse(a.dir->read_text("instances.json"));
  const auto refused = [&](const std::string& name, const json& changed) {
    return refusal(*open(cfg(write_json(dir, name, changed), "", a.root)));
  };
  dir.write_text("broken.json", "{\"images\": [\n  {\"id\": 1,}\n]}");
  EXPECT_NE(refusal(*open(cfg(dir.path("broken.json"), "", a.root)))
                .find("option 'train': " + dir.path("broken.json") + ": parse error at line 2"),
            std::string::npos);
  EXPECT_NE(refusal(*open(cfg(dir.path("none.json"), "", a.root))).find("none.json: cannot open"),
            std::string::npos);

  json no_images = doc;
  no_images.erase("images");
  EXPECT_NE(refused("no_images.json", no_images).find("no 'images' array"), std::string::npos);
  json lost_image = doc;
  lost_image["annotations"][2]["image_id"] = 99999;
  EXPECT_NE(refused("lost_image.json", lost_image)
                .find("annotation 2: image_id 99999 is not among the images"),
            std::string::npos);
  json lost_category = doc;
  lost_category["annotations"][0]["category_id"] = 2;
  EXPECT_NE(refused("lost_category.json", lost_category)
                .find("annotation 0: category_id 2 is not among the categories"),
            std::string::npos);
  json twice = doc;
  twice["images"][1]["id"] = twice["images"][0]["id"];
  EXPECT_NE(refused("twice.json", twice).find(" is given twice"), std::string::npos);
  json mistyped = doc;
  mistyped["images"][0]["id"] = "7";
  EXPECT_NE(refused("mistyped.json", mistyped).find("image 0: 'id' is missing or not an integer"),
            std::string::npos);
  json no_annotation = doc;
  no_annotation["annotations"] = json::array();
  EXPECT_NE(refusal(*open(cfg(write_json(dir, "bare.json", no_annotation), "", a.root, "", "skip")))
                .find("no image has an annotation"),
            std::string::npos);
  // Images elsewhere than the folder option says show at the first image, before the run.
  const std::string elsewhere = refusal(*open(cfg(a.file(), "", "/no/such/folder")));
  EXPECT_NE(elsewhere.find("option 'train_images': cannot read the first image"), std::string::npos)
      << elsewhere;
  EXPECT_NE(elsewhere.find(": image_folder: '/no/such/folder/"), std::string::npos) << elsewhere;
  EXPECT_NE(
      refusal(*open(cfg(a.file(), "", a.root), KILN_SPLIT_TRAIN, 9)).find("ABI 1.10 or later"),
      std::string::npos);
}

}  // namespace
