#include "arms.hpp"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "plugin/adapters.hpp"
#include "plugin_options.hpp"
#include "resnet50_shapes.hpp"

namespace kiln::bench {
namespace {

// The hyperparameters every implementation of an optimizer gets (the driver uses the same).
struct Hyper {
  double lr;
  double weight_decay;
  std::map<std::string, std::string> options;  // plugin options as TOML literals
};
const Hyper& hyper(const std::string& optimizer) {
  // AdamW's betas under the spellings a plugin may use; unknown ones are skipped.
  static const std::map<std::string, Hyper> table = {
      {"sgd", {0.01, 1e-4, {{"momentum", "0.9"}, {"dampening", "0.0"}, {"nesterov", "false"}}}},
      {"adamw",
       {1e-3,
        0.01,
        {{"beta1", "0.9"},
         {"beta2", "0.999"},
         {"betas", "[0.9, 0.999]"},
         {"eps", "1e-8"},
         {"amsgrad", "false"}}}},
      {"lion", {1e-4, 0.01, {{"beta1", "0.9"}, {"beta2", "0.99"}}}},
  };
  auto it = table.find(optimizer);
  if (it == table.end()) throw std::runtime_error("unknown optimizer '" + optimizer + "'");
  return it->second;
}

std::string rates(const Hyper& h) {
  std::ostringstream out;
  out << "lr " << h.lr << ", weight_decay " << h.weight_decay;
  return out.str();
}

// Fresh leaf parameters equal to the workload's initial values, with the shared gradients.
std::vector<at::Tensor> fresh_params(const Workload& work) {
  std::vector<at::Tensor> params;
  for (size_t i = 0; i < work.init.size(); ++i) {
    at::Tensor p = work.init[i].clone().set_requires_grad(true);
    p.mutable_grad() = work.grads[i];
    params.push_back(p);
  }
  return params;
}

class KilnArm : public Arm {
 public:
  KilnArm(const plugin::Component& component, const Hyper& h, const Workload& work)
      : options_(plugin_options(component, h.options)),
        adapter_(component, options_),
        params_(fresh_params(work)),
        names_(work.names),
        description_("Kiln '" + std::string(component.name()) + "' plugin (" +
                     component.library_path + "): " + describe(options_) + "; " + rates(h)) {
    group_.params = &params_;
    group_.names = &names_;
    group_.lr = h.lr;
    group_.weight_decay = h.weight_decay;
  }
  void step() override {
    ++group_.step;
    adapter_.step(group_);
  }
  std::string description() const override { return description_; }

 private:
  config::OptionSet options_;
  plugin::OptimizerAdapter adapter_;
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  plugin::GroupStep group_;
  std::string description_;
};

class TorchArm : public Arm {
 public:
  TorchArm(const std::string& optimizer, const Hyper& h, const Workload& work)
      : params_(fresh_params(work)) {
    if (optimizer == "sgd") {
      optimizer_ = std::make_unique<torch::optim::SGD>(
          params_, torch::optim::SGDOptions(h.lr).momentum(0.9).weight_decay(h.weight_decay));
      description_ = "torch::optim::SGD: momentum 0.9; " + rates(h);
    } else if (optimizer == "adamw") {
      optimizer_ =
          std::make_unique<torch::optim::AdamW>(params_, torch::optim::AdamWOptions(h.lr)
                                                             .betas({0.9, 0.999})
                                                             .eps(1e-8)
                                                             .weight_decay(h.weight_decay));
      description_ = "torch::optim::AdamW: betas (0.9, 0.999), eps 1e-8; " + rates(h);
    } else {
      throw std::runtime_error("torch::optim has no '" + optimizer + "' to compare with");
    }
  }
  void step() override { optimizer_->step(); }
  std::string description() const override { return description_; }

 private:
  std::vector<at::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::string description_;
};

}  // namespace

Workload make_workload() {
  Workload work;
  at::manual_seed(0);
  for (const ParamShape& p : resnet50_parameter_shapes()) {
    work.names.push_back(p.name);
    // Magnitudes of a trained network's weights and gradients; nothing reaches denormals.
    work.init.push_back(at::randn(p.shape) * 0.02);
    work.grads.push_back(at::randn(p.shape) * 1e-3);
  }
  return work;
}

std::unique_ptr<Arm> make_kiln_arm(const plugin::Registry& registry, const std::string& optimizer,
                                   const Workload& work, std::string& skip) {
  const plugin::Component* c = registry.find(KILN_COMPONENT_OPTIMIZER, optimizer);
  if (c == nullptr) {
    skip = "no Kiln optimizer plugin '" + optimizer + "' in the plugin folder";
    return nullptr;
  }
  return std::make_unique<KilnArm>(*c, hyper(optimizer), work);
}

std::unique_ptr<Arm> make_torch_arm(const std::string& optimizer, const Workload& work) {
  return std::make_unique<TorchArm>(optimizer, hyper(optimizer), work);
}

}  // namespace kiln::bench
