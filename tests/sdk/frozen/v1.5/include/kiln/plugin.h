/*
 * kiln/plugin.h — how a library presents itself. Each plugin library exports exactly two
 * functions: the probe kiln_plugin_abi() (cheap, returns the ABI it was built for, lets the host
 * refuse a library before running anything else of it) and the entry kiln_plugin_get() (returns
 * a static descriptor). Everything else in the library should be hidden.
 */
#ifndef KILN_PLUGIN_H_
#define KILN_PLUGIN_H_

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
  KILN_COMPONENT_MODEL = 5      /* vtable: kiln_model_vtable (kiln/model.h); torch-bound */
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

  /* LibTorch the library was built against, for torch-bound components (models): the
   * TORCH_VERSION string ("2.11.0") and the _GLIBCXX_USE_CXX11_ABI flag. NULL and -1 when the
   * library does not use LibTorch across the boundary. */
  const char* torch_version;
  int32_t torch_cxx11_abi;
  int32_t reserved; /* zero */
} kiln_plugin_descriptor;

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
