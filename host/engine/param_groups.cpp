#include "engine/param_groups.hpp"

namespace kiln::engine {

std::vector<ParamGroup> build_param_groups(const torch::nn::Module& model) {
  ParamGroup all;
  all.name = "default";
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    all.params.push_back(item.value());
    all.names.push_back(item.key());
  }
  return {std::move(all)};
}

}  // namespace kiln::engine
