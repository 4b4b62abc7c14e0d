// The norm adapter: a kiln::NormLayer module whose forward and backward run a norm plugin through
// a custom autograd function. The host owns weight, bias and running statistics as the module's
// parameters and buffers (named as torch names them), so optimizers and checkpoints see them.
#pragma once

#include <c10/core/DeviceType.h>

#include <memory>

#include "config/options.hpp"
#include "kiln/norm.h"
#include "kiln/torch.hpp"
#include "plugin/norm_window.hpp"
#include "plugin/registry.hpp"

namespace kiln::dist {
class ProcessGroup;
}

namespace kiln::plugin {

class PluginNormLayer : public kiln::NormLayer {
 public:
  // `world_size`: the ranks of the run the layer trains in (kiln_norm_setup.world_size).
  // `window`: the trainer's window of micro-batches, under which the layer may hand its
  // running-statistics update to the host (norm_window.hpp); nullptr: the plugin updates them
  // on every training forward, as PyTorch. Throws for a plugin that cannot report its batch
  // statistics (built for ABI < 1.5) when the window's mode needs them.
  // `group`: the run's process group, behind the collectives of the plugin's forward and
  // backward (synced layers); it must outlive the layer. nullptr: a single process.
  // `device`: the device type the run trains the layer on (kiln_norm_setup.device_type, ABI 1.9),
  // a hint by which the plugin may choose its layout.
  PluginNormLayer(const Component& component, const config::OptionSet& options,
                  const kiln_norm_request& request, int32_t world_size = 1,
                  std::shared_ptr<NormWindow> window = nullptr, dist::ProcessGroup* group = nullptr,
                  c10::DeviceType device = c10::kCPU);
  ~PluginNormLayer() override;

  at::Tensor forward(const at::Tensor& input) override;

  // Used by the autograd function.
  const kiln_norm_vtable* vtable() const { return vtable_; }
  void* instance() const { return instance_; }
  const kiln_norm_layout& layout() const { return layout_; }
  const std::string& plugin_name() const { return name_; }
  // "norm '<name>' <entry> (<library>)": where an escaped exception came from.
  std::string where(const char* entry) const;
  // The process group of the plugin's collectives (nullptr: a single process).
  dist::ProcessGroup* group() const { return group_; }
  // Whether the model allowed an in-place layer to overwrite its input.
  bool may_overwrite_input() const { return may_overwrite_input_; }
  // The window to report training statistics to now, or nullptr when the plugin updates its
  // running statistics itself.
  NormWindow* reporting_window() const;
  at::Tensor running_mean, running_var;  // undefined without running stats

 private:
  // A layout.saves the host cannot honour, refused (the instance destroyed) before anything runs.
  void refuse_unknown_saves();
  // Destroys the plugin's instance, once (the destructor, or a constructor about to throw).
  void release_instance();

  std::string name_;
  std::string library_;
  const kiln_norm_vtable* vtable_;
  void* instance_ = nullptr;
  kiln_norm_layout layout_{};
  int32_t activation_;
  double activation_param_;
  bool may_overwrite_input_;
  dist::ProcessGroup* group_;
  std::shared_ptr<NormWindow> window_;  // nullptr when the layer has no running statistics to move
  at::Tensor weight_, bias_;            // undefined without affine
  at::Tensor no_affine_;                // without affine: the autograd function's weight and bias
};

}  // namespace kiln::plugin
