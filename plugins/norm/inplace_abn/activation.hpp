// The activations InPlace-ABN fuses: invertible ones only, because backward recovers the
// activation's input from its output instead of keeping it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "kiln/sdk.hpp"

namespace kiln::abn {

struct Activation {
  int32_t kind = KILN_ACT_NONE;  // KILN_ACT_NONE (identity), KILN_ACT_LEAKY_RELU or KILN_ACT_ELU
  double param = 0.0;            // leaky slope / elu alpha
};

// The setup's activation, or an Error saying why it cannot be fused invertibly.
Activation invertible_activation(const kiln_norm_setup* setup, const char* plugin);

// z -> act(z), in place on a float32 tensor.
void apply_(const Activation& act, at::Tensor& z);

// From the activation's output y and the gradient dy at y (float32): {z, dz} with
// z = act^-1(y) and dz = dy * act'(z), both computed from y alone.
std::pair<at::Tensor, at::Tensor> invert(const Activation& act, const at::Tensor& y,
                                         const at::Tensor& dy);

}  // namespace kiln::abn
