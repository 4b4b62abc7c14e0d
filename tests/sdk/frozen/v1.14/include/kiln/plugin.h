/*
 * kiln/plugin.h — how a library presents itself. Each plugin library exports exactly two
 * functions: the probe kiln_plugin_abi() (cheap, returns the ABI it was built for, lets the host
 * refuse a library before running anything else of it) and the entry kiln_plugin_get() (returns
 * a static descriptor). Everything else in the library should be hidden.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

#ifdef __cplusplus
#include <cstddef> /* defines _GLIBCXX_USE_CXX11_ABI under libstdc++, for the torch fields */
#endif

#include "kiln/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Component kinds (int32_t). */
enum {
  KILN_COMPONENT_OPTIMIZER = 1, /* vtable: kiln_optimizer_vtable (kiln/optimizer.h) */
  KILN_COMPONENT_LR_POLICY = 2, /* vtable: kiln_lr_policy_vtable (kiln/lr_policy.h) */
  KILN_COMPONENT_NORM = 3,      /* vtable: kiln_norm_vtable (kiln/norm.h) */
  KILN_COMPONENT_PRECISION = 4, /* vtable: kiln_precision_vtable (kiln/precision.h) */
  KILN_COMPONENT_MODEL = 5,     /* vtable: kiln_model_vtable (kiln/model.h); torch-bound */
  KILN_COMPONENT_DATASET = 6    /* 1.7, vtable: kiln_dataset_vtable (kiln/dataset.h) */
};

/* One component. All pointers are static data of the plugin library. */
typedef struct kiln_component_descriptor {
  size_t struct_size;                    /* sizeof(kiln_component_descriptor) per the plugin */
  int32_t kind;                          /* KILN_COMPONENT_* */
  int32_t reserved;                      /* zero */
  const char* name;                      /* unique among all loaded components ("sgd") */
  kiln_version version;                  /* the component's version */
  const char* summary;                   /* one line for `kiln plugins list`; may be NULL */
  const kiln_capabilities* capabilities; /* required */
  size_t option_count;                   /* entries in `options` */
  const kiln_option_spec* options;       /* the options schema; may be NULL if count is 0 */
  const void* vtable;                    /* the kind's vtable; starts with its struct_size */
} kiln_component_descriptor;

/* The library's descriptor, returned by kiln_plugin_get(). Static data of the library. */
typedef struct kiln_plugin_descriptor {
  size_t struct_size;     /* sizeof(kiln_plugin_descriptor) as the plugin knows it */
  uint32_t abi_major;     /* KILN_ABI_MAJOR the plugin was built with */
  uint32_t abi_minor;     /* KILN_ABI_MINOR the plugin was built with */
  const char* name;       /* library name, for messages ("kiln-sgd") */
  kiln_version version;   /* the library's version */
  size_t component_count; /* entries in `components` */
  const kiln_component_descriptor* const* components; /* array of pointers, static */

  /* Optional. Called once after validation, before any component is used. `host` stays valid
   * for the life of the process. A non-NULL status refuses the whole library. */
  kiln_status* (*init)(const kiln_host_api* host);

  /* LibTorch the library was built against: the TORCH_VERSION string ("2.11.0") and the
   * _GLIBCXX_USE_CXX11_ABI flag. Since ABI 1.6 every library that uses LibTorch (ATen on host
   * memory too, not only models) records them, and the host refuses a mismatch for any kind;
   * models must record them. NULL and -1 when the library does not use LibTorch. */
  const char* torch_version;
  int32_t torch_cxx11_abi;
  int32_t reserved; /* zero */
} kiln_plugin_descriptor;

/* What KILN_PLUGIN_DESCRIPTOR_INIT records about LibTorch. kiln_add_plugin(... TORCH) defines
 * KILN_PLUGIN_TORCH_VERSION (the linked LibTorch's version, "2.11.0") for the library's sources;
 * in C++ the C++11 ABI flag is the one the source is compiled with. A C source of a torch-bound
 * library defines KILN_PLUGIN_TORCH_CXX11_ABI itself. Without KILN_PLUGIN_TORCH_VERSION the
 * library records none (NULL, -1). */
#if defined(KILN_PLUGIN_TORCH_VERSION)
#if defined(__cplusplus) && !defined(KILN_PLUGIN_TORCH_CXX11_ABI)
#if defined(_GLIBCXX_USE_CXX11_ABI)
#define KILN_PLUGIN_TORCH_CXX11_ABI _GLIBCXX_USE_CXX11_ABI
#else
#define KILN_PLUGIN_TORCH_CXX11_ABI 0
#endif
#endif
#define KILN_DESCRIPTOR_TORCH_VERSION_ KILN_PLUGIN_TORCH_VERSION
#define KILN_DESCRIPTOR_TORCH_CXX11_ABI_ KILN_PLUGIN_TORCH_CXX11_ABI
#else
#define KILN_DESCRIPTOR_TORCH_VERSION_ NULL
#define KILN_DESCRIPTOR_TORCH_CXX11_ABI_ (-1)
#endif

/* A library's descriptor: KILN_PLUGIN_DESCRIPTOR_INIT("kiln-sgd", KILN_VERSION_INIT(1, 1, 0),
 * components, NULL), where `components` is a static array of component pointers and the last
 * argument the init function or NULL. Records this header's ABI and the torch fields above. */
#define KILN_PLUGIN_DESCRIPTOR_INIT(name_, version_, components_, init_)                       \
  {                                                                                            \
    KILN_FIELD_(struct_size)                                                                   \
    sizeof(kiln_plugin_descriptor), KILN_FIELD_(abi_major) KILN_ABI_MAJOR,                     \
        KILN_FIELD_(abi_minor) KILN_ABI_MINOR, KILN_FIELD_(name)(name_),                       \
        KILN_FIELD_(version) version_, KILN_FIELD_(component_count) KILN_COUNT(components_),   \
        KILN_FIELD_(components)(components_), KILN_FIELD_(init)(init_),                        \
        KILN_FIELD_(torch_version) KILN_DESCRIPTOR_TORCH_VERSION_,                             \
        KILN_FIELD_(torch_cxx11_abi) KILN_DESCRIPTOR_TORCH_CXX11_ABI_, KILN_FIELD_(reserved) 0 \
  }

/* A component: KILN_COMPONENT_INIT(KILN_COMPONENT_OPTIMIZER, "sgd", KILN_VERSION_INIT(1, 0, 0),
 * "summary or NULL", &capabilities, &vtable) without options, KILN_COMPONENT_OPTIONS_INIT(...,
 * &capabilities, options, &vtable) with a static kiln_option_spec array. Each is written out in
 * full: a version argument forwarded to another macro would reach it as three arguments. */
#define KILN_COMPONENT_INIT(kind_, name_, version_, summary_, capabilities_, vtable_)            \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_component_descriptor), KILN_FIELD_(kind)(kind_), KILN_FIELD_(reserved) 0,        \
        KILN_FIELD_(name)(name_), KILN_FIELD_(version) version_, KILN_FIELD_(summary)(summary_), \
        KILN_FIELD_(capabilities)(capabilities_), KILN_FIELD_(option_count) 0,                   \
        KILN_FIELD_(options) NULL, KILN_FIELD_(vtable)(vtable_)                                  \
  }
#define KILN_COMPONENT_OPTIONS_INIT(kind_, name_, version_, summary_, capabilities_, options_,    \
                                    vtable_)                                                      \
  {                                                                                               \
    KILN_FIELD_(struct_size)                                                                      \
    sizeof(kiln_component_descriptor), KILN_FIELD_(kind)(kind_), KILN_FIELD_(reserved) 0,         \
        KILN_FIELD_(name)(name_), KILN_FIELD_(version) version_, KILN_FIELD_(summary)(summary_),  \
        KILN_FIELD_(capabilities)(capabilities_), KILN_FIELD_(option_count) KILN_COUNT(options_), \
        KILN_FIELD_(options)(options_), KILN_FIELD_(vtable)(vtable_)                              \
  }

#define KILN_PLUGIN_DESCRIPTOR_V1_SIZE KILN_SIZE_UP_TO(kiln_plugin_descriptor, reserved)
#define KILN_COMPONENT_DESCRIPTOR_V1_SIZE KILN_SIZE_UP_TO(kiln_component_descriptor, vtable)

/* Packs (major, minor) as the probe returns it. */
#define KILN_ABI_PACK(major, minor) ((((uint32_t)(major)) << 16) | ((uint32_t)(minor)&0xFFFFu))

#define KILN_PLUGIN_PROBE_SYMBOL "kiln_plugin_abi"
#define KILN_PLUGIN_ENTRY_SYMBOL "kiln_plugin_get"

/* The two functions a plugin library exports. */
typedef uint32_t (*kiln_plugin_abi_fn)(void);
typedef const kiln_plugin_descriptor* (*kiln_plugin_get_fn)(void);

/* The two exported functions, declared here so their definitions get C linkage. */
KILN_EXPORT uint32_t kiln_plugin_abi(void);
KILN_EXPORT const kiln_plugin_descriptor* kiln_plugin_get(void);

/* Defines the probe in a plugin source file: KILN_DEFINE_PLUGIN_PROBE() at file scope. */
#define KILN_DEFINE_PLUGIN_PROBE()                           \
  KILN_EXTERN_C KILN_EXPORT uint32_t kiln_plugin_abi(void) { \
    return KILN_ABI_PACK(KILN_ABI_MAJOR, KILN_ABI_MINOR);    \
  }

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_PLUGIN_H_ */
