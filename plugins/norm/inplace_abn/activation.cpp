#include "activation.hpp"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <string>

namespace kiln::abn {

Activation invertible_activation(const kiln_norm_setup* setup, const char* plugin) {
  const std::string who(plugin);
  Activation act{setup->activation, setup->activation_param};
  switch (setup->activation) {
    case KILN_ACT_NONE:
    case KILN_ACT_IDENTITY:
      return Activation{KILN_ACT_NONE, 0.0};
    case KILN_ACT_RELU:
      throw Error(KILN_ERR_UNSUPPORTED,
                  who +
                      ": relu is not invertible: backward recovers the normalised input by "
                      "inverting the activation on the saved output, and relu maps every "
                      "negative value to 0; use leaky_relu with a slope > 0 (InPlace-ABN's "
                      "default is 0.01), elu, or no activation");
    case KILN_ACT_LEAKY_RELU:
      if (!(setup->activation_param > 0.0)) {
        throw Error(KILN_ERR_UNSUPPORTED,
                    who + ": leaky_relu with slope " + std::to_string(setup->activation_param) +
                        " is not invertible: backward recovers the normalised input by "
                        "dividing negative outputs by the slope; use a slope > 0 (InPlace-ABN's "
                        "default is 0.01)");
      }
      return act;
    case KILN_ACT_ELU:
      if (!(setup->activation_param > 0.0)) {
        throw Error(KILN_ERR_UNSUPPORTED, who + ": elu with alpha " +
                                              std::to_string(setup->activation_param) +
                                              " is not invertible; use alpha > 0");
      }
      return act;
    default:
      throw Error(KILN_ERR_UNSUPPORTED,
                  who + ": unknown activation " + std::to_string(setup->activation));
  }
}

void apply_(const Activation& act, at::Tensor& z) {
  if (act.kind == KILN_ACT_LEAKY_RELU) at::leaky_relu_(z, act.param);
  if (act.kind == KILN_ACT_ELU) at::elu_(z, act.param);
}

std::pair<at::Tensor, at::Tensor> invert(const Activation& act, const at::Tensor& y,
                                         const at::Tensor& dy) {
  if (act.kind == KILN_ACT_LEAKY_RELU) {
    at::Tensor negative = y < 0;
    at::Tensor z = y * at::where(negative, 1.0 / act.param, 1.0);
    at::Tensor dz = dy * at::where(negative, act.param, 1.0);
    return {z, dz};
  }
  if (act.kind == KILN_ACT_ELU) {
    // y = alpha * (exp(z) - 1) for z < 0: z = log1p(y / alpha) and act'(z) = y + alpha.
    // Saturated outputs (y == -alpha after rounding) lost z; the clamp keeps it finite, and
    // their dz = dy * (y + alpha) is 0 anyway.
    at::Tensor negative = y < 0;
    at::Tensor z = at::where(negative, at::log1p((y / act.param).clamp_min(-1.0 + 1e-6)), y);
    at::Tensor dz = dy * at::where(negative, y + act.param, at::ones_like(y));
    return {z, dz};
  }
  return {y, dy};
}

}  // namespace kiln::abn
