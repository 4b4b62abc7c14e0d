// Walks an autograd graph: the checkpointed segments' nodes behind a result.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace kiln_test {

// Every node reachable from `t`'s grad_fn whose name contains "CheckpointFunction".
inline std::vector<std::shared_ptr<torch::autograd::Node>> checkpoint_nodes(const at::Tensor& t) {
  std::vector<std::shared_ptr<torch::autograd::Node>> found, stack;
  std::set<torch::autograd::Node*> seen;
  if (t.grad_fn()) stack.push_back(t.grad_fn());
  while (!stack.empty()) {
    std::shared_ptr<torch::autograd::Node> node = stack.back();
    stack.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    if (node->name().find("CheckpointFunction") != std::string::npos) found.push_back(node);
    for (const torch::autograd::Edge& e : node->next_edges()) stack.push_back(e.function);
  }
  return found;
}

}  // namespace kiln_test
