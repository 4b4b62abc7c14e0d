// Small helpers the model tests share: parameter counts and names, a training step.
#pragma once

#include <ATen/Functions.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>

#include "kiln/torch.hpp"

namespace kiln_test {

inline int64_t parameter_count(const kiln::Model& model) {
  int64_t count = 0;
  for (const at::Tensor& p : model.parameters()) count += p.numel();
  return count;
}

inline std::set<std::string> parameter_names(const kiln::Model& model) {
  std::set<std::string> names;
  for (const auto& item : model.named_parameters()) names.insert(item.key());
  return names;
}

inline at::Tensor parameter(const kiln::Model& model, const std::string& name) {
  // The dict must outlive the pointer find() returns into it.
  const auto params = model.named_parameters();
  const at::Tensor* p = params.find(name);
  if (p == nullptr) throw std::runtime_error("no parameter " + name);
  return *p;
}

// Forward on random images, cross-entropy, backward; expects the [N, classes] logits shape and
// a finite, nonzero gradient on every parameter.
inline void expect_trains(kiln::Model& model, int64_t batch, int64_t channels, int64_t height,
                          int64_t width, int64_t classes) {
  at::manual_seed(0);
  at::Tensor images = at::randn({batch, channels, height, width});
  at::Tensor labels = at::randint(classes, {batch}, at::kLong);
  at::Tensor logits = model.forward(images);
  ASSERT_EQ(logits.sizes(), at::IntArrayRef({batch, classes}));
  at::cross_entropy_loss(logits, labels).backward();
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& grad = item.value().grad();
    ASSERT_TRUE(grad.defined()) << item.key();
    EXPECT_TRUE(at::isfinite(grad).all().item<bool>()) << item.key();
    EXPECT_GT(grad.abs().sum().item<double>(), 0.0) << item.key();
  }
}

}  // namespace kiln_test
