// A TorchScript module (torch.jit.save of a scripted or traced module) as a kiln::Model. Its
// parameters and buffers are registered under their dotted names on a mirror of its submodule
// tree, sharing the module's own tensors: what the host does to them (moving, casting through
// set_data, optimizer steps, checkpoints, freezing, model.init) is what the scripted forward
// computes with. Names: exactly those of the Python module's state_dict.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/jit/api/module.h>

#include <string>

#include "kiln/torch.hpp"

namespace kiln_torchscript {

struct ScriptedConfig {
  std::string path;       // the torch.jit.save file
  bool optimize = false;  // the graph executor's profiling and fusion
};

class ScriptedModel : public kiln::Model {
 public:
  // Takes a loaded module (on the CPU) and mirrors its tensors.
  ScriptedModel(torch::jit::Module module, const ScriptedConfig& config);

  at::Tensor forward(const at::Tensor& input) override;
  // Training mode reaches the scripted module too (batch norm, dropout read it there).
  void train(bool on = true) override;

  const torch::jit::Module& module() const { return module_; }

 private:
  torch::jit::Module module_;
  ScriptedConfig config_;
};

// Loads `config.path` on the CPU and checks it against the dataset: one forward on a zero batch
// of `input`'s shape must give [1, num_classes]. Throws kiln::Error (KILN_ERR_INVALID_ARGUMENT,
// naming the option `path` and the file) when the file is missing, is no TorchScript archive,
// has no forward or no parameters, or does not fit the data.
std::shared_ptr<ScriptedModel> load_scripted(const ScriptedConfig& config,
                                             const kiln_model_input& input);

}  // namespace kiln_torchscript
