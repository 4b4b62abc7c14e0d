// The built-in dataset plugins (plugins/dataset/formats) through the host's adapter: files
// written here in each format's official layout, decoded and compared with the bytes written
// (HWC from IDX's and CIFAR's planes, safetensors' two layouts), and synthetic against the host's
// data::make_synthetic for the same seed. Refusals name the option and path; a record that cannot
// be read becomes a SampleError naming the file and record.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <random>

#include "config_values.hpp"
#include "data/dataset.hpp"
#include "kiln_test_paths.h"
#include "plugin/dataset_source.hpp"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"
#include "scratch.hpp"

namespace {

using kiln::config::OptionSet;
using kiln::config::Value;
using kiln::plugin::DatasetSource;
using kiln::plugin::Registry;
using kiln::test::int_value;
using kiln::test::string_value;

const Registry& registry() {
  static Registry* r = [] {
    auto* out = new Registry();
    kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
    loader.load_library(std::string(KILN_PLUGIN_DIR) + "/libkiln_datasets.so", *out);
    return out;
  }();
  return *r;
}

OptionSet options_of(const std::string& name,
                     const std::vector<std::pair<std::string, Value>>& set) {
  const auto* c = registry().find(KILN_COMPONENT_DATASET, name);
  EXPECT_NE(c, nullptr) << name;
  OptionSet options = kiln::plugin::default_options(*c);
  for (const auto& [key, value] : set) options.set(key, value);
  return options;
}

std::unique_ptr<DatasetSource> open(const std::string& name,
                                    const std::vector<std::pair<std::string, Value>>& set,
                                    int32_t split = KILN_SPLIT_TRAIN, uint64_t seed = 0) {
  return kiln::plugin::make_dataset_source(registry(), name, options_of(name, set), split, seed);
}

// The message `name`'s create refuses `set` with.
std::string refusal(const std::string& name, const std::vector<std::pair<std::string, Value>>& set,
                    int32_t split = KILN_SPLIT_TRAIN) {
  try {
    open(name, set, split);
  } catch (const kiln::plugin::OptionsRefused& e) {
    return e.reason();
  }
  return "";
}

std::vector<uint8_t> decode(const kiln::data::Source& s, int64_t i) {
  std::vector<uint8_t> out(static_cast<size_t>(s.fixed_height() * s.fixed_width() * s.channels()));
  const auto got = s.decode(i, 1, out.data(), out.size());
  EXPECT_EQ(got.height, s.fixed_height());
  EXPECT_EQ(got.width, s.fixed_width());
  EXPECT_EQ(got.scale, 1);
  EXPECT_EQ(got.label, s.probe(i).label);
  return out;
}

// CHW planes of one image to HWC.
std::vector<uint8_t> chw_to_hwc(const uint8_t* chw, int64_t c, int64_t h, int64_t w) {
  std::vector<uint8_t> out(static_cast<size_t>(c * h * w));
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t p = 0; p < h * w; ++p) out[static_cast<size_t>(p * c + k)] = chw[k * h * w + p];
  }
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

// ---- idx ----------------------------------------------------------------------------------

std::vector<uint8_t> idx_file(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 8, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(f);
}

TEST(IdxDataset, ThreeChannelsAndTwelveClassesFromTheData) {
  kiln::test::Scratch dir;
  const uint32_t n = 30, c = 3, h = 5, w = 7;
  const std::vector<uint8_t> pixels = random_bytes(n * c * h * w, 1);
  std::vector<uint8_t> labels(n);
  for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>((i * 5) % 12);
  write_gz(dir.path("img.gz"), idx_file({n, c, h, w}, pixels));
  const std::vector<uint8_t> label_file = idx_file({n}, labels);
  dir.write_bytes("lab", label_file.data(), label_file.size());  // plain, not gzip
  auto s = open("idx", {{"root", string_value(dir.path(""))},
                        {"train_images", string_value("img.gz")},
                        {"train_labels", string_value("lab")}});
  EXPECT_EQ(s->size(), n);
  EXPECT_EQ(s->num_classes(), 12);
  EXPECT_EQ(s->channels(), 3);
  EXPECT_EQ(s->fixed_height(), h);
  EXPECT_EQ(s->fixed_width(), w);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(s->probe(i).label, labels[i]);
    EXPECT_EQ(decode(*s, i), chw_to_hwc(pixels.data() + i * c * h * w, c, h, w)) << i;
  }
  // num_classes given: a label past it names the file, the sample and the option.
  const std::string why = refusal("idx", {{"root", string_value(dir.path(""))},
                                          {"train_images", string_value("img.gz")},
                                          {"train_labels", string_value("lab")},
                                          {"num_classes", int_value(10)}});
  EXPECT_NE(why.find("label 10 of sample 2 is outside [0, 10) (option 'num_classes'"),
            std::string::npos)
      << why;
}

TEST(IdxDataset, GrayImagesAndFashionMnistsNames) {
  kiln::test::Scratch dir;
  const uint32_t n = 4, h = 28, w = 28;
  const std::vector<uint8_t> pixels = random_bytes(n * h * w, 2);
  write_gz(dir.path("t10k-images-idx3-ubyte.gz"), idx_file({n, h, w}, pixels));
  write_gz(dir.path("t10k-labels-idx1-ubyte.gz"), idx_file({n}, {9, 0, 3, 9}));
  auto s = open("fashion-mnist", {{"root", string_value(dir.path(""))}}, KILN_SPLIT_VAL);
  EXPECT_EQ(s->num_classes(), 10);
  EXPECT_EQ(s->channels(), 1);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_EQ(decode(*s, i),
              std::vector<uint8_t>(pixels.begin() + i * h * w, pixels.begin() + (i + 1) * h * w));
  }
  // The training files are missing: the option and the path are named.
  const std::string why = refusal("fashion-mnist", {{"root", string_value(dir.path(""))}});
  EXPECT_EQ(why, "fashion-mnist: option 'train_images': " + dir.path("train-images-idx3-ubyte.gz") +
                     ": No such file or directory");
  EXPECT_EQ(refusal("idx", {{"root", string_value("/no/such/root")}}),
            "idx: option 'root': /no/such/root: No such file or directory");
}

TEST(IdxDataset, ATruncatedFileIsNamed) {
  kiln::test::Scratch dir;
  std::vector<uint8_t> file = idx_file({3, 2, 2}, random_bytes(12, 3));
  file.resize(file.size() - 1);
  dir.write_bytes("i", file.data(), file.size());
  const std::vector<uint8_t> labels = idx_file({3}, {0, 1, 2});
  dir.write_bytes("l", labels.data(), labels.size());
  const std::string why = refusal("idx", {{"root", string_value(dir.path(""))},
                                          {"train_images", string_value("i")},
                                          {"train_labels", string_value("l")}});
  EXPECT_NE(why.find(dir.path("i") + ": truncated"), std::string::npos) << why;
}

// A gzip IDX file inflates far past its size: 220 KB here claim (and hold) one 15000 x 15000
// image, over twice data.max_image_pixels. It is refused from the header, before the 225 MB
// are inflated, naming the file and the size; under a higher limit it reads.
TEST(IdxDataset, AnImageOverThePixelLimitIsRefusedFromTheHeader) {
  kiln::test::Scratch dir;
  const uint32_t side = 15000;
  {
    gzFile f = gzopen(dir.path("i.gz").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::vector<uint8_t> head = idx_file({1, side, side}, {});
    ASSERT_EQ(gzwrite(f, head.data(), static_cast<unsigned>(head.size())),
              static_cast<int>(head.size()));
    const std::vector<uint8_t> row(side, 0);
    for (uint32_t y = 0; y < side; ++y)
      ASSERT_EQ(gzwrite(f, row.data(), side), static_cast<int>(side));
    gzclose(f);
  }
  const std::vector<uint8_t> labels = idx_file({1}, {0});
  dir.write_bytes("l", labels.data(), labels.size());
  const std::vector<std::pair<std::string, Value>> set = {{"root", string_value(dir.path(""))},
                                                          {"train_images", string_value("i.gz")},
                                                          {"train_labels", string_value("l")}};
  EXPECT_EQ(refusal("idx", set), "idx: " + dir.path("i.gz") +
                                     ": images of 15000x15000 pixels, more than twice "
                                     "data.max_image_pixels (89478485)");
  const auto source = kiln::plugin::make_dataset_source(registry(), "idx", options_of("idx", set),
                                                        KILN_SPLIT_TRAIN, 0, 200000000);
  EXPECT_EQ(source->fixed_height(), side);
}

// A sample size over twice the pixel limit in a dataset of one size is a configuration error at
// data.max_image_pixels (the user's call to raise it); above the limit but not twice, it opens.
TEST(SyntheticDataset, ASizeOverTwiceThePixelLimitIsAConfigurationError) {
  const std::vector<std::pair<std::string, Value>> set = {{"height", int_value(28)},
                                                          {"width", int_value(28)}};
  try {
    kiln::plugin::make_dataset_source(registry(), "synthetic", options_of("synthetic", set),
                                      KILN_SPLIT_TRAIN, 0, 391);
    ADD_FAILURE() << "no error";
  } catch (const kiln::plugin::OptionsRefused& e) {
    EXPECT_EQ(e.section(), "data");
    EXPECT_NE(e.reason().find("every sample is 28x28 = 784 pixels, more than twice "
                              "max_image_pixels (391)"),
              std::string::npos)
        << e.reason();
  }
  EXPECT_NO_THROW(kiln::plugin::make_dataset_source(
      registry(), "synthetic", options_of("synthetic", set), KILN_SPLIT_TRAIN, 0, 392));
}

// ---- cifar --------------------------------------------------------------------------------

// Records as the binary version lays them out: label byte(s), then R, G, B planes of 32 x 32.
struct CifarFile {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<uint8_t>> labels;  // per record
  std::vector<std::vector<uint8_t>> planes;  // per record, 3072 bytes
};

CifarFile cifar_file(int records, int label_bytes, int classes, uint32_t seed) {
  CifarFile f;
  std::mt19937 gen(seed);
  for (int r = 0; r < records; ++r) {
    std::vector<uint8_t> label;
    for (int k = 0; k < label_bytes; ++k) {
      label.push_back(static_cast<uint8_t>(
          gen() % static_cast<uint32_t>(k == 0 && label_bytes == 2 ? 20 : classes)));
    }
    std::vector<uint8_t> planes = random_bytes(3072, seed * 1000 + static_cast<uint32_t>(r));
    f.bytes.insert(f.bytes.end(), label.begin(), label.end());
    f.bytes.insert(f.bytes.end(), planes.begin(), planes.end());
    f.labels.push_back(label);
    f.planes.push_back(planes);
  }
  return f;
}

TEST(CifarDataset, Cifar10ReadsEveryBatchInOrder) {
  kiln::test::Scratch dir;
  std::vector<CifarFile> batches;
  for (int k = 1; k <= 5; ++k) {
    batches.push_back(cifar_file(3 + k, 1, 10, static_cast<uint32_t>(k)));
    dir.write_bytes("data_batch_" + std::to_string(k) + ".bin", batches.back().bytes.data(),
                    batches.back().bytes.size());
  }
  const CifarFile test = cifar_file(5, 1, 10, 9);
  dir.write_bytes("test_batch.bin", test.bytes.data(), test.bytes.size());

  auto train = open("cifar10", {{"root", string_value(dir.path(""))}});
  EXPECT_EQ(train->size(), 4 + 5 + 6 + 7 + 8);
  EXPECT_EQ(train->num_classes(), 10);
  EXPECT_EQ(train->channels(), 3);
  EXPECT_EQ(train->fixed_height(), 32);
  int64_t i = 0;
  for (const CifarFile& batch : batches) {
    for (size_t r = 0; r < batch.planes.size(); ++r, ++i) {
      EXPECT_EQ(train->probe(i).label, batch.labels[r][0]);
      // torchvision's CIFAR10: reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1) of the same bytes.
      EXPECT_EQ(decode(*train, i), chw_to_hwc(batch.planes[r].data(), 3, 32, 32)) << i;
    }
  }
  auto val = open("cifar10", {{"root", string_value(dir.path(""))}}, KILN_SPLIT_VAL);
  ASSERT_EQ(val->size(), 5);
  EXPECT_EQ(decode(*val, 4), chw_to_hwc(test.planes[4].data(), 3, 32, 32));
}

TEST(CifarDataset, Cifar100FineOrCoarse) {
  kiln::test::Scratch dir;
  const CifarFile train = cifar_file(9, 2, 100, 11);
  dir.write_bytes("train.bin", train.bytes.data(), train.bytes.size());
  const CifarFile test = cifar_file(4, 2, 100, 12);
  dir.write_bytes("test.bin", test.bytes.data(), test.bytes.size());
  auto fine = open("cifar100", {{"root", string_value(dir.path(""))}});
  auto coarse =
      open("cifar100", {{"root", string_value(dir.path(""))}, {"label", string_value("coarse")}});
  EXPECT_EQ(fine->num_classes(), 100);
  EXPECT_EQ(coarse->num_classes(), 20);
  for (int64_t i = 0; i < 9; ++i) {
    EXPECT_EQ(fine->probe(i).label, train.labels[static_cast<size_t>(i)][1]);
    EXPECT_EQ(coarse->probe(i).label, train.labels[static_cast<size_t>(i)][0]);
    EXPECT_EQ(decode(*fine, i), chw_to_hwc(train.planes[static_cast<size_t>(i)].data(), 3, 32, 32));
  }
  auto val = open("cifar100", {{"root", string_value(dir.path(""))}}, KILN_SPLIT_VAL);
  EXPECT_EQ(val->size(), 4);
}

TEST(CifarDataset, MissingAndBrokenFilesAreNamed) {
  kiln::test::Scratch dir;
  const CifarFile test = cifar_file(2, 1, 10, 5);
  std::vector<uint8_t> bytes = test.bytes;
  bytes.pop_back();
  dir.write_bytes("test_batch.bin", bytes.data(), bytes.size());
  EXPECT_EQ(
      refusal("cifar10", {{"root", string_value(dir.path(""))}}),
      "cifar10: option 'root': " + dir.path("data_batch_1.bin") + ": No such file or directory");
  EXPECT_EQ(refusal("cifar10", {{"root", string_value(dir.path(""))}}, KILN_SPLIT_VAL),
            "cifar10: " + dir.path("test_batch.bin") +
                ": 6145 bytes is not a whole number of 3073-byte records (truncated, or not the "
                "binary version?)");
  // A file cut short after it was opened: the record that cannot be read is a SampleError.
  dir.write_bytes("test_batch.bin", test.bytes.data(), test.bytes.size());
  auto val = open("cifar10", {{"root", string_value(dir.path(""))}}, KILN_SPLIT_VAL);
  ASSERT_EQ(::truncate(dir.path("test_batch.bin").c_str(), 3073 + 100), 0);
  EXPECT_NO_THROW(decode(*val, 0));
  try {
    decode(*val, 1);
    ADD_FAILURE() << "no SampleError";
  } catch (const kiln::data::SampleError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path("test_batch.bin") + ": record 1: truncated"),
              std::string::npos)
        << e.what();
  }
}

// ---- tensors ------------------------------------------------------------------------------

std::string shape_json(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

// A safetensors file by hand: 8-byte little-endian header length, the JSON header, the data.
void write_safetensors(const kiln::test::Scratch& dir, const std::string& name,
                       const std::vector<int64_t>& image_shape, const std::vector<uint8_t>& images,
                       const std::vector<int64_t>& labels) {
  const size_t label_bytes = labels.size() * 8;
  std::string header = "{\"images\":{\"dtype\":\"U8\",\"shape\":" + shape_json(image_shape) +
                       ",\"data_offsets\":[0," + std::to_string(images.size()) +
                       "]},\"labels\":{\"dtype\":\"I64\",\"shape\":[" +
                       std::to_string(labels.size()) + "],\"data_offsets\":[" +
                       std::to_string(images.size()) + "," +
                       std::to_string(images.size() + label_bytes) + "]}}";
  while (header.size() % 8 != 0) header += ' ';
  std::vector<uint8_t> file(8);
  uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) file[static_cast<size_t>(k)] = static_cast<uint8_t>(n >> (8 * k));
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), images.begin(), images.end());
  for (int64_t label : labels) {
    for (int k = 0; k < 8; ++k)
      file.push_back(static_cast<uint8_t>(static_cast<uint64_t>(label) >> (8 * k)));
  }
  dir.write_bytes(name, file.data(), file.size());
}

TEST(TensorsDataset, BothLayoutsAndGray) {
  kiln::test::Scratch dir;
  const int64_t n = 6, c = 3, h = 4, w = 5;
  const std::vector<uint8_t> nhwc = random_bytes(static_cast<size_t>(n * h * w * c), 21);
  // The same images stored N x C x H x W.
  std::vector<uint8_t> nchw(nhwc.size());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < h * w; ++p) {
      for (int64_t k = 0; k < c; ++k) {
        nchw[static_cast<size_t>(((i * c + k) * h * w) + p)] =
            nhwc[static_cast<size_t>((i * h * w + p) * c + k)];
      }
    }
  }
  const std::vector<int64_t> labels = {0, 3, 1, 6, 2, 3};
  write_safetensors(dir, "nhwc.safetensors", {n, h, w, c}, nhwc, labels);
  write_safetensors(dir, "nchw.safetensors", {n, c, h, w}, nchw, labels);
  auto a = open("tensors", {{"train", string_value(dir.path("nhwc.safetensors"))}});
  auto b = open("tensors", {{"train", string_value(dir.path("nchw.safetensors"))},
                            {"layout", string_value("nchw")}});
  for (const auto* s : {a.get(), b.get()}) {
    EXPECT_EQ(s->size(), n);
    EXPECT_EQ(s->num_classes(), 7);
    EXPECT_EQ(s->channels(), c);
    EXPECT_EQ(s->fixed_height(), h);
    EXPECT_EQ(s->fixed_width(), w);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(s->probe(i).label, labels[static_cast<size_t>(i)]);
      EXPECT_EQ(decode(*s, i), std::vector<uint8_t>(nhwc.begin() + i * h * w * c,
                                                    nhwc.begin() + (i + 1) * h * w * c));
    }
  }
  write_safetensors(dir, "gray.safetensors", {n, h, w},
                    std::vector<uint8_t>(nhwc.begin(), nhwc.begin() + n * h * w), labels);
  auto g = open("tensors", {{"train", string_value(dir.path("gray.safetensors"))}});
  EXPECT_EQ(g->channels(), 1);
  EXPECT_EQ(decode(*g, 2),
            std::vector<uint8_t>(nhwc.begin() + 2 * h * w, nhwc.begin() + 3 * h * w));
  // Refusals: no validation file, a tensor that is not there, a label past num_classes.
  EXPECT_EQ(
      refusal("tensors", {{"train", string_value(dir.path("gray.safetensors"))}}, KILN_SPLIT_VAL),
      "tensors: option 'val' is empty: no validation file");
  EXPECT_EQ(refusal("tensors", {{"train", string_value(dir.path("gray.safetensors"))},
                                {"images", string_value("pixels")}}),
            "tensors: " + dir.path("gray.safetensors") +
                ": no tensor 'pixels' (option 'images'); the file holds 'images', 'labels'");
  EXPECT_NE(refusal("tensors", {{"train", string_value(dir.path("gray.safetensors"))},
                                {"num_classes", int_value(5)}})
                .find("label 6 of sample 3 is outside [0, 5)"),
            std::string::npos);
  // With the class count taken from the labels (num_classes = 0) there is no range to quote.
  std::vector<int64_t> negative = labels;
  negative[2] = -1;
  write_safetensors(dir, "negative.safetensors", {n, h, w},
                    std::vector<uint8_t>(nhwc.begin(), nhwc.begin() + n * h * w), negative);
  EXPECT_EQ(refusal("tensors", {{"train", string_value(dir.path("negative.safetensors"))}}),
            "tensors: " + dir.path("negative.safetensors") +
                ": label -1 of sample 2 is negative: labels are class indices 0, 1, 2, ...");
}

// A safetensors file of gray images and a labels tensor of any dtype and shape, by hand.
void write_rows(const kiln::test::Scratch& dir, const std::string& name, int64_t n, int64_t h,
                int64_t w, const std::string& dtype, const std::vector<int64_t>& label_shape,
                const std::vector<uint8_t>& label_bytes) {
  const std::vector<uint8_t> images = random_bytes(static_cast<size_t>(n * h * w), 7);
  std::string header = "{\"images\":{\"dtype\":\"U8\",\"shape\":" + shape_json({n, h, w}) +
                       ",\"data_offsets\":[0," + std::to_string(images.size()) +
                       "]},\"labels\":{\"dtype\":\"" + dtype +
                       "\",\"shape\":" + shape_json(label_shape) + ",\"data_offsets\":[" +
                       std::to_string(images.size()) + "," +
                       std::to_string(images.size() + label_bytes.size()) + "]}}";
  while (header.size() % 8 != 0) header += ' ';
  std::vector<uint8_t> file(8);
  const uint64_t length = header.size();
  for (int k = 0; k < 8; ++k)
    file[static_cast<size_t>(k)] = static_cast<uint8_t>(length >> (8 * k));
  file.insert(file.end(), header.begin(), header.end());
  file.insert(file.end(), images.begin(), images.end());
  file.insert(file.end(), label_bytes.begin(), label_bytes.end());
  dir.write_bytes(name, file.data(), file.size());
}

std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A 2-D labels tensor is multi-label target rows (ABI 1.10): uint8 or bool 0/1, float32 in
// [0, 1]; the class count is the rows' width.
TEST(TensorsDataset, TwoDimensionalLabelsAreMultiLabelRows) {
  kiln::test::Scratch dir;
  const int64_t n = 3, classes = 4;
  const std::vector<uint8_t> bits = {1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  write_rows(dir, "u8.safetensors", n, 2, 2, "U8", {n, classes}, bits);
  const std::vector<float> soft = {0.25F, 1.0F, 0.0F, 0.5F, 0.1F, 0.2F,
                                   0.3F,  0.4F, 1.0F, 1.0F, 0.0F, 0.75F};
  write_rows(dir, "f32.safetensors", n, 2, 2, "F32", {n, classes}, float_bytes(soft));
  auto u8 = open("tensors", {{"train", string_value(dir.path("u8.safetensors"))}});
  auto f32 = open("tensors", {{"train", string_value(dir.path("f32.safetensors"))},
                              {"num_classes", int_value(classes)}});
  std::vector<float> row(classes);
  for (const auto* s : {u8.get(), f32.get()}) {
    EXPECT_TRUE(s->multi_label());
    EXPECT_EQ(s->num_classes(), classes);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(s->probe(i).label, 0);
      s->targets(i, row.data());
      for (int64_t k = 0; k < classes; ++k) {
        const size_t at = static_cast<size_t>(i * classes + k);
        EXPECT_EQ(row[static_cast<size_t>(k)], s == u8.get() ? bits[at] : soft[at]) << i << k;
      }
    }
  }
  // Refusals name the file, the sample and the class, or the option.
  std::vector<uint8_t> two = bits;
  two[6] = 2;
  write_rows(dir, "two.safetensors", n, 2, 2, "U8", {n, classes}, two);
  EXPECT_NE(refusal("tensors", {{"train", string_value(dir.path("two.safetensors"))}})
                .find("sample 1, class 2 is 2; uint8 targets are 0 or 1"),
            std::string::npos);
  std::vector<float> high = soft;
  high[11] = 1.5F;
  write_rows(dir, "high.safetensors", n, 2, 2, "F32", {n, classes}, float_bytes(high));
  EXPECT_NE(refusal("tensors", {{"train", string_value(dir.path("high.safetensors"))}})
                .find("sample 2, class 3 is 1.500000; float targets lie in [0, 1]"),
            std::string::npos);
  write_rows(dir, "i64.safetensors", n, 2, 2, "I64", {n, 1}, std::vector<uint8_t>(n * 8, 0));
  EXPECT_NE(refusal("tensors", {{"train", string_value(dir.path("i64.safetensors"))}})
                .find("is I64; multi-label targets ([N, classes]) are U8, BOOL or F32"),
            std::string::npos);
  EXPECT_NE(refusal("tensors", {{"train", string_value(dir.path("u8.safetensors"))},
                                {"num_classes", int_value(3)}})
                .find("has 4 classes per row; option 'num_classes' says 3"),
            std::string::npos);
}

// ---- synthetic ----------------------------------------------------------------------------

TEST(SyntheticDataset, TheHostsPixelsForTheSameSeed) {
  for (const auto& [channels, height, width, seed] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 28, 28, 0}, {3, 9, 13, 42}, {2, 1, 1, 7}}) {
    const int64_t n_train = 700, n_test = 90, classes = 7;
    kiln::data::SyntheticSpec spec;
    spec.samples = n_train + n_test;
    spec.num_classes = classes;
    spec.channels = channels;
    spec.height = height;
    spec.width = width;
    spec.seed = static_cast<uint64_t>(seed);
    const kiln::data::Dataset want = kiln::data::make_synthetic(spec);
    const std::vector<std::pair<std::string, Value>> set = {
        {"synthetic_train", int_value(n_train)},
        {"synthetic_test", int_value(n_test)},
        {"synthetic_classes", int_value(classes)},
        {"channels", int_value(channels)},
        {"height", int_value(height)},
        {"width", int_value(width)}};
    // The run's seed reaches the dataset through kiln_dataset_open.seed.
    auto train = open("synthetic", set, KILN_SPLIT_TRAIN, static_cast<uint64_t>(seed));
    auto val = open("synthetic", set, KILN_SPLIT_VAL, static_cast<uint64_t>(seed));
    ASSERT_EQ(train->size(), n_train);
    ASSERT_EQ(val->size(), n_test);
    const int64_t pixels = channels * height * width;
    const uint8_t* images = want.images.data_ptr<uint8_t>();
    const int64_t* labels = want.labels.data_ptr<int64_t>();
    int mismatches = 0;
    for (int64_t i = 0; i < n_train + n_test; ++i) {
      const DatasetSource& s = i < n_train ? *train : *val;
      const int64_t at = i < n_train ? i : i - n_train;
      if (s.probe(at).label != labels[i] ||
          decode(s, at) != chw_to_hwc(images + i * pixels, channels, height, width)) {
        ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0) << channels << "x" << height << "x" << width << " seed " << seed;
  }
}

// A training split over synthetic_cache_mib (here 1 MiB: 17 samples of 3x224x224, 2.4 MiB) is
// replayed from generator states stored every 13 samples instead: the same pixels on both sides of
// a stored state, the validation split (one sample, 147 KiB) cached.
TEST(SyntheticDataset, ALargeSplitReplaysTheSamePixels) {
  const int64_t n_train = 17, n_test = 1, classes = 3, channels = 3, side = 224;
  kiln::data::SyntheticSpec spec;
  spec.samples = n_train + n_test;
  spec.num_classes = classes;
  spec.channels = channels;
  spec.height = side;
  spec.width = side;
  spec.seed = 5;
  const kiln::data::Dataset want = kiln::data::make_synthetic(spec);
  const std::vector<std::pair<std::string, Value>> set = {{"synthetic_train", int_value(n_train)},
                                                          {"synthetic_test", int_value(n_test)},
                                                          {"synthetic_classes", int_value(classes)},
                                                          {"channels", int_value(channels)},
                                                          {"height", int_value(side)},
                                                          {"width", int_value(side)},
                                                          {"synthetic_cache_mib", int_value(1)}};
  auto train = open("synthetic", set, KILN_SPLIT_TRAIN, 5);
  auto val = open("synthetic", set, KILN_SPLIT_VAL, 5);
  const int64_t pixels = channels * side * side;
  const uint8_t* images = want.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i <= n_train; ++i) {
    const DatasetSource& s = i < n_train ? *train : *val;
    const int64_t at = i < n_train ? i : i - n_train;
    EXPECT_EQ(decode(s, at), chw_to_hwc(images + i * pixels, channels, side, side))
        << "sample " << i;
  }
}

}  // namespace
