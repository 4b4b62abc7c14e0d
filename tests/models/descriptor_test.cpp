// Both model libraries present themselves as torch-bound model plugins.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kiln/torch.hpp"
#include "model_plugin.hpp"

namespace kiln_test {
namespace {

struct Library {
  const char* file;
  const char* component;
};

class DescriptorTest : public testing::TestWithParam<Library> {};

TEST_P(DescriptorTest, RecordsAbiAndTorchBuild) {
  const ModelPlugin& plugin = ModelPlugin::get(GetParam().file);
  EXPECT_EQ(plugin.probe(), KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR));
  const kiln_plugin_descriptor* d = plugin.descriptor();
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->struct_size, sizeof(kiln_plugin_descriptor));
  EXPECT_EQ(d->abi_major, static_cast<uint32_t>(KILN_ABI_MAJOR));
  EXPECT_EQ(d->abi_minor, static_cast<uint32_t>(KILN_ABI_MINOR));
  ASSERT_NE(d->torch_version, nullptr);
  EXPECT_STREQ(d->torch_version, TORCH_VERSION);
  EXPECT_EQ(d->torch_cxx11_abi, KILN_TORCH_CXX11_ABI);
  EXPECT_EQ(d->reserved, 0);
}

TEST_P(DescriptorTest, OffersOneModelComponent) {
  const kiln_plugin_descriptor* d = ModelPlugin::get(GetParam().file).descriptor();
  ASSERT_EQ(d->component_count, 1u);
  const kiln_component_descriptor* c = d->components[0];
  EXPECT_EQ(c->kind, KILN_COMPONENT_MODEL);
  EXPECT_STREQ(c->name, GetParam().component);
  ASSERT_NE(c->capabilities, nullptr);
  EXPECT_TRUE(c->capabilities->flags & KILN_CAP_DEVICE_CPU);
  const auto* vtable = static_cast<const kiln_model_vtable*>(c->vtable);
  ASSERT_NE(vtable, nullptr);
  EXPECT_GE(vtable->struct_size, KILN_MODEL_VTABLE_V1_SIZE);
  EXPECT_NE(vtable->create, nullptr);
  EXPECT_NE(vtable->destroy, nullptr);
  vtable->destroy(nullptr);  // documented as ignored
  for (size_t i = 0; i < c->option_count; ++i) {
    EXPECT_NE(c->options[i].default_value, nullptr) << c->options[i].name;
    EXPECT_NE(c->options[i].doc, nullptr) << c->options[i].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DescriptorTest,
                         testing::Values(Library{"libkiln_mlp.so", "mlp"},
                                         Library{"libkiln_resnet.so", "resnet"},
                                         Library{"libkiln_vit.so", "vit"}),
                         [](const testing::TestParamInfo<Library>& info) {
                           return std::string(info.param.component);
                         });

TEST(DescriptorTest, SchemasNameTheDocumentedOptions) {
  auto names = [](const char* file) {
    const kiln_component_descriptor* c = ModelPlugin::get(file).descriptor()->components[0];
    std::string joined;
    for (size_t i = 0; i < c->option_count; ++i) joined += std::string(c->options[i].name) + " ";
    return joined;
  };
  EXPECT_EQ(names("libkiln_mlp.so"), "hidden dropout norm_layers ");
  EXPECT_EQ(names("libkiln_resnet.so"),
            "depth stem width blocks activation activation_param preact ");
  EXPECT_EQ(names("libkiln_vit.so"), "patch_size dim depth heads mlp_ratio pool dropout ");
}

}  // namespace
}  // namespace kiln_test
