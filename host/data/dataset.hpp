// In-memory image classification datasets: Fashion-MNIST from IDX files and a synthetic one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace kiln::data {

// Images are kept as uint8 N×C×H×W (what IDX stores); batches are normalised floats.
struct Dataset {
  at::Tensor images;  // uint8, N×C×H×W, contiguous, CPU
  at::Tensor labels;  // int64, N, CPU; or float32 N×classes target rows (multi-label)
  int64_t num_classes = 0;
  int64_t size() const { return labels.size(0); }
};

// Reads an IDX image file (magic 0x00000803) and label file (0x00000801), gzip-compressed or
// plain, as files from elsewhere (data/idx.hpp). Throws io::BadFileError (a std::runtime_error)
// naming the path and what was wrong (missing file, bad magic, dimensions that overflow, data
// shorter or longer than the header claims, counts that disagree, a label out of range).
Dataset load_idx(const std::string& images_path, const std::string& labels_path,
                 int64_t num_classes = 10);

// Fashion-MNIST split "train" or "test" from `root` (train-images-idx3-ubyte.gz, ...).
Dataset load_fashion_mnist(const std::string& root, const std::string& split);

// A learnable synthetic dataset: each class has a fixed random prototype image; samples are the
// prototype plus noise, so a model can reach high accuracy quickly. Deterministic in `seed`.
struct SyntheticSpec {
  int64_t samples = 1024;
  int64_t num_classes = 10;
  int64_t channels = 1;
  int64_t height = 28;
  int64_t width = 28;
  uint64_t seed = 0;
};
Dataset make_synthetic(const SyntheticSpec& spec);

}  // namespace kiln::data
