#include "data/dataset.hpp"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "data/idx.hpp"
#include "io/untrusted.hpp"

namespace kiln::data {
namespace {

at::Tensor read_images(const std::string& path) {
  const IdxBytes idx = read_idx_ubyte(path, 3, "image", "pixel data");
  const uint64_t n = idx.dims[0], rows = idx.dims[1], cols = idx.dims[2];
  if (rows == 0 || cols == 0) {
    throw io::BadFileError(path + ": image dimensions " + std::to_string(n) + "x" +
                           std::to_string(rows) + "x" + std::to_string(cols) +
                           ": rows and columns must be > 0");
  }
  // Each dimension came from a u32, and their product is the data read: all fit int64_t.
  at::Tensor images = at::empty(
      {static_cast<int64_t>(n), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
      at::kByte);
  if (!idx.data.empty()) std::memcpy(images.data_ptr<uint8_t>(), idx.data.data(), idx.data.size());
  return images;
}

std::vector<uint8_t> read_labels(const std::string& path) {
  return read_idx_ubyte(path, 1, "label", "label data").data;
}

// Unbiased enough for our sizes (n << 2^64) and, unlike std::uniform_int_distribution,
// identical on every standard library.
uint64_t below(std::mt19937_64& gen, uint64_t n) { return gen() % n; }

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                 int64_t num_classes) {
  if (num_classes <= 0) {
    throw std::runtime_error("load_idx: num_classes must be positive, got " +
                             std::to_string(num_classes));
  }
  at::Tensor images = read_images(images_path);
  const std::vector<uint8_t> raw = read_labels(labels_path);
  const auto n = static_cast<int64_t>(raw.size());
  if (images.size(0) != n) {
    throw io::BadFileError(images_path + ": " + std::to_string(images.size(0)) + " images but " +
                           labels_path + " has " + std::to_string(n) + " labels");
  }
  at::Tensor labels = at::empty({n}, at::kLong);
  int64_t* out = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (raw[i] >= num_classes) {
      throw io::BadFileError(labels_path + ": label " + std::to_string(raw[i]) +
                             " out of range for " + std::to_string(num_classes) +
                             " classes (sample " + std::to_string(i) + ")");
    }
    out[i] = raw[i];
  }
  return Dataset{std::move(images), std::move(labels), num_classes};
}

Dataset load_fashion_mnist(const std::string& root, const std::string& split) {
  std::string prefix;
  if (split == "train") {
    prefix = "train";
  } else if (split == "test") {
    prefix = "t10k";
  } else {
    throw std::runtime_error("load_fashion_mnist: unknown split '" + split +
                             "' (expected \"train\" or \"test\")");
  }
  std::string dir = root;
  if (!dir.empty() && dir.back() != '/') dir += '/';
  return load_idx(dir + prefix + "-images-idx3-ubyte.gz", dir + prefix + "-labels-idx1-ubyte.gz",
                  10);
}

Dataset make_synthetic(const SyntheticSpec& spec) {
  if (spec.samples < 0 || spec.num_classes <= 0 || spec.channels <= 0 || spec.height <= 0 ||
      spec.width <= 0) {
    throw std::runtime_error(
        "make_synthetic: samples must be >= 0 and classes, channels, height, width positive");
  }
  std::mt19937_64 gen(spec.seed);
  const int64_t pixels = spec.channels * spec.height * spec.width;

  // Prototypes are bilinear upsamplings of a coarse random grid: smooth images stay recognisable
  // under the small shifts that random-crop augmentation applies.
  constexpr int64_t kGrid = 4;
  std::vector<uint8_t> prototypes(static_cast<size_t>(spec.num_classes * pixels));
  for (int64_t k = 0; k < spec.num_classes; ++k) {
    for (int64_t c = 0; c < spec.channels; ++c) {
      double grid[kGrid][kGrid];
      for (auto& row : grid) {
        for (double& v : row) v = static_cast<double>(below(gen, 256));
      }
      uint8_t* plane = prototypes.data() + (k * spec.channels + c) * spec.height * spec.width;
      for (int64_t y = 0; y < spec.height; ++y) {
        const double gy = spec.height > 1 ? double(y) * (kGrid - 1) / double(spec.height - 1) : 0;
        const int64_t y0 = std::min<int64_t>(static_cast<int64_t>(gy), kGrid - 2);
        const double fy = gy - double(y0);
        for (int64_t x = 0; x < spec.width; ++x) {
          const double gx = spec.width > 1 ? double(x) * (kGrid - 1) / double(spec.width - 1) : 0;
          const int64_t x0 = std::min<int64_t>(static_cast<int64_t>(gx), kGrid - 2);
          const double fx = gx - double(x0);
          const double top = grid[y0][x0] * (1 - fx) + grid[y0][x0 + 1] * fx;
          const double bottom = grid[y0 + 1][x0] * (1 - fx) + grid[y0 + 1][x0 + 1] * fx;
          // + 0.5 and truncation, not lround: the synthetic images stay the bytes they were.
          // NOLINTNEXTLINE(bugprone-incorrect-roundings)
          plane[y * spec.width + x] = static_cast<uint8_t>(top * (1 - fy) + bottom * fy + 0.5);
        }
      }
    }
  }

  // Balanced labels (i mod classes), Fisher-Yates shuffled with our own portable draws.
  at::Tensor labels = at::empty({spec.samples}, at::kLong);
  int64_t* lab = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < spec.samples; ++i) lab[i] = i % spec.num_classes;
  for (int64_t i = spec.samples - 1; i > 0; --i) {
    std::swap(lab[i], lab[below(gen, static_cast<uint64_t>(i) + 1)]);
  }

  // Samples: prototype + uniform noise in [-48, 48], clamped; eight noise draws per 64-bit word.
  at::Tensor images = at::empty({spec.samples, spec.channels, spec.height, spec.width}, at::kByte);
  uint8_t* img = images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < spec.samples; ++i) {
    const uint8_t* proto = prototypes.data() + lab[i] * pixels;
    uint8_t* dst = img + i * pixels;
    uint64_t bits = 0;
    for (int64_t p = 0; p < pixels; ++p) {
      if (p % 8 == 0) bits = gen();
      const int noise = static_cast<int>(bits & 0xff) % 97 - 48;
      bits >>= 8;
      dst[p] = static_cast<uint8_t>(std::clamp(int{proto[p]} + noise, 0, 255));
    }
  }
  return Dataset{std::move(images), std::move(labels), spec.num_classes};
}

}  // namespace kiln::data
