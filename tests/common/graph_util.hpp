// Walks an autograd graph: the nodes of a kind behind a result.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace kiln_test {

// Every node reachable from `t`'s grad_fn whose name contains `part` (a custom function's node
// is named after its type, so its class name matches).
inline std::vector<std::shared_ptr<torch::autograd::Node>> nodes_named(const at::Tensor& t,
                                                                       const std::string& part) {
  std::vector<std::shared_ptr<torch::autograd::Node>> found, stack;
  std::set<torch::autograd::Node*> seen;
  if (t.grad_fn()) stack.push_back(t.grad_fn());
  while (!stack.empty()) {
    std::shared_ptr<torch::autograd::Node> node = stack.back();
    stack.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    if (node->name().find(part) != std::string::npos) found.push_back(node);
    for (const torch::autograd::Edge& e : node->next_edges()) stack.push_back(e.function);
  }
  return found;
}

// The checkpointed segments' nodes behind `t`.
inline std::vector<std::shared_ptr<torch::autograd::Node>> checkpoint_nodes(const at::Tensor& t) {
  return nodes_named(t, "CheckpointFunction");
}

}  // namespace kiln_test
