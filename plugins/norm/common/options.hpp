// Option parsing and checks shared by the norm plugins: batchnorm's options (momentum, eps,
// affine, track_running_stats) plus the synchronised variants' group_size.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/sdk.hpp"

namespace kiln::norm {

struct BnOptions {
  double momentum = 0.1;
  double eps = 1e-5;
  bool affine = true;
  bool track_running_stats = true;
  int64_t group_size = 0;  // 0: every rank; k: consecutive groups of k ranks
};

// Reads and checks the options for a layer of `setup`; messages start with `plugin`. Throws
// kiln::Error.
BnOptions read_bn_options(const kiln_options* options, const char* plugin,
                          const kiln_norm_setup& setup);

// Refuses a group_size (0: all ranks) that does not divide `world_size`. Throws kiln::Error.
void check_group_size(int64_t group_size, int64_t world_size, const char* plugin);

// Checks eps > 0 (also used by frozen_bn, which has only eps).
void check_eps(double eps, const char* plugin);

// Fills the layout fields the host has room for; `saves` is KILN_NORM_SAVE_*.
void fill_layout(kiln_norm_layout* layout, bool affine, bool running_stats, int32_t saves,
                 bool fused_activation, bool in_place, bool frozen);

// The option specs (same wording for every norm plugin that has them).
#define KILN_NORM_MOMENTUM_SPEC                                                              \
  {                                                                                          \
    sizeof(kiln_option_spec), "momentum", KILN_OPT_FLOAT, 1, 1, 0, 0.0, 1.0, "0.1", nullptr, \
        "weight of the batch statistics in the running-statistics update"                    \
  }
#define KILN_NORM_EPS_SPEC                                                               \
  {                                                                                      \
    sizeof(kiln_option_spec), "eps", KILN_OPT_FLOAT, 1, 0, 0, 0.0, 0.0, "1e-5", nullptr, \
        "added to the variance for numerical stability (> 0)"                            \
  }
#define KILN_NORM_AFFINE_SPEC                                                              \
  {                                                                                        \
    sizeof(kiln_option_spec), "affine", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", nullptr, \
        "learn a per-channel scale and shift"                                              \
  }
#define KILN_NORM_TRACK_SPEC                                                                   \
  {                                                                                            \
    sizeof(kiln_option_spec), "track_running_stats", KILN_OPT_BOOL, 0, 0, 0, 0.0, 0.0, "true", \
        nullptr, "keep running mean and variance for evaluation"                               \
  }
#define KILN_NORM_GROUP_SIZE_SPEC                                                               \
  {                                                                                             \
    sizeof(kiln_option_spec), "group_size", KILN_OPT_INT, 1, 0, 0, 0.0, 0.0, "0", nullptr,      \
        "ranks sharing batch statistics, in consecutive groups (0: all ranks; must divide the " \
        "world size)"                                                                           \
  }

}  // namespace kiln::norm
