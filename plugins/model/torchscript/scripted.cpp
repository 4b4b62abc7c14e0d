#include "scripted.hpp"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <sys/stat.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <unistd.h>

#include <regex>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace kiln_torchscript {
namespace {

using kiln::Error;

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw Error(KILN_ERR_INVALID_ARGUMENT, "torchscript: path '" + path + "': " + what);
}

// The last non-empty line of a c10::Error: the interpreter's own message (the lines above are
// the TorchScript traceback, which names the Python source line).
std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  return last.empty() ? text : last;
}

std::string shape_text(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// Registers `module`'s own parameters and tensor attributes on `node` (sharing the tensors), and
// its children as plain child modules, recursively. A tensor met before (a submodule reachable
// twice) is registered once, under its first name, so the optimizer steps it once.
void mirror(torch::nn::Module& node, const torch::jit::Module& module,
            std::set<const c10::TensorImpl*>& seen) {
  std::set<std::string> parameters;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    parameters.insert(p.name);
    if (!p.value.defined() || !seen.insert(p.value.unsafeGetTensorImpl()).second) continue;
    node.register_parameter(p.name, p.value, p.value.requires_grad());
  }
  // Buffers, and plain tensor attributes too: the host must move and cast every tensor the
  // forward reads, or a CUDA batch would meet a CPU tensor.
  for (const auto& a : module.named_attributes(/*recurse=*/false)) {
    if (!a.value.isTensor() || parameters.count(a.name) != 0) continue;
    const at::Tensor& t = a.value.toTensor();
    if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
    node.register_buffer(a.name, t);
  }
  for (const auto& c : module.named_children()) {
    std::shared_ptr<torch::nn::Module> child;
    const std::string type = c.value.type()->name()->qualifiedName();
    if (is_torch_batch_norm(type)) {
      child = std::make_shared<ScriptedNorm>(c.value);
    } else if (is_torch_other_norm(type)) {
      child = std::make_shared<kiln::NormParameters>();
    } else {
      child = std::make_shared<torch::nn::Module>();
    }
    mirror(*child, c.value, seen);
    node.register_module(c.name, child);
  }
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

bool is_torch_batch_norm(const std::string& qualified_name) {
  static const std::regex batch_norm(
      R"(__torch__\.torch\.nn\.modules\.batchnorm\.(___torch_mangle_\d+\.)?BatchNorm[123]d)");
  return std::regex_match(qualified_name, batch_norm);
}

bool is_torch_other_norm(const std::string& qualified_name) {
  static const std::regex other_norm(
      R"(__torch__\.torch\.nn\.modules\.(normalization\.(___torch_mangle_\d+\.)?(LayerNorm|GroupNorm)|)"
      R"(instancenorm\.(___torch_mangle_\d+\.)?InstanceNorm[123]d))");
  return std::regex_match(qualified_name, other_norm);
}

at::Tensor ScriptedNorm::forward(const at::Tensor& input) {
  return module_.forward({input}).toTensor();
}

ScriptedModel::ScriptedModel(torch::jit::Module module, const ScriptedConfig& config)
    : module_(std::move(module)), config_(config) {
  std::set<const c10::TensorImpl*> seen;
  mirror(*this, module_, seen);
  torch::nn::Module::train(module_.is_training());
}

at::Tensor ScriptedModel::forward(const at::Tensor& input) {
  // Off by default: the graph runs op by op through the dispatcher, as the Python module would
  // eagerly (autocast, autograd and DDP's hooks as for any model).
  torch::jit::GraphOptimizerEnabledGuard optimize(config_.optimize);
  c10::IValue out = module_.forward({input});
  if (!out.isTensor()) {
    throw Error(KILN_ERR_INVALID_ARGUMENT, "torchscript: path '" + config_.path +
                                               "': forward returned " + out.tagKind() +
                                               ", not a tensor of logits");
  }
  return out.toTensor();
}

void ScriptedModel::train(bool on) {
  torch::nn::Module::train(on);
  module_.train(on);
}

std::shared_ptr<ScriptedModel> load_scripted(const ScriptedConfig& config,
                                             const kiln_model_input& input) {
  const std::string& path = config.path;
  if (path.empty()) refuse(path, "empty; name the file torch.jit.save wrote");
  if (!is_file(path)) {
    // A relative path is from the folder kiln runs in, as data.root's: say which that was.
    std::string where;
    if (path[0] != '/') {
      std::vector<char> cwd(4096);
      if (::getcwd(cwd.data(), cwd.size()) != nullptr) {
        where = " (relative to the folder kiln runs in, " + std::string(cwd.data()) + ")";
      }
    }
    refuse(path, "no such file" + where);
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, c10::Device(c10::kCPU));
  } catch (const std::exception& e) {
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    refuse(path,
           "not a TorchScript archive (write one with torch.jit.save(torch.jit.script(model), "
           "path); torch.save of a module or state_dict is not one): " +
               last_line(c10_error != nullptr ? c10_error->what_without_backtrace() : e.what()));
  }
  if (!module.find_method("forward")) refuse(path, "the module has no forward method");
  if (module.named_parameters(/*recurse=*/true).size() == 0) {
    refuse(path,
           "the module has no parameters to train (a frozen module, torch.jit.freeze, holds its "
           "weights as constants)");
  }
  auto model = std::make_shared<ScriptedModel>(std::move(module), config);

  // The data's shape: one zero image in eval mode, without gradients (batch norm's running
  // statistics stay as saved), then the saved mode back.
  const std::vector<int64_t> shape = {1, input.channels, input.height, input.width};
  const bool training = model->is_training();
  at::Tensor out;
  try {
    const at::NoGradGuard no_grad;
    model->train(false);
    out = model->forward(at::zeros(shape));
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    refuse(path, "forward on a zero batch of the dataset's shape " + shape_text(shape) +
                     " failed: " + last_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // The interpreter rethrows an operator's error as a std::runtime_error with its traceback.
    refuse(path, "forward on a zero batch of the dataset's shape " + shape_text(shape) +
                     " failed: " + last_line(e.what()));
  }
  model->train(training);
  if (out.dim() != 2 || out.size(0) != 1 || out.size(1) != input.num_classes) {
    refuse(path, "forward on a batch of the dataset's shape " + shape_text(shape) + " gave " +
                     shape_text(out.sizes()) + "; the dataset wants logits [1, " +
                     std::to_string(input.num_classes) + "] (" + std::to_string(input.num_classes) +
                     " classes)");
  }
  return model;
}

}  // namespace kiln_torchscript
