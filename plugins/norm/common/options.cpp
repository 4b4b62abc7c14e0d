#include "options.hpp"

namespace kiln::norm {

void check_eps(double eps, const char* plugin) {
  if (!(eps > 0.0)) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": eps must be > 0, got " + std::to_string(eps));
  }
}

BnOptions read_bn_options(const kiln_options* options, const char* plugin, int64_t features) {
  BnOptions o;
  o.momentum = kiln_options_float(options, "momentum", o.momentum);
  o.eps = kiln_options_float(options, "eps", o.eps);
  o.affine = kiln_options_bool(options, "affine", 1) != 0;
  o.track_running_stats = kiln_options_bool(options, "track_running_stats", 1) != 0;
  o.group_size = kiln_options_int(options, "group_size", 0);
  if (features <= 0) {
    throw Error(
        KILN_ERR_INVALID_ARGUMENT,
        std::string(plugin) + ": num_features must be positive, got " + std::to_string(features));
  }
  if (!(o.momentum >= 0.0 && o.momentum <= 1.0)) {
    throw Error(
        KILN_ERR_INVALID_ARGUMENT,
        std::string(plugin) + ": momentum must be in [0, 1], got " + std::to_string(o.momentum));
  }
  check_eps(o.eps, plugin);
  if (o.group_size < 0) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": group_size must be >= 0 (0 means all ranks), got " +
                    std::to_string(o.group_size));
  }
  return o;
}

void fill_layout(kiln_norm_layout* layout, bool affine, bool running_stats, int32_t saves,
                 bool fused_activation, bool in_place, bool frozen) {
  // The host's layout may be older than ours: fill only the fields it has room for.
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, affine)) layout->affine = affine;
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, running_stats)) {
    layout->running_stats = running_stats;
  }
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, saves)) layout->saves = saves;
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, fused_activation)) {
    layout->fused_activation = fused_activation;
  }
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, in_place)) layout->in_place = in_place;
  if (KILN_HAS_FIELD(layout, kiln_norm_layout, frozen)) layout->frozen = frozen;
}

}  // namespace kiln::norm
