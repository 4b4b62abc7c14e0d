// One optimizer step's gradient work, after backward and before the optimizer: unscale by the
// loss scale and detect non-finite values in one multi-tensor pass, measure the global norm, and
// clip by norm or by value — the order torch.amp documents (unscale, then clip).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <string>
#include <vector>

namespace kiln::engine {

struct ClipSettings {
  double max_norm = 0.0;   // clip to this global norm; 0 = off
  double norm_type = 2.0;  // p of the norm (inf: max |g|)
  double max_value = 0.0;  // clamp to [-v, v]; 0 = off

  // Whether either clip is on (a NaN setting is off, as 0).
  bool any() const { return max_norm > 0.0 || max_value > 0.0; }
};

struct GradCheck {
  bool finite = true;  // every gradient element finite
  double norm = 0.0;   // global norm of the unscaled gradients before clipping (NaN/inf if not)
  std::vector<std::string> non_finite;  // the first parameters with non-finite gradients
  double loss = NAN;                    // the value of the `loss` tensor passed in, if any
  bool measured = true;  // the gradient pass ran; false: only the loss was checked (norm NaN)
};

// Unscales `tensors`' gradients in place by 1/`scale`, checks them, and when all are finite
// clips them per `clip`. Tensors without a gradient are ignored. On non-finite gradients the
// names of the first `name_limit` offending tensors (from `names`, parallel to `tensors`) are
// reported. Reads back two numbers from the device, once; a defined `loss` (one element, the
// step's loss on the device) rides along in the same copy, so that a CUDA step waits on the
// device once and not again for its loss.
GradCheck unscale_check_clip(const std::vector<at::Tensor>& tensors,
                             const std::vector<std::string>& names, double scale,
                             const ClipSettings& clip, const at::Tensor& loss = {},
                             size_t name_limit = 3);

// The step's guard without the gradient pass (run.grad_check = "auto" on a step that needs no
// pass): reads `loss` (one element, required), and fails when it is not finite, naming the first
// `name_limit` tensors whose gradients are non-finite too. The norm is not measured (NaN). The
// gradients of a finite loss are not looked at.
GradCheck check_loss_only(const std::vector<at::Tensor>& tensors,
                          const std::vector<std::string>& names, const at::Tensor& loss,
                          size_t name_limit = 3);

// The check in two halves, for a step captured as a CUDA graph, where nothing may read the
// device: launch_gradient_check enqueues the kernels (unscaling by the device tensor
// `inv_scale` first when it is defined; the p-norm of `norm_type`) and returns the device
// tensor [found_inf, norm, loss?]; read_gradient_check copies it to the host after the replay.
at::Tensor launch_gradient_check(const std::vector<at::Tensor>& tensors,
                                 const at::Tensor& inv_scale, double norm_type,
                                 const at::Tensor& loss);
GradCheck read_gradient_check(const at::Tensor& readout);

// Clips `tensors`' gradients per `clip` with the coefficient computed on the device from `norm`
// (a one-element tensor, the global norm), so that nothing is read back: for a step captured as
// a CUDA graph. Non-finite gradients come out non-finite (the optimizer skips them).
void clip_on_device(const std::vector<at::Tensor>& tensors, const at::Tensor& norm,
                    const ClipSettings& clip);

// What unscale_check_clip does after its read: names the first non-finite tensors, or clips.
GradCheck clip_after_check(GradCheck check, const std::vector<at::Tensor>& tensors,
                           const std::vector<std::string>& names, const ClipSettings& clip,
                           size_t name_limit = 3);

}  // namespace kiln::engine
