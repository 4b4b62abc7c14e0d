#include "precision_harness.hpp"

#include <cstdio>
#include <stdexcept>

#include "config/pipeline.hpp"
#include "kiln_test_paths.h"
#include "plugin/host_api.hpp"
#include "plugin/loader.hpp"
#include "plugin/status.hpp"

namespace kiln::precision_test {
namespace {

using kiln::plugin::Component;

// Stand-ins for the slots a pipeline needs besides precision: resolving options never calls
// their code.
const kiln_capabilities kStandInCaps = {sizeof(kiln_capabilities), KILN_CAP_DEVICE_CPU, 0, nullptr};
kiln_component_descriptor stand_in(int32_t kind, const char* name) {
  kiln_component_descriptor d{};
  d.struct_size = sizeof d;
  d.kind = kind;
  d.name = name;
  d.version = {1, 0, 0};
  d.summary = "stand-in";
  d.capabilities = &kStandInCaps;
  return d;
}
const kiln_component_descriptor kModel = stand_in(KILN_COMPONENT_MODEL, "mlp");
const kiln_component_descriptor kNorm = stand_in(KILN_COMPONENT_NORM, "batchnorm");
const kiln_component_descriptor kOptimizer = stand_in(KILN_COMPONENT_OPTIMIZER, "sgd");
const kiln_component_descriptor kLrPolicy = stand_in(KILN_COMPONENT_LR_POLICY, "constant");

std::string describe(kiln_status* status) {
  if (status == nullptr) return "";
  const int32_t code = status->code;
  return "code " + std::to_string(code) + ": " + kiln::plugin::take_message(status);
}

}  // namespace

const std::vector<std::string>& all_components() {
  static const std::vector<std::string> names = {
      "fp32", "amp",      "bf16",       "o2", "o3", "O0",      "32-true",
      "O1",   "16-mixed", "bf16-mixed", "O2", "O3", "16-true", "bf16-true"};
  return names;
}

const kiln::plugin::Registry& registry() {
  static const kiln::plugin::Registry reg = [] {
    kiln::plugin::Registry r;
    kiln::plugin::LibraryLoader loader(kiln::plugin::host_api());
    // The datasets library: [data]'s default dataset (fashion-mnist) must resolve.
    for (const char* lib : {"libkiln_fp32.so", "libkiln_amp.so", "libkiln_datasets.so"}) {
      loader.load_library(std::string(KILN_PLUGIN_DIR) + "/" + lib, r);
    }
    for (const auto* d : {&kModel, &kNorm, &kOptimizer, &kLrPolicy}) {
      r.add(Component{d, nullptr, "/stand-in/" + std::string(d->name)});
    }
    return r;
  }();
  return reg;
}

const Component& component(const std::string& name) {
  const Component* c = registry().find(KILN_COMPONENT_PRECISION, name);
  if (c == nullptr) throw std::runtime_error("no precision component '" + name + "'");
  return *c;
}

const kiln_precision_vtable& vtable(const std::string& name) {
  return *static_cast<const kiln_precision_vtable*>(component(name).descriptor->vtable);
}

kiln::config::OptionSet resolve(const std::string& name, const std::string& extra) {
  const std::string text =
      "[model]\nname = \"mlp\"\n[precision]\nname = \"" + name + "\"\n" + extra + "\n";
  return kiln::config::load_pipeline_text(text, "p.toml", {}, registry()).precision.options;
}

std::string toml_float(double v) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", v);
  std::string s = text;
  // TOML needs a fraction or exponent to read a float; an integer literal would do too, but
  // keep the type explicit.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string create_refusal(const std::string& name, const kiln::config::OptionSet& options,
                           DLDeviceType device) {
  DLDevice dl{device, 0};
  void* instance = nullptr;
  const std::string refusal =
      describe(vtable(name).create(kiln::plugin::host_api(), options.c_view(), dl, &instance));
  if (instance != nullptr) vtable(name).destroy(instance);
  return refusal;
}

Instance::Instance(const std::string& name, const kiln::config::OptionSet& options,
                   DLDeviceType device)
    : name_(name), vtable_(vtable(name)) {
  DLDevice dl{device, 0};
  kiln::plugin::check(vtable_.create(kiln::plugin::host_api(), options.c_view(), dl, &instance_),
                      "precision '" + name + "' create");
}

Instance::~Instance() { vtable_.destroy(instance_); }

kiln_precision_policy Instance::policy() const {
  kiln_precision_policy p{};
  p.struct_size = sizeof p;
  p.initial_scale = 1.0;
  p.min_scale = 1.0;
  p.at_min_scale = KILN_AT_MIN_SCALE_STOP;
  kiln::plugin::check(vtable_.policy(instance_, &p), "precision '" + name_ + "' policy");
  return p;
}

double Instance::update(bool grads_finite, double scale) {
  if (vtable_.update_scale == nullptr) return scale;
  kiln::plugin::check(vtable_.update_scale(instance_, grads_finite ? 1 : 0, &scale),
                      "precision '" + name_ + "' update_scale");
  return scale;
}

std::string Instance::update_refusal(bool grads_finite, double scale) {
  return describe(vtable_.update_scale(instance_, grads_finite ? 1 : 0, &scale));
}

}  // namespace kiln::precision_test
