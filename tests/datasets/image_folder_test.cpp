// The image_folder dataset against torchvision's ImageFolder and PIL (tests/oracle/
// image_folder.py): classes, sample order and labels equal ImageFolder's; decoded pixels equal
// Image.open(path).convert("RGB") (or "L") exactly, JPEGs at full scale and reduced by 2, 4, 8
// in the DCT domain (equal to PIL's Image.draft, the same libjpeg scaled IDCT); corrupt files
// are DATA_LOSS naming the path; configuration errors are INVALID_ARGUMENT naming the option.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "image_folder_harness.hpp"

namespace kiln::dataset_test {
namespace {

using nlohmann::json;

#define ASSERT_KILN_OK(expr)                                \
  do {                                                      \
    Status status_ = (expr);                                \
    ASSERT_EQ(status_, nullptr) << describe(status_.get()); \
  } while (0)

Config train_config() {
  Config c;
  c.root = oracle().manifest["splits"]["train"]["root"];
  c.val_root = oracle().manifest["splits"]["val"]["root"];
  return c;
}

// Number of bytes that differ and the largest difference.
std::pair<size_t, int> difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t count = 0;
  int largest = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const int d = std::abs(int{a[i]} - int{b[i]});
    count += d != 0;
    largest = std::max(largest, d);
  }
  return {count, largest};
}

// Every sample of `split` in ImageFolder's order: label, size, pixels as PIL's `mode`.
void expect_split(const Dataset& d, const std::string& split, const std::string& mode) {
  const json& s = oracle().manifest["splits"][split];
  const kiln_dataset_info info = d.info();
  EXPECT_EQ(info.num_samples, static_cast<int64_t>(s["samples"].size()));
  ASSERT_EQ(info.num_classes, static_cast<int64_t>(s["classes"].size()));
  EXPECT_EQ(info.channels, mode == "RGB" ? 3 : 1);
  EXPECT_EQ(info.height, 0);
  EXPECT_EQ(info.width, 0);
  ASSERT_NE(info.class_names, nullptr);
  for (int64_t c = 0; c < info.num_classes; ++c) {
    const std::string name = s["classes"][static_cast<size_t>(c)];
    EXPECT_EQ(info.class_names[c], name);
    EXPECT_EQ(s["class_to_idx"][name], c);
  }
  for (size_t i = 0; i < s["samples"].size() && i < static_cast<size_t>(info.num_samples); ++i) {
    const json& e = s["samples"][i];
    SCOPED_TRACE(e["path"].get<std::string>() + " (" + e["mode"].get<std::string>() + ")");
    kiln_sample_header h;
    ASSERT_KILN_OK(d.probe(static_cast<int64_t>(i), &h));
    EXPECT_EQ(h.height, e["height"]);
    EXPECT_EQ(h.width, e["width"]);
    EXPECT_EQ(h.label, e["label"]);
    Sample sample;
    ASSERT_KILN_OK(d.decode(static_cast<int64_t>(i), 1, &sample));
    EXPECT_EQ(sample.height, e["height"]);
    EXPECT_EQ(sample.width, e["width"]);
    EXPECT_EQ(sample.label, e["label"]);
    EXPECT_EQ(sample.scale, 1);
    const std::vector<uint8_t> expected = oracle().pixels(e[mode]);
    ASSERT_EQ(sample.pixels.size(), expected.size());
    const auto [count, largest] = difference(sample.pixels, expected);
    EXPECT_EQ(count, 0u) << "bytes differ from PIL's, by up to " << largest;
  }
}

TEST(ImageFolder, Descriptor) {
  EXPECT_EQ(library_probe(), KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR));
  EXPECT_EQ(library().torch_version, nullptr);  // no LibTorch
  const kiln_component_descriptor& c = component();
  EXPECT_EQ(c.kind, KILN_COMPONENT_DATASET);
  EXPECT_EQ(c.option_count, 4u);
  EXPECT_EQ(vtable().struct_size, sizeof(kiln_dataset_vtable));
}

TEST(ImageFolder, TrainEqualsTorchvisionAndPil) {
  Dataset d;
  ASSERT_KILN_OK(d.create(train_config()));
  expect_split(d, "train", "RGB");
}

TEST(ImageFolder, GrayEqualsPilL) {
  Config c = train_config();
  c.color = "gray";
  Dataset d;
  ASSERT_KILN_OK(d.create(c));
  expect_split(d, "train", "L");
}

TEST(ImageFolder, ValidationSplit) {
  for (const std::string color : {"rgb", "gray"}) {
    Config c = train_config();
    c.color = color;
    Dataset d;
    ASSERT_KILN_OK(d.create(c, KILN_SPLIT_VAL));
    expect_split(d, "val", color == "rgb" ? "RGB" : "L");
  }
}

TEST(ImageFolder, AutoColorFollowsTheFirstImage) {
  Config c = train_config();  // first sample: an RGB JPEG
  c.color = "auto";
  Dataset d;
  ASSERT_KILN_OK(d.create(c));
  EXPECT_EQ(d.info().channels, 3);
  ASSERT_KILN_OK(d.create(c, KILN_SPLIT_VAL));
  EXPECT_EQ(d.info().channels, 3);
  c.root = oracle().tree("mismatch/train");  // gray PNGs
  c.val_root = "";
  ASSERT_KILN_OK(d.create(c));
  EXPECT_EQ(d.info().channels, 1);
  Sample s;
  ASSERT_KILN_OK(d.decode(0, 1, &s));
  EXPECT_EQ(s.pixels.size(), 16u);
}

// JPEGs reduced in the DCT domain equal PIL's draft("RGB", (w // d, h // d)); other formats
// decode at full scale whatever the host allows.
TEST(ImageFolder, ScaledDecodeEqualsPilDraft) {
  for (const std::string color : {"rgb", "gray"}) {
    Config c = train_config();
    c.color = color;
    Dataset d;
    ASSERT_KILN_OK(d.create(c));
    const json& samples = oracle().manifest["splits"]["train"]["samples"];
    int jpegs = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      const json& e = samples[i];
      for (int32_t scale : {2, 4, 8}) {
        SCOPED_TRACE(e["path"].get<std::string>() + " " + color + " 1/" + std::to_string(scale));
        Sample s;
        ASSERT_KILN_OK(d.decode(static_cast<int64_t>(i), scale, &s));
        if (!e.contains("draft")) {
          EXPECT_EQ(s.scale, 1);
          EXPECT_EQ(s.height, e["height"]);
          continue;
        }
        const json& draft = e["draft"][std::to_string(scale)];
        EXPECT_EQ(s.scale, scale);
        EXPECT_EQ(s.height, draft["height"]);
        EXPECT_EQ(s.width, draft["width"]);
        const std::vector<uint8_t> expected = oracle().pixels(draft[color == "rgb" ? "RGB" : "L"]);
        ASSERT_EQ(s.pixels.size(), expected.size());
        const auto [count, largest] = difference(s.pixels, expected);
        EXPECT_EQ(count, 0u) << "bytes differ from PIL's draft, by up to " << largest;
        jpegs += scale == 2;
      }
    }
    EXPECT_EQ(jpegs, 8);
  }
  // scale_denom 4 allows 1/4 and 1/2: the largest is taken.
  Dataset d;
  ASSERT_KILN_OK(d.create(train_config()));
  Sample s;
  ASSERT_KILN_OK(d.decode(1, 4, &s));  // Zebra/z1.jpg, 375 x 500
  EXPECT_EQ(s.scale, 4);
  EXPECT_EQ(s.height, 94);
  EXPECT_EQ(s.width, 125);
}

TEST(ImageFolder, TooSmallABufferIsRefusedUntouched) {
  Dataset d;
  ASSERT_KILN_OK(d.create(train_config()));
  for (int64_t index : {int64_t{1}, int64_t{2}}) {  // a JPEG, a PNG
    Sample s;
    const size_t capacity = 100;
    refusal(d.decode(index, 1, &s, capacity), KILN_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s.pixels, std::vector<uint8_t>(capacity, 0xA5));
  }
  Sample s;
  refusal(d.decode(0, 3, &s), KILN_ERR_INVALID_ARGUMENT);  // scale_denom not 1, 2, 4, 8
  kiln_sample_header h;
  refusal(d.probe(d.info().num_samples, &h), KILN_ERR_INVALID_ARGUMENT);
}

TEST(ImageFolder, CorruptFilesAreDataLossNamingThePath) {
  Config c;
  c.root = oracle().manifest["bad_root"];
  Dataset d;
  ASSERT_KILN_OK(d.create(c));
  // The samples in ImageFolder's order: cut.png garbage.png header.jpg ok.jpg truncated.jpg
  // whole.png.
  const std::vector<std::string> names = {"cut.png", "garbage.png",   "header.jpg",
                                          "ok.jpg",  "truncated.jpg", "whole.png"};
  ASSERT_EQ(d.info().num_samples, 6);
  for (int64_t i = 0; i < 6; ++i) {
    const std::string& name = names[static_cast<size_t>(i)];
    SCOPED_TRACE(name);
    const bool good = name == "ok.jpg" || name == "whole.png";
    for (int32_t scale : {1, 8}) {
      Sample s;
      Status status = d.decode(i, scale, &s, 500 * 375 * 3);
      if (good) {
        EXPECT_EQ(status, nullptr) << describe(status.get());
        continue;
      }
      const std::string message = refusal(status, KILN_ERR_DATA_LOSS);
      EXPECT_NE(message.find(c.root + "/c/" + name), std::string::npos) << message;
    }
    // Headers: the truncated files still have theirs.
    kiln_sample_header h;
    Status status = d.probe(i, &h);
    if (good || name == "cut.png" || name == "truncated.jpg") {
      EXPECT_EQ(status, nullptr) << describe(status.get());
    } else {
      EXPECT_NE(refusal(status, KILN_ERR_DATA_LOSS).find(name), std::string::npos);
    }
  }
}

TEST(ImageFolder, CreateRefusals) {
  struct Case {
    std::string what;
    Config config;
    int32_t split;
    std::vector<std::string> in_message;
  };
  const Oracle& o = oracle();
  std::vector<Case> cases;
  auto add = [&](std::string what, auto edit, int32_t split, std::vector<std::string> words) {
    Config c = train_config();
    edit(c);
    cases.push_back({std::move(what), c, split, std::move(words)});
  };
  const std::string missing = o.tree("nowhere");
  add("missing root", [&](Config& c) { c.root = missing; }, KILN_SPLIT_TRAIN, {"'root'", missing});
  add("empty root option", [&](Config& c) { c.root = ""; }, KILN_SPLIT_TRAIN, {"'root'"});
  add("root a file", [&](Config& c) { c.root = o.tree("no_classes/loose.jpg"); }, KILN_SPLIT_TRAIN,
      {"'root'", "not a folder"});
  add("no class folders",
      [&](Config& c) {
        c.root = o.tree("no_classes");
        c.val_root = "";
      },
      KILN_SPLIT_TRAIN, {"'root'", o.tree("no_classes"), "no class folder"});
  add("empty class",
      [&](Config& c) {
        c.root = o.tree("empty_class");
        c.val_root = "";
      },
      KILN_SPLIT_TRAIN, {"'root'", o.tree("empty_class/hollow"), ".png"});
  add("missing val_root", [&](Config& c) { c.val_root = missing; }, KILN_SPLIT_TRAIN,
      {"'val_root'", missing});
  add("val classes differ",
      [&](Config& c) {
        c.root = o.tree("mismatch/train");
        c.val_root = o.tree("mismatch/val");
      },
      KILN_SPLIT_VAL, {"'val_root'", o.tree("mismatch/val"), "missing 'b'", "not in root 'd'"});
  add("val classes differ, train split",
      [&](Config& c) {
        c.root = o.tree("mismatch/train");
        c.val_root = o.tree("mismatch/val");
      },
      KILN_SPLIT_TRAIN, {"'val_root'", "'b'", "'d'"});
  add("no validation folder", [&](Config& c) { c.val_root = ""; }, KILN_SPLIT_VAL, {"'val_root'"});
  add("undecodable extension",
      [&](Config& c) {
        c.extensions = {".jpg", ".bmp"};
      },
      KILN_SPLIT_TRAIN, {"'extensions'", ".bmp"});
  add("extension without a dot", [&](Config& c) { c.extensions = {"jpg"}; }, KILN_SPLIT_TRAIN,
      {"'extensions'", "jpg"});
  add("no extension", [&](Config& c) { c.extensions = {}; }, KILN_SPLIT_TRAIN, {"'extensions'"});
  add("unknown color", [&](Config& c) { c.color = "cmyk"; }, KILN_SPLIT_TRAIN, {"'color'"});
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Dataset d;
    const std::string message = refusal(d.create(k.config, k.split), KILN_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(d.instance(), nullptr);
    for (const std::string& word : k.in_message) {
      EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
    }
  }
}

// Extensions match case-insensitively, as ImageFolder lower-cases the file name.
TEST(ImageFolder, ExtensionsOption) {
  Config c = train_config();
  c.extensions = {".PNG"};
  Dataset d;
  ASSERT_KILN_OK(d.create(c));
  const json& expected = oracle().manifest["train_png_only"];
  ASSERT_EQ(d.info().num_samples, static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    kiln_sample_header h;
    ASSERT_KILN_OK(d.probe(static_cast<int64_t>(i), &h));
    EXPECT_EQ(h.label, expected[i][1]) << expected[i][0];
  }
  // The default extensions leave out the .bmp torchvision's IMG_EXTENSIONS would take.
  ASSERT_KILN_OK(d.create(train_config()));
  EXPECT_EQ(d.info().num_samples + 1, oracle().manifest["train_all_extensions"].get<int64_t>());
}

// 16-bit gray PNG: the high byte of each sample (libpng's strip_16, as PIL reads 16-bit RGB).
// PIL reads it as mode I;16 and its convert() clips at 255 instead; not compared with PIL.
TEST(ImageFolder, Gray16PngTakesTheHighByte) {
  const json& g = oracle().manifest["gray16"];
  Config c;
  c.root = g["root"];
  c.color = "gray";
  Dataset d;
  ASSERT_KILN_OK(d.create(c));
  Sample s;
  ASSERT_KILN_OK(d.decode(0, 1, &s));
  EXPECT_EQ(s.height, g["height"]);
  EXPECT_EQ(s.pixels, oracle().pixels("gray16_high_byte.bin"));
  EXPECT_EQ(g["pil_L_max"], 255);
}

// Loader threads call probe and decode at once, on equal indices too.
TEST(ImageFolder, ThreadsDecodeAtOnce) {
  Dataset d;
  ASSERT_KILN_OK(d.create(train_config()));
  const int64_t n = d.info().num_samples;
  std::vector<Sample> single(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ASSERT_KILN_OK(d.decode(i, 2, &single[static_cast<size_t>(i)]));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (int64_t i = 0; i < n; ++i) {
          Sample s;
          Status status = d.decode(i, 2, &s);
          if (status != nullptr || s.pixels != single[static_cast<size_t>(i)].pixels) {
            ++mismatches[static_cast<size_t>(t)];
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Rough decode speed of a 500 x 375 quality-90 JPEG (Zebra/z1.jpg), one thread; run with
// --gtest_also_run_disabled_tests.
TEST(ImageFolder, DISABLED_Throughput) {
  Dataset d;
  ASSERT_KILN_OK(d.create(train_config()));
  for (int32_t scale : {1, 2, 4}) {
    Sample s;
    const int reps = 400;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) ASSERT_KILN_OK(d.decode(1, scale, &s, 375 * 500 * 3));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("500x375 q90 JPEG at 1/%d: %.0f images/s\n", scale, reps / seconds);
  }
}

}  // namespace
}  // namespace kiln::dataset_test
