// `synthetic`: the host's learnable synthetic dataset (data::make_synthetic), pixel for pixel for
// the same seed and sizes. Each class has a smooth random prototype; a sample is its prototype
// plus uniform noise. The training split is samples [0, synthetic_train) of one stream of
// synthetic_train + synthetic_test, the validation split the rest, as the host slices it.
//
// A split of up to synthetic_cache_mib is generated whole at create, in one pass of the generator,
// and decode copies a sample out (a replay costs a training thread's whole budget on small models,
// and kept ResNet-50's loaders behind its GPU step at 224 pixels). A larger split keeps the
// prototypes, the labels and the generator's state every few samples, and decode replays one
// sample's noise from the nearest state.
#include <algorithm>
#include <array>
#include <cstring>
#include <random>

#include "common.hpp"

namespace kiln::datasets {
namespace {

// Unbiased enough for our sizes and identical on every standard library (as the host's).
uint64_t below(std::mt19937_64& gen, uint64_t n) { return gen() % n; }

// Noise draws per decode at most, before the stored states cost more memory than they save.
constexpr uint64_t kDrawsPerState = uint64_t{1} << 18;
// A sample's noise byte b becomes b % 97 - 48 (the host's rule), looked up rather than divided.
constexpr std::array<int8_t, 256> kNoise = [] {
  std::array<int8_t, 256> t{};
  for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = static_cast<int8_t>(b % 97 - 48);
  return t;
}();

class SyntheticDataset final : public FixedDataset {
 public:
  std::vector<uint8_t> prototypes;  // classes x C x H x W
  std::vector<int64_t> labels;      // this split's
  uint64_t draws_per_sample = 0;    // ceil(C * H * W / 8): eight noise bytes per draw
  int64_t samples_per_state = 1;
  std::vector<std::mt19937_64> states;  // before sample k * samples_per_state of this split
  std::vector<uint8_t> cache;           // every sample, HWC; empty for a split too large

  int64_t label(int64_t index) const override { return labels[static_cast<size_t>(index)]; }

  void pixels(int64_t index, uint8_t* out) const override {
    const auto bytes = static_cast<size_t>(channels * height * width);
    if (!cache.empty()) {
      std::memcpy(out, cache.data() + static_cast<size_t>(index) * bytes, bytes);
      return;
    }
    std::mt19937_64 gen = states[static_cast<size_t>(index / samples_per_state)];
    gen.discard(static_cast<unsigned long long>(index % samples_per_state) * draws_per_sample);
    generate(gen, index, out);
  }

  // Sample `index` from `gen`, which stands before its noise; leaves `gen` after it.
  void generate(std::mt19937_64& gen, int64_t index, uint8_t* out) const {
    const int64_t plane = height * width;
    const int64_t count = plane * channels;
    const uint8_t* proto = prototypes.data() + label(index) * count;
    uint64_t bits = 0;
    int left = 0;  // noise bytes left in `bits`: eight per draw, drawn across channels in turn
    for (int64_t c = 0; c < channels; ++c) {  // the host's order: C x H x W
      const uint8_t* in = proto + c * plane;
      uint8_t* to = out + c;
      for (int64_t at = 0; at < plane; ++at) {
        if (left == 0) {
          bits = gen();
          left = 8;
        }
        const int noise = kNoise[bits & 0xff];
        bits >>= 8;
        --left;
        to[at * channels] = static_cast<uint8_t>(std::clamp(int{in[at]} + noise, 0, 255));
      }
    }
  }
};

std::unique_ptr<FixedDataset> open_synthetic(const kiln_options* options,
                                             const kiln_dataset_open& open) {
  const int32_t split = open.split;
  const int64_t n_train = int_option(options, "synthetic_train");
  const int64_t n_test = int_option(options, "synthetic_test");
  const int64_t classes = int_option(options, "synthetic_classes");
  const int64_t channels = int_option(options, "channels");
  const int64_t height = int_option(options, "height");
  const int64_t width = int_option(options, "width");
  const int64_t cache_mib = int_option(options, "synthetic_cache_mib");
  const uint64_t seed = open.seed;  // the run's: the same draw as data::make_synthetic's
  // The schema bounds these; a caller without the host's validation still gets a reason.
  if (n_train < 1 || n_test < 1 || classes < 1 || channels < 1 || channels > 16 || height < 1 ||
      height > 4096 || width < 1 || width > 4096 || cache_mib < 0 || cache_mib > (1 << 20)) {
    invalid(
        "synthetic: synthetic_train and synthetic_test must be >= 1, synthetic_classes >= 1, "
        "channels in [1, 16], height and width in [1, 4096], synthetic_cache_mib in "
        "[0, 1048576]");
  }
  const int64_t samples = n_train + n_test;
  auto d = std::make_unique<SyntheticDataset>();
  d->num_classes = classes;
  d->channels = static_cast<int32_t>(channels);
  d->height = height;
  d->width = width;

  std::mt19937_64 gen(seed);
  const int64_t pixels = channels * height * width;
  // Prototypes: bilinear upsamplings of a coarse random grid (data::make_synthetic's words).
  constexpr int64_t kGrid = 4;
  d->prototypes.resize(static_cast<size_t>(classes * pixels));
  for (int64_t k = 0; k < classes; ++k) {
    for (int64_t c = 0; c < channels; ++c) {
      double grid[kGrid][kGrid];
      for (auto& row : grid) {
        for (double& v : row) v = static_cast<double>(below(gen, 256));
      }
      uint8_t* plane = d->prototypes.data() + (k * channels + c) * height * width;
      for (int64_t y = 0; y < height; ++y) {
        const double gy = height > 1 ? double(y) * (kGrid - 1) / double(height - 1) : 0;
        const int64_t y0 = std::min<int64_t>(static_cast<int64_t>(gy), kGrid - 2);
        const double fy = gy - double(y0);
        for (int64_t x = 0; x < width; ++x) {
          const double gx = width > 1 ? double(x) * (kGrid - 1) / double(width - 1) : 0;
          const int64_t x0 = std::min<int64_t>(static_cast<int64_t>(gx), kGrid - 2);
          const double fx = gx - double(x0);
          const double top = grid[y0][x0] * (1 - fx) + grid[y0][x0 + 1] * fx;
          const double bottom = grid[y0 + 1][x0] * (1 - fx) + grid[y0 + 1][x0 + 1] * fx;
          // + 0.5 and truncation, as the host rounds.
          // NOLINTNEXTLINE(bugprone-incorrect-roundings)
          plane[y * width + x] = static_cast<uint8_t>(top * (1 - fy) + bottom * fy + 0.5);
        }
      }
    }
  }
  // Balanced labels over the whole stream, Fisher-Yates shuffled.
  std::vector<int64_t> labels(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) labels[static_cast<size_t>(i)] = i % classes;
  for (int64_t i = samples - 1; i > 0; --i) {
    std::swap(labels[static_cast<size_t>(i)], labels[below(gen, static_cast<uint64_t>(i) + 1)]);
  }
  // The noise: ceil(pixels / 8) draws per sample, samples in order.
  d->draws_per_sample = static_cast<uint64_t>((pixels + 7) / 8);
  d->samples_per_state =
      static_cast<int64_t>(std::max<uint64_t>(1, kDrawsPerState / d->draws_per_sample));
  const int64_t begin = split == KILN_SPLIT_TRAIN ? 0 : n_train;
  const int64_t end = split == KILN_SPLIT_TRAIN ? n_train : samples;
  gen.discard(static_cast<unsigned long long>(begin) * d->draws_per_sample);
  d->labels.assign(labels.begin() + begin, labels.begin() + end);
  d->num_samples = end - begin;
  if (d->num_samples * pixels <= (cache_mib << 20)) {
    d->cache.resize(static_cast<size_t>(d->num_samples * pixels));
    for (int64_t i = 0; i < d->num_samples; ++i) d->generate(gen, i, d->cache.data() + i * pixels);
    return d;
  }
  for (int64_t i = begin; i < end; i += d->samples_per_state) {
    d->states.push_back(gen);
    const int64_t step = std::min(d->samples_per_state, end - i);
    gen.discard(static_cast<unsigned long long>(step) * d->draws_per_sample);
  }
  return d;
}

const kiln_option_spec kSyntheticOptions[] = {
    KILN_OPTION_MIN_INIT("synthetic_train", KILN_OPT_INT, 1.0, "2048", "training samples"),
    KILN_OPTION_MIN_INIT("synthetic_test", KILN_OPT_INT, 1.0, "512", "validation samples"),
    KILN_OPTION_RANGE_INIT("synthetic_classes", KILN_OPT_INT, 2.0, 1000.0, "10", "classes"),
    KILN_OPTION_RANGE_INIT("channels", KILN_OPT_INT, 1.0, 16.0, "1", "image channels"),
    KILN_OPTION_RANGE_INIT("height", KILN_OPT_INT, 1.0, 4096.0, "28", "image height"),
    KILN_OPTION_RANGE_INIT("width", KILN_OPT_INT, 1.0, 4096.0, "28", "image width"),
    KILN_OPTION_RANGE_INIT("synthetic_cache_mib", KILN_OPT_INT, 0.0, 1048576.0, "1024",
                           "a split up to this size (uint8 pixels) is generated once and kept in "
                           "memory; a larger one regenerates each sample as it is read (slower)")};

const kiln_dataset_vtable kSyntheticVtable = make_vtable<open_synthetic>();

}  // namespace

const kiln_component_descriptor kSyntheticComponent =
    KILN_COMPONENT_OPTIONS_INIT(KILN_COMPONENT_DATASET, "synthetic", KILN_VERSION_INIT(1, 0, 0),
                                "learnable synthetic images: a prototype per class plus noise",
                                &kCapabilities, kSyntheticOptions, &kSyntheticVtable);

}  // namespace kiln::datasets
