// The dataset component kind (ABI 1.7) at the host: the loader accepts a plain-C dataset and
// refuses broken ones; plugin::DatasetSource reads it from several threads at once, reduced or
// not, and turns its statuses into the exceptions the loader handles.
#include "plugin/dataset_source.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "config_values.hpp"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

namespace {

using kiln::plugin::DatasetSource;
using kiln::plugin::LibraryLoader;
using kiln::plugin::LoadError;
using kiln::plugin::Registry;
using kiln::test::int_value;

std::string test_plugin(const std::string& name) {
  return std::string(KILN_TEST_PLUGIN_DIR) + "/lib" + name + ".so";
}

// The message a load of `path` fails with ("" when it loads).
std::string refusal(const std::string& path, Registry& registry) {
  LibraryLoader loader(kiln::plugin::host_api());
  try {
    loader.load_library(path, registry);
  } catch (const LoadError& e) {
    return e.what();
  }
  return "";
}

const Registry& gradients_registry() {
  static Registry* registry = [] {
    auto* r = new Registry();
    const std::string why =
        refusal(std::string(KILN_TEST_PLUGIN_DIR) + "/good/libgood_c_dataset.so", *r);
    EXPECT_EQ(why, "");
    return r;
  }();
  return *registry;
}

std::unique_ptr<DatasetSource> gradients(int64_t samples = 24, int64_t classes = 3,
                                         int64_t channels = 3, int64_t fail_index = -1,
                                         int32_t split = KILN_SPLIT_TRAIN) {
  const Registry& registry = gradients_registry();
  const auto* c = registry.find(KILN_COMPONENT_DATASET, "gradients");
  EXPECT_NE(c, nullptr);
  kiln::config::OptionSet options = kiln::plugin::default_options(*c);
  options.set("samples", int_value(samples));
  options.set("classes", int_value(classes));
  options.set("channels", int_value(channels));
  options.set("fail_index", int_value(fail_index));
  return kiln::plugin::make_dataset_source(registry, "gradients", options, split);
}

// What good_c_dataset.c draws (its header comment), reduced by d.
std::vector<uint8_t> expected(int64_t i, int64_t classes, int64_t channels, int64_t d,
                              int64_t* height, int64_t* width) {
  const int64_t label = i % classes;
  *height = (8 + 4 * (i % 5) + d - 1) / d;
  *width = (6 + 5 * (i % 3) + d - 1) / d;
  std::vector<uint8_t> out;
  for (int64_t y = 0; y < *height; ++y) {
    for (int64_t x = 0; x < *width; ++x) {
      for (int64_t c = 0; c < channels; ++c) {
        out.push_back(
            static_cast<uint8_t>((7 * d * y + 3 * d * x + 50 * c + 11 * i + 40 * label) % 256));
      }
    }
  }
  return out;
}

TEST(DatasetKind, TheLoaderAcceptsAPlainCDatasetAndNamesItsKind) {
  const auto* c = gradients_registry().find(KILN_COMPONENT_DATASET, "gradients");
  ASSERT_NE(c, nullptr);
  EXPECT_STREQ(kiln::plugin::kind_name(c->kind()), "dataset");
  EXPECT_EQ(c->plugin->abi_minor, static_cast<uint32_t>(KILN_ABI_MINOR));
}

TEST(DatasetKind, TheLoaderRefusesAMissingRequiredSlot) {
  Registry registry;
  const std::string path = test_plugin("bad_dataset_missing_slot");
  EXPECT_EQ(refusal(path, registry),
            path +
                ": component 'gradients_without_decode' (dataset): required slot 'decode' is "
                "NULL");
}

TEST(DatasetKind, TheLoaderRefusesADatasetInALibraryBuiltBeforeTheKind) {
  Registry registry;
  const std::string path = test_plugin("bad_dataset_old_minor");
  EXPECT_EQ(refusal(path, registry),
            path +
                ": component 'gradients' (dataset) needs Kiln ABI 1.7 or later; the library is "
                "built for 1.6");
}

TEST(DatasetSource, InfoAndClassNames) {
  auto source = gradients(24, 3, 3);
  EXPECT_EQ(source->size(), 24);
  EXPECT_EQ(source->num_classes(), 3);
  EXPECT_EQ(source->channels(), 3);
  EXPECT_EQ(source->fixed_height(), 0);
  EXPECT_EQ(source->fixed_width(), 0);
  EXPECT_EQ(source->class_names(), (std::vector<std::string>{"red", "green", "blue"}));
  auto val = gradients(24, 3, 3, -1, KILN_SPLIT_VAL);
  EXPECT_EQ(val->size(), 8);
}

TEST(DatasetSource, ProbesAndDecodesFromManyThreadsAtEveryScale) {
  const int64_t n = 60, classes = 5, channels = 3;
  auto source = gradients(n, classes, channels);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> buffer(64 * 64 * 4);
      for (int round = 0; round < 3; ++round) {
        for (int64_t i = t; i < n; i += 2) {  // threads overlap: equal indices at once too
          const int d = 1 << ((i + round) % 4);
          const kiln::data::SampleHeader header = source->probe(i);
          int64_t h = 0, w = 0;
          const std::vector<uint8_t> want = expected(i, classes, channels, d, &h, &w);
          const kiln::data::DecodedSample got = source->decode(i, d, buffer.data(), buffer.size());
          const bool ok = header.label == i % classes && header.height == 8 + 4 * (i % 5) &&
                          header.width == 6 + 5 * (i % 3) && got.height == h && got.width == w &&
                          got.scale == d && got.label == i % classes &&
                          std::equal(want.begin(), want.end(), buffer.begin());
          if (!ok) ++failures[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[static_cast<size_t>(t)], 0) << "thread " << t;
}

TEST(DatasetSource, DataLossBecomesASampleErrorWithThePluginsMessage) {
  auto source = gradients(24, 3, 1, /*fail_index=*/7);
  std::vector<uint8_t> buffer(64 * 64);
  EXPECT_NO_THROW(source->decode(6, 1, buffer.data(), buffer.size()));
  try {
    source->decode(7, 1, buffer.data(), buffer.size());
    ADD_FAILURE() << "no SampleError";
  } catch (const kiln::data::SampleError& e) {
    EXPECT_STREQ(e.what(), "gradients.bin: record 7: checksum mismatch");
  }
}

TEST(DatasetSource, OtherStatusesNameTheComponent) {
  auto source = gradients(24, 3, 3);
  std::vector<uint8_t> buffer(4);
  // Too small a buffer: the plugin's INVALID_ARGUMENT from decode.
  try {
    source->decode(0, 1, buffer.data(), buffer.size());
    ADD_FAILURE() << "no invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "dataset 'gradients' decode of sample 0: gradients: the buffer is too small");
  }
  EXPECT_THROW(source->probe(24), std::out_of_range);
  EXPECT_THROW(source->decode(-1, 1, buffer.data(), buffer.size()), std::out_of_range);
  EXPECT_THROW(source->decode(0, 3, buffer.data(), buffer.size()), std::invalid_argument);
}

// The gradients dataset with multi_label (ABI 1.10), from `registry`'s component `name`.
std::unique_ptr<DatasetSource> multi_label(const Registry& registry, const std::string& name,
                                           int64_t bad_target = -1) {
  const auto* c = registry.find(KILN_COMPONENT_DATASET, name);
  EXPECT_NE(c, nullptr);
  kiln::config::OptionSet options = kiln::plugin::default_options(*c);
  kiln::config::Value yes;
  yes.type = KILN_OPT_BOOL;
  yes.bool_value = true;
  options.set("multi_label", yes);
  options.set("classes", int_value(4));
  options.set("bad_target", int_value(bad_target));
  return kiln::plugin::make_dataset_source(registry, name, options, KILN_SPLIT_TRAIN);
}

TEST(DatasetSource, MultiLabelRowsComeThroughTheTargetsSlot) {
  const auto source = multi_label(gradients_registry(), "gradients");
  EXPECT_TRUE(source->multi_label());
  EXPECT_FALSE(gradients()->multi_label());
  std::vector<float> row(4);
  for (int64_t i = 0; i < source->size(); ++i) {
    source->targets(i, row.data());
    for (int64_t k = 0; k < 4; ++k) {
      EXPECT_EQ(row[static_cast<size_t>(k)], static_cast<float>(((i + 1) >> k) & 1)) << i;
    }
  }
  // A source of one class per sample has no rows to give.
  EXPECT_THROW(gradients()->targets(0, row.data()), std::logic_error);
}

TEST(DatasetSource, ATargetOutsideZeroToOneBreaksTheContract) {
  const auto source = multi_label(gradients_registry(), "gradients", /*bad_target=*/5);
  std::vector<float> row(4);
  source->targets(4, row.data());
  try {
    source->targets(5, row.data());
    ADD_FAILURE() << "no error";
  } catch (const kiln::data::BrokenSource& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "sample 5 (gradients.bin: record 5), class 0: 2.000000 is outside [0, 1]"),
              std::string::npos)
        << e.what();
  }
}

TEST(DatasetSource, MultiLabelWithoutTheTargetsSlotIsRefusedAtOpen) {
  Registry registry;
  ASSERT_EQ(refusal(std::string(KILN_TEST_PLUGIN_DIR) + "/no_targets/libbad_dataset_no_targets.so",
                    registry),
            "");
  try {
    multi_label(registry, "gradients_without_targets");
    ADD_FAILURE() << "no error";
  } catch (const kiln::data::BrokenSource& e) {
    EXPECT_NE(std::string(e.what()).find("no targets slot"), std::string::npos) << e.what();
  }
}

// Built against the frozen 1.9 headers: the host zeroes the fields the plugin does not know, so
// it has one class per sample, and it reads and decodes as before.
TEST(DatasetSource, ADatasetBuiltForAbi19HasOneClassPerSample) {
  Registry registry;
  ASSERT_EQ(
      refusal(std::string(KILN_TEST_PLUGIN_DIR) + "/dataset_v1_9/libgood_c_dataset.so", registry),
      "");
  const auto* c = registry.find(KILN_COMPONENT_DATASET, "gradients");
  ASSERT_NE(c, nullptr);
  const auto source = kiln::plugin::make_dataset_source(
      registry, "gradients", kiln::plugin::default_options(*c), KILN_SPLIT_TRAIN);
  EXPECT_FALSE(source->multi_label());
  EXPECT_EQ(source->probe(4).label, 1);
  std::vector<uint8_t> pixels(64 * 64 * 3);
  EXPECT_EQ(source->decode(4, 1, pixels.data(), pixels.size()).label, 1);
}

// kiln_pixel_limit (kiln/dataset.h) is PIL's rule: Image.MAX_IMAGE_PIXELS itself and up to
// twice it open (with a warning above it), more than twice it is a DecompressionBombError; and
// a product beyond 64 bits is refused even with no limit.
TEST(PixelLimit, PilsDecompressionBombRule) {
  const uint64_t limit = 89478485;  // PIL's default; 9459^2 = 89472681 is just under it
  EXPECT_EQ(kiln_pixel_limit(9459, 9459, limit), KILN_PIXELS_WITHIN);
  EXPECT_EQ(kiln_pixel_limit(1, limit, limit), KILN_PIXELS_WITHIN);
  EXPECT_EQ(kiln_pixel_limit(1, limit + 1, limit), KILN_PIXELS_WARN);
  EXPECT_EQ(kiln_pixel_limit(2, limit, limit), KILN_PIXELS_WARN);
  EXPECT_EQ(kiln_pixel_limit(1, 2 * limit + 1, limit), KILN_PIXELS_REFUSE);
  EXPECT_EQ(kiln_pixel_limit(65000, 65000, limit), KILN_PIXELS_REFUSE);
  EXPECT_EQ(kiln_pixel_limit(65000, 65000, 0), KILN_PIXELS_WITHIN);
  EXPECT_EQ(kiln_pixel_limit(uint64_t{1} << 40, uint64_t{1} << 40, 0), KILN_PIXELS_REFUSE);
  EXPECT_EQ(kiln_pixel_limit(uint64_t{1} << 32, uint64_t{1} << 31, UINT64_MAX), KILN_PIXELS_WITHIN);
  EXPECT_EQ(kiln_pixel_limit(UINT64_MAX, 1, UINT64_MAX / 2), KILN_PIXELS_REFUSE);
  EXPECT_EQ(kiln_pixel_limit(UINT64_MAX, 1, UINT64_MAX / 2 + 1), KILN_PIXELS_WARN);
}

// The gradients dataset with `option` set to the string `value` (ABI 1.13's misbehaviours),
// opened under a pixel limit of `max_pixels`.
std::unique_ptr<DatasetSource> misbehaving(
    const std::string& option, const std::string& value,
    uint64_t max_pixels = kiln::data::kDefaultMaxImagePixels) {
  const auto* c = gradients_registry().find(KILN_COMPONENT_DATASET, "gradients");
  kiln::config::OptionSet options = kiln::plugin::default_options(*c);
  if (option == "bomb_index") {
    options.set(option, int_value(std::stoll(value)));
  } else {
    options.set(option, kiln::test::string_value(value));
  }
  return kiln::plugin::make_dataset_source(gradients_registry(), "gradients", options,
                                           KILN_SPLIT_TRAIN, 0, max_pixels);
}

// An info that breaks the contract refuses the plugin (data::BrokenSource, exit 3 from the CLI),
// naming it and its library: 2^40 x 2^40 samples, whose bytes cannot be counted, as well as no
// samples or no channels.
TEST(DatasetSource, AnInfoThatBreaksTheContractRefusesThePluginByName) {
  const std::pair<std::string, std::string> cases[] = {
      {"huge_info",
       "info reports a sample size of 1099511627776x1099511627776x3, whose bytes "
       "overflow 64 bits"},
      {"negative_samples", "info reports -24 samples"},
      {"zero_channels", "info reports 0 channels"}};
  for (const auto& [breach, what] : cases) {
    SCOPED_TRACE(breach);
    try {
      misbehaving("breach", breach);
      ADD_FAILURE() << "no error";
    } catch (const kiln::data::BrokenSource& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("dataset 'gradients' (" + std::string(KILN_TEST_PLUGIN_DIR) +
                             "/good/libgood_c_dataset.so) broke the dataset contract: " + what),
                std::string::npos)
          << message;
    }
  }
}

// A plugin that ignores kiln_dataset_open.max_pixels (as one built before ABI 1.13 does) is held
// to the limit by the host: a probe claiming 65000 x 65000 is a SampleError naming the sample by
// the plugin's sample_name, before the loader sizes a buffer by it; without a limit it passes.
TEST(DatasetSource, TheHostHoldsEveryReportedSizeToThePixelLimit) {
  const auto source = misbehaving("bomb_index", "5");
  EXPECT_NO_THROW(source->probe(4));
  try {
    source->probe(5);
    ADD_FAILURE() << "no error";
  } catch (const kiln::data::SampleError& e) {
    EXPECT_NE(std::string(e.what()).find("sample 5 (gradients.bin: record 5) is 65000x65000, more "
                                         "than twice data.max_image_pixels (89478485 pixels)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(misbehaving("bomb_index", "5", 0)->probe(5).height, 65000);
  EXPECT_EQ(source->sample_name(3), "sample 3 (gradients.bin: record 3)");
}

TEST(DatasetSource, AnUnknownNameListsTheDatasetsThereAre) {
  try {
    kiln::plugin::make_dataset_source(gradients_registry(), "gradient", {}, KILN_SPLIT_TRAIN);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "no dataset component named 'gradient'; available: gradients");
  }
}

}  // namespace
