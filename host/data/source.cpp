#include "data/source.hpp"

#include <ATen/ops/all.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/le.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace kiln::data {

TensorSource::TensorSource(at::Tensor images, at::Tensor labels, int64_t num_classes, Layout layout)
    : images_(images.contiguous()),
      labels_(labels.contiguous()),
      num_classes_(num_classes),
      layout_(layout) {
  if (images_.scalar_type() != at::kByte || images_.dim() != 4) {
    throw std::invalid_argument("images must be a uint8 tensor of 4 dimensions");
  }
  if (num_classes_ < 1) throw std::invalid_argument("num_classes must be at least 1");
  if (labels_.dim() == 2) {
    if (labels_.scalar_type() != at::kFloat || labels_.size(0) != images_.size(0) ||
        labels_.size(1) != num_classes_) {
      throw std::invalid_argument(
          "multi-label targets must be float32, one row of num_classes values per image");
    }
    if (labels_.numel() > 0 &&
        !(labels_.ge(0.0).all().item<bool>() && labels_.le(1.0).all().item<bool>())) {
      throw std::invalid_argument("multi-label targets must lie in [0, 1]");
    }
  } else if (labels_.scalar_type() != at::kLong || labels_.dim() != 1 ||
             labels_.size(0) != images_.size(0)) {
    throw std::invalid_argument("labels must be an int64 vector with one label per image");
  } else if (labels_.numel() > 0) {
    const int64_t lo = labels_.min().item<int64_t>(), hi = labels_.max().item<int64_t>();
    if (lo < 0 || hi >= num_classes_) {
      throw std::invalid_argument("label " + std::to_string(lo < 0 ? lo : hi) +
                                  " out of range for " + std::to_string(num_classes_) + " classes");
    }
  }
  const bool nchw = layout_ == Layout::NCHW;
  channels_ = images_.size(nchw ? 1 : 3);
  height_ = images_.size(nchw ? 2 : 1);
  width_ = images_.size(nchw ? 3 : 2);
}

std::string Source::sample_name(int64_t index) const { return "sample " + std::to_string(index); }

void Source::targets(int64_t /*index*/, float* /*out*/) const {
  throw std::logic_error("targets() of a source with one class per sample");
}

SampleHeader TensorSource::probe(int64_t index) const {
  return {height_, width_, multi_label() ? 0 : labels_.data_ptr<int64_t>()[index]};
}

void TensorSource::targets(int64_t index, float* out) const {
  if (!multi_label()) Source::targets(index, out);
  const float* row = labels_.data_ptr<float>() + index * num_classes_;
  std::copy(row, row + num_classes_, out);
}

DecodedSample TensorSource::decode(int64_t index, int /*scale_denom*/, uint8_t* pixels,
                                   size_t capacity) const {
  const int64_t plane = height_ * width_;
  const auto bytes = static_cast<size_t>(plane * channels_);
  if (capacity < bytes) throw std::invalid_argument("decode buffer too small");
  const uint8_t* src = images_.data_ptr<uint8_t>() + index * plane * channels_;
  if (layout_ == Layout::NHWC || channels_ == 1) {
    std::memcpy(pixels, src, bytes);
  } else {
    for (int64_t c = 0; c < channels_; ++c) {
      const uint8_t* in = src + c * plane;
      for (int64_t p = 0; p < plane; ++p) pixels[p * channels_ + c] = in[p];
    }
  }
  return {height_, width_, probe(index).label, 1};
}

}  // namespace kiln::data
