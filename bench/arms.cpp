#include "arms.hpp"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/randn.h>
#include <torch/optim/adagrad.h>
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

// The hyperparameters every implementation of an optimizer gets (the driver's HYPER has the same).
struct Hyper {
  double lr;
  double weight_decay;
  std::map<std::string, std::string> options;  // plugin options as TOML literals
  std::string inner = "";  // a wrapper's inner optimizer (its Hyper gives the inner's options)
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
      // The built-in optimizers of ABI 1.14, with torch.optim's (or the reference package's)
      // defaults where they have one.
      {"nadam",
       {2e-3,
        0.01,
        {{"beta1", "0.9"},
         {"beta2", "0.999"},
         {"eps", "1e-8"},
         {"momentum_decay", "4e-3"},
         {"decoupled_weight_decay", "false"}}}},
      {"radam",
       {1e-3,
        0.01,
        {{"beta1", "0.9"},
         {"beta2", "0.999"},
         {"eps", "1e-8"},
         {"decoupled_weight_decay", "false"}}}},
      {"adamax", {2e-3, 0.01, {{"beta1", "0.9"}, {"beta2", "0.999"}, {"eps", "1e-8"}}}},
      {"adagrad",
       {0.01, 1e-4, {{"lr_decay", "0.0"}, {"initial_accumulator_value", "0.0"}, {"eps", "1e-10"}}}},
      {"adadelta", {1.0, 1e-4, {{"rho", "0.9"}, {"eps", "1e-6"}}}},
      {"asgd", {0.01, 1e-4, {{"lambd", "1e-4"}, {"alpha", "0.75"}, {"t0", "1e6"}}}},
      // torch.optim.Rprop has no weight decay (the plugin refuses any).
      {"rprop",
       {0.01,
        0.0,
        {{"etaminus", "0.5"},
         {"etaplus", "1.2"},
         {"step_size_min", "1e-6"},
         {"step_size_max", "50.0"}}}},
      // eps1 = -1: torch's eps = (None, ...), the dtype's machine epsilon.
      {"adafactor",
       {0.01, 0.01, {{"beta2_decay", "-0.8"}, {"eps1", "-1.0"}, {"eps2", "1e-3"}, {"d", "1.0"}}}},
      {"sgd_schedulefree",
       {0.1,
        1e-4,
        {{"momentum", "0.9"}, {"warmup_steps", "0"}, {"r", "0.0"}, {"weight_lr_power", "2.0"}}}},
      {"adamw_schedulefree",
       {2.5e-3,
        0.01,
        {{"beta1", "0.9"},
         {"beta2", "0.999"},
         {"eps", "1e-8"},
         {"warmup_steps", "0"},
         {"r", "0.0"},
         {"weight_lr_power", "2.0"}}}},
      {"muon",
       {0.02,
        0.01,
        {{"momentum", "0.95"},
         {"nesterov", "true"},
         {"ns_a", "3.4445"},
         {"ns_b", "-4.775"},
         {"ns_c", "2.0315"},
         {"eps", "1e-7"},
         {"ns_steps", "5"},
         {"adjust_lr_fn", "\"original\""}}}},
      // Over "adamw" (its lr and weight decay are the group's, so they are AdamW's here).
      {"lookahead",
       {1e-3, 0.01, {{"k", "5"}, {"alpha", "0.5"}, {"pullback_momentum", "\"none\""}}, "adamw"}},
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
  // `inner`: a wrapper's inner optimizer (nullptr for none), with the options of `inner_hyper`.
  KilnArm(const plugin::Component& component, const Hyper& h, const Workload& work,
          const plugin::Component* inner = nullptr, const Hyper* inner_hyper = nullptr)
      : options_(plugin_options(component, h.options)),
        inner_options_(inner != nullptr ? plugin_options(*inner, inner_hyper->options)
                                        : config::OptionSet()),
        adapter_(component, options_, nullptr, inner, inner != nullptr ? &inner_options_ : nullptr),
        params_(fresh_params(work)),
        names_(work.names),
        description_("Kiln '" + std::string(component.name()) + "' plugin (" +
                     component.library_path + "): " + describe(options_) +
                     (inner != nullptr ? "; inner '" + std::string(inner->name()) + "' (" +
                                             inner->library_path + "): " + describe(inner_options_)
                                       : std::string()) +
                     "; " + rates(h) + "; " + std::to_string(work.init.size()) + " tensors") {
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
  config::OptionSet inner_options_;
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
    } else if (optimizer == "adagrad") {
      optimizer_ =
          std::make_unique<torch::optim::Adagrad>(params_, torch::optim::AdagradOptions(h.lr)
                                                               .lr_decay(0.0)
                                                               .weight_decay(h.weight_decay)
                                                               .initial_accumulator_value(0.0)
                                                               .eps(1e-10));
      description_ =
          "torch::optim::Adagrad: lr_decay 0, initial_accumulator_value 0, eps 1e-10; " + rates(h);
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

Workload workload_for(const std::string& optimizer, const Workload& resnet) {
  if (optimizer != "muon") return resnet;
  Workload work;
  for (size_t i = 0; i < resnet.init.size(); ++i) {
    const at::Tensor& p = resnet.init[i];
    if (p.dim() < 2) continue;
    work.names.push_back(resnet.names[i]);
    work.init.push_back(p.reshape({p.size(0), -1}));
    work.grads.push_back(resnet.grads[i].reshape({p.size(0), -1}));
  }
  return work;
}

std::unique_ptr<Arm> make_kiln_arm(const plugin::Registry& registry, const std::string& optimizer,
                                   const Workload& work, std::string& skip) {
  const Hyper& h = hyper(optimizer);
  const plugin::Component* c = registry.find(KILN_COMPONENT_OPTIMIZER, optimizer);
  const plugin::Component* inner =
      h.inner.empty() ? nullptr : registry.find(KILN_COMPONENT_OPTIMIZER, h.inner);
  for (const auto& [name, found] : {std::pair{optimizer, c}, std::pair{h.inner, inner}}) {
    if (!name.empty() && found == nullptr) {
      skip = "no Kiln optimizer plugin '" + name + "' in the plugin folder";
      return nullptr;
    }
  }
  if (inner == nullptr) return std::make_unique<KilnArm>(*c, h, work);
  return std::make_unique<KilnArm>(*c, h, work, inner, &hyper(h.inner));
}

std::unique_ptr<Arm> make_torch_arm(const std::string& optimizer, const Workload& work) {
  return std::make_unique<TorchArm>(optimizer, hyper(optimizer), work);
}

}  // namespace kiln::bench
