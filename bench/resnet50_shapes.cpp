#include "resnet50_shapes.hpp"

namespace kiln::bench {
namespace {

void add_bn(std::vector<ParamShape>& out, const std::string& prefix, int64_t channels) {
  out.push_back({prefix + ".weight", {channels}});
  out.push_back({prefix + ".bias", {channels}});
}

}  // namespace

std::vector<ParamShape> resnet50_parameter_shapes(int64_t num_classes) {
  constexpr int64_t kExpansion = 4;
  const int64_t blocks[] = {3, 4, 6, 3};
  const int64_t widths[] = {64, 128, 256, 512};
  std::vector<ParamShape> out;
  out.push_back({"conv1.weight", {64, 3, 7, 7}});
  add_bn(out, "bn1", 64);
  int64_t inplanes = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t planes = widths[layer];
    for (int64_t b = 0; b < blocks[layer]; ++b) {
      const std::string p = "layer" + std::to_string(layer + 1) + "." + std::to_string(b) + ".";
      out.push_back({p + "conv1.weight", {planes, inplanes, 1, 1}});
      add_bn(out, p + "bn1", planes);
      out.push_back({p + "conv2.weight", {planes, planes, 3, 3}});
      add_bn(out, p + "bn2", planes);
      out.push_back({p + "conv3.weight", {planes * kExpansion, planes, 1, 1}});
      add_bn(out, p + "bn3", planes * kExpansion);
      // Every layer's first block changes width (and layers 2-4 the stride): a 1x1 projection.
      if (b == 0) {
        out.push_back({p + "downsample.0.weight", {planes * kExpansion, inplanes, 1, 1}});
        add_bn(out, p + "downsample.1", planes * kExpansion);
      }
      inplanes = planes * kExpansion;
    }
  }
  out.push_back({"fc.weight", {num_classes, inplanes}});
  out.push_back({"fc.bias", {num_classes}});
  return out;
}

}  // namespace kiln::bench
