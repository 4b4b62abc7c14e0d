// [ema]: an exponential moving average of the model's weights, as timm's ModelEmaV3 keeps it.
// After optimizer step t the average moves towards the trained weights by 1 - decay(t); an
// evaluation may measure it instead of the trained weights (with_average), and a checkpoint
// keeps it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config/settings.hpp"
#include "io/checkpoint.hpp"

namespace kiln::engine {

class MasterWeights;

// timm ModelEmaV3.get_decay(step): 0 (a copy) up to step start_step + 1, then `decay`, or with
// warm-up min(decay, 1 - (1 + k / warmup_gamma)^-warmup_power), k = step - start_step - 1.
double ema_decay(const config::EmaSettings& settings, int64_t step);

// A checkpoint's trainer part keeps the average as "<kEmaPrefix><name>" (the C API names it so).
inline constexpr const char* kEmaPrefix = "ema/";

// The average `data` holds, under the model's names, in its order; empty when it holds none.
std::vector<std::pair<std::string, at::Tensor>> saved_average(const io::CheckpointData& data);

class ModelEma {
 public:
  // The average starts as a copy of the model's parameters and buffers (of the fp32 masters in
  // `stepped` where the model's parameters are half). `model` and `stepped` must outlive this.
  ModelEma(torch::nn::Module& model, const MasterWeights& stepped,
           const config::EmaSettings& settings);
  ModelEma(const ModelEma&) = delete;
  ModelEma& operator=(const ModelEma&) = delete;

  // After optimizer step `step` (1-based, attempted steps, as timm's num_updates).
  void update(int64_t step);

  // The average as "ema/<name>" tensors of a checkpoint's trainer part.
  void state(io::CheckpointData& out) const;
  // Takes the average back from a checkpoint, after the weights were restored. One without an
  // average (written with ema.decay = 0) starts it afresh from the restored weights. Throws
  // io::CheckpointError when only some names are there or a shape differs.
  void restore(const io::CheckpointData& data);

  // The average's live tensors under the checkpoint's names ("<kEmaPrefix><name>"), in the
  // model's order: what state() saves and the C API hands out (a write into one changes it).
  std::vector<std::pair<std::string, at::Tensor>> named() const;

  // Runs `f` with the average in the model and puts the trained weights back after, also when
  // `f` throws.
  template <typename F>
  auto with_average(F&& f) -> decltype(f()) {
    swap_in();
    try {
      auto result = f();
      swap_out();
      return result;
    } catch (...) {
      swap_out();
      throw;
    }
  }

 private:
  void swap_in();
  void swap_out();

  config::EmaSettings settings_;
  std::vector<std::string> names_;
  std::vector<at::Tensor> model_;    // the model's parameters and buffers, in names_' order
  std::vector<at::Tensor> source_;   // what is averaged: model_, or the fp32 master of a param
  std::vector<at::Tensor> average_;  // fp32 for a half source, else in the source's dtype
  // What update() moves, by how: lerped in the source's dtype (one foreach call), lerped from
  // a cast (half buffers), or copied (integer buffers; floating ones with buffers = "copy").
  std::vector<at::Tensor> lerp_average_, lerp_source_;
  std::vector<size_t> cast_lerped_;
  std::vector<at::Tensor> copy_average_, copy_source_;
  std::vector<at::Tensor> trained_;  // the model's own tensors while the average is in it
};

}  // namespace kiln::engine
