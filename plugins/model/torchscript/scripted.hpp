// A TorchScript module (torch.jit.save of a scripted or traced module) as a kiln::Model. Its
// parameters and buffers are registered under their dotted names on a mirror of its submodule
// tree, sharing the module's own tensors: what the host does to them (moving, casting through
// set_data, optimizer steps, checkpoints, freezing, model.init) is what the scripted forward
// computes with. Names: exactly those of the Python module's state_dict. torch's own batch norm
// layers are mirrored as kiln::NormLayer, so the host treats them as the norm layers they are
// (keep_norm_fp32, the half running-statistics check, norm_decay_mult).
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

// A submodule of class torch.nn.BatchNorm1d/2d/3d, as the host sees it. Its forward is the
// scripted submodule's own; the enclosing module calls that directly, not this one.
class ScriptedNorm : public kiln::NormLayer {
 public:
  explicit ScriptedNorm(torch::jit::Module module) : module_(std::move(module)) {}
  at::Tensor forward(const at::Tensor& input) override;

 private:
  torch::jit::Module module_;
};

// Whether a TorchScript class (`__torch__.torch.nn.modules.batchnorm.BatchNorm2d`, with or
// without TorchScript's `___torch_mangle_N` component) is one of torch's batch norm layers. Only
// those: their forward is F.batch_norm, which takes a half input with float32 parameters and
// statistics on the CPU and CUDA alike (apex O2 keeps exactly these in float32).
bool is_torch_batch_norm(const std::string& qualified_name);

// Whether it is torch's LayerNorm, GroupNorm or InstanceNorm1d/2d/3d: norm parameters to the
// groups (kiln::NormParameters), cast with the model (CUDA's layer_norm and group_norm want the
// input's dtype; instance norm's running statistics, when tracked, are not a batch norm's).
bool is_torch_other_norm(const std::string& qualified_name);

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
