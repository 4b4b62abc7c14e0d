// A C++ plugin that breaks the ABI's one rule for C++ authors: its entries let exceptions out
// (no KILN_GUARD). Each component throws from the entry its `throw_at` option names, an `int`
// (throw_what = "int") or a std::runtime_error ("std"); with "none" it works (an identity norm,
// an optimizer and a policy that change nothing). The host must catch every one at the adapter.
#include <torch/version.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "kiln/lr_policy.h"
#include "kiln/model.h"
#include "kiln/norm.h"
#include "kiln/optimizer.h"
#include "kiln/plugin.h"
#include "kiln/precision.h"

namespace {

struct Thrower {
  std::string at;
  bool as_int = true;
};

Thrower read(const kiln_options* options) {
  Thrower t;
  const kiln_option_value* at = kiln_options_find(options, "throw_at");
  const kiln_option_value* what = kiln_options_find(options, "throw_what");
  t.at = at != nullptr ? at->string_value : "none";
  t.as_int = what == nullptr || std::strcmp(what->string_value, "int") == 0;
  return t;
}

void maybe_throw(const Thrower& t, const char* entry) {
  if (t.at != entry) return;
  if (t.as_int) throw 42;
  throw std::runtime_error(std::string("thrown from ") + entry);
}

// `destroy` has no status to return: the thrower is deleted first, then the exception leaves.
void destroy_thrower(void* instance) {
  auto* t = static_cast<Thrower*>(instance);
  const Thrower copy = *t;
  delete t;
  maybe_throw(copy, "destroy");
}

const kiln_option_spec kOptions[] = {
    {sizeof(kiln_option_spec), "throw_at", KILN_OPT_STRING, 0, 0, 0, 0, 0, "\"none\"",
     "none,create,step,lr_at,policy,forward,backward,destroy", "the entry that throws"},
    {sizeof(kiln_option_spec), "throw_what", KILN_OPT_STRING, 0, 0, 0, 0, 0, "\"int\"", "int,std",
     "int: throw 42; std: a std::runtime_error"},
};

template <typename Instance>
kiln_status* create_thrower(const kiln_options* options, Instance** out) {
  auto* t = new Thrower(read(options));
  try {
    maybe_throw(*t, "create");
  } catch (...) {
    delete t;
    throw;
  }
  *out = t;
  return nullptr;
}

// ---- optimizer: steps nothing -------------------------------------------------------------

kiln_status* opt_create(const kiln_host_api*, const kiln_options* options, void** out) {
  return create_thrower(options, out);
}
kiln_status* opt_step(void* instance, kiln_call_context*, const kiln_param_group*) {
  maybe_throw(*static_cast<Thrower*>(instance), "step");
  return nullptr;
}
const kiln_optimizer_vtable kOptVtable =
    KILN_OPTIMIZER_VTABLE_INIT(opt_create, destroy_thrower, opt_step);

// ---- lr policy: the base lr -----------------------------------------------------------------

struct Policy {
  Thrower thrower;
  double base_lr;
};
kiln_status* lr_create(const kiln_host_api*, const kiln_options* options,
                       const kiln_lr_schedule* schedule, void** out) {
  Thrower t = read(options);
  maybe_throw(t, "create");
  *out = new Policy{t, schedule->base_lr};
  return nullptr;
}
void lr_destroy(void* instance) {
  auto* p = static_cast<Policy*>(instance);
  const Thrower t = p->thrower;
  delete p;
  maybe_throw(t, "destroy");
}
kiln_status* lr_at(void* instance, int64_t, double* lr) {
  auto* p = static_cast<Policy*>(instance);
  maybe_throw(p->thrower, "lr_at");
  *lr = p->base_lr;
  return nullptr;
}
const kiln_lr_policy_vtable kLrVtable = {
    sizeof(kiln_lr_policy_vtable), lr_create, lr_destroy, lr_at, nullptr, nullptr, nullptr};

// ---- norm: identity on contiguous float32 CPU tensors -----------------------------------------

int64_t elements(const DLTensor* t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t->ndim; ++d) n *= t->shape[d];
  return n;
}
kiln_status* norm_create(const kiln_host_api*, const kiln_options* options, const kiln_norm_setup*,
                         kiln_norm_layout* layout, void** out) {
  layout->affine = 0;
  layout->running_stats = 0;
  layout->saves = KILN_NORM_SAVE_NOTHING;
  layout->fused_activation = 0;
  return create_thrower(options, out);
}
kiln_status* norm_forward(void* instance, kiln_call_context*, const kiln_norm_forward_args* args) {
  maybe_throw(*static_cast<Thrower*>(instance), "forward");
  std::memcpy(static_cast<char*>(args->output->data) + args->output->byte_offset,
              static_cast<const char*>(args->input->data) + args->input->byte_offset,
              static_cast<size_t>(elements(args->input)) * sizeof(float));
  const int64_t channels = args->save_mean->shape[0];
  auto* mean = static_cast<float*>(args->save_mean->data);
  auto* invstd = static_cast<float*>(args->save_invstd->data);
  for (int64_t c = 0; c < channels; ++c) {
    mean[c] = 0.0f;
    invstd[c] = 1.0f;
  }
  return nullptr;
}
kiln_status* norm_backward(void* instance, kiln_call_context*,
                           const kiln_norm_backward_args* args) {
  maybe_throw(*static_cast<Thrower*>(instance), "backward");
  std::memcpy(static_cast<char*>(args->grad_input->data) + args->grad_input->byte_offset,
              static_cast<const char*>(args->grad_output->data) + args->grad_output->byte_offset,
              static_cast<size_t>(elements(args->grad_output)) * sizeof(float));
  return nullptr;
}
const kiln_norm_vtable kNormVtable = {sizeof(kiln_norm_vtable), norm_create, destroy_thrower,
                                      norm_forward, norm_backward};

// ---- precision: fp32 ------------------------------------------------------------------------

kiln_status* prec_create(const kiln_host_api*, const kiln_options* options, DLDevice, void** out) {
  return create_thrower(options, out);
}
kiln_status* prec_policy(void* instance, kiln_precision_policy* policy) {
  maybe_throw(*static_cast<Thrower*>(instance), "policy");
  policy->model_dtype = KILN_DTYPE_F32;
  policy->autocast = 0;
  policy->compute_dtype = KILN_DTYPE_F32;
  policy->master_weights = 0;
  policy->norm_fp32 = 0;
  policy->loss_scaling = KILN_SCALE_NONE;
  policy->initial_scale = 1.0;
  return nullptr;
}
const kiln_precision_vtable kPrecVtable = {sizeof(kiln_precision_vtable),
                                           prec_create,
                                           destroy_thrower,
                                           prec_policy,
                                           nullptr,
                                           nullptr,
                                           nullptr};

// ---- model: its create always throws ---------------------------------------------------------

kiln_status* model_create(const kiln_host_api*, const kiln_options* options,
                          const kiln_model_input*, kiln_torch_module**) {
  Thrower t = read(options);
  t.at = "create";
  maybe_throw(t, "create");
  return nullptr;
}
void model_destroy(kiln_torch_module*) {}
const kiln_model_vtable kModelVtable = KILN_MODEL_VTABLE_INIT(model_create, model_destroy);

const kiln_option_spec kModelOptions[] = {kOptions[1]};

constexpr uint64_t kCaps = KILN_CAP_DEVICE_CPU | KILN_CAP_DTYPE_F32;
const kiln_capabilities kCapabilities = {sizeof(kiln_capabilities), kCaps, 0, nullptr};

const kiln_component_descriptor kOptimizer = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_OPTIMIZER,
                                              0,
                                              "throwing_opt",
                                              {1, 0, 0},
                                              "throws from the entry throw_at names",
                                              &kCapabilities,
                                              2,
                                              kOptions,
                                              &kOptVtable};
const kiln_component_descriptor kPolicy = {
    sizeof(kiln_component_descriptor),      KILN_COMPONENT_LR_POLICY, 0, "throwing_lr", {1, 0, 0},
    "throws from the entry throw_at names", &kCapabilities,           2, kOptions,      &kLrVtable};
const kiln_component_descriptor kNorm = {
    sizeof(kiln_component_descriptor),      KILN_COMPONENT_NORM, 0, "throwing_norm", {1, 0, 0},
    "throws from the entry throw_at names", &kCapabilities,      2, kOptions,        &kNormVtable};
const kiln_component_descriptor kPrecision = {sizeof(kiln_component_descriptor),
                                              KILN_COMPONENT_PRECISION,
                                              0,
                                              "throwing_precision",
                                              {1, 0, 0},
                                              "throws from the entry throw_at names",
                                              &kCapabilities,
                                              2,
                                              kOptions,
                                              &kPrecVtable};
const kiln_component_descriptor kModel = {sizeof(kiln_component_descriptor),
                                          KILN_COMPONENT_MODEL,
                                          0,
                                          "throwing_model",
                                          {1, 0, 0},
                                          "throws from create",
                                          &kCapabilities,
                                          1,
                                          kModelOptions,
                                          &kModelVtable};

const kiln_component_descriptor* const kComponents[] = {&kOptimizer, &kPolicy, &kNorm, &kPrecision,
                                                        &kModel};

#ifdef _GLIBCXX_USE_CXX11_ABI
constexpr int kCxx11Abi = _GLIBCXX_USE_CXX11_ABI;
#else
constexpr int kCxx11Abi = 0;
#endif

const kiln_plugin_descriptor kDescriptor = {sizeof(kiln_plugin_descriptor),
                                            KILN_ABI_MAJOR,
                                            KILN_ABI_MINOR,
                                            "throwing",
                                            {1, 0, 0},
                                            5,
                                            kComponents,
                                            nullptr,
                                            TORCH_VERSION,
                                            kCxx11Abi,
                                            0};

}  // namespace

extern "C" {
KILN_DEFINE_PLUGIN_PROBE()
const kiln_plugin_descriptor* kiln_plugin_get(void) { return &kDescriptor; }
}
