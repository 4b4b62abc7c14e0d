// Models from the built plugins (mlp, vit, resnet) through the host's loader, with their norm
// layers from a norm plugin (batchnorm, inplace_abn), for the engine's tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/options.hpp"
#include "kiln/torch.hpp"

namespace kiln_test {

// Model `name` built with `options` for c x hw x hw images and 5 classes, its norm layers from
// `norm_name` (momentum 0.1, eps 1e-5, affine, tracking running statistics), in training mode.
std::shared_ptr<kiln::Model> build_model(const std::string& name,
                                         const kiln::config::OptionSet& options, int64_t c,
                                         int64_t hw, const std::string& norm_name = "batchnorm");

}  // namespace kiln_test
