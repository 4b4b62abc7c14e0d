#include "options.hpp"

namespace kiln::norm {

void check_eps(double eps, const char* plugin) {
  if (!(eps > 0.0)) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": eps must be > 0, got " + std::to_string(eps));
  }
}

void check_group_size(int64_t group_size, int64_t world_size, const char* plugin) {
  const int64_t k = group_size == 0 ? world_size : group_size;
  if (world_size % k != 0) {
    throw Error(KILN_ERR_INVALID_ARGUMENT,
                std::string(plugin) + ": group_size " + std::to_string(group_size) +
                    " does not divide the world size " + std::to_string(world_size) +
                    "; statistics groups are consecutive blocks of group_size ranks, so it "
                    "must divide the number of ranks");
  }
}

BnOptions read_bn_options(const kiln_options* options, const char* plugin,
                          const kiln_norm_setup& setup) {
  const int64_t features = setup.num_features;
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
  // A host of ABI 1.5 or later says the world size at create, so the mismatch is refused
  // before training; an older one leaves it to the first forward (StatsGroup).
  if (o.group_size > 0 && KILN_HAS_FIELD(&setup, kiln_norm_setup, world_size) &&
      setup.world_size > 0) {
    check_group_size(o.group_size, setup.world_size, plugin);
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
