// The parameters of torchvision's resnet50 (Bottleneck blocks [3, 4, 6, 3]), by name and shape in
// torchvision's order: 161 tensors, 25,557,032 values for 1000 classes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::bench {

struct ParamShape {
  std::string name;  // torchvision's name ("layer1.0.downsample.0.weight")
  std::vector<int64_t> shape;
};

std::vector<ParamShape> resnet50_parameter_shapes(int64_t num_classes = 1000);

}  // namespace kiln::bench
