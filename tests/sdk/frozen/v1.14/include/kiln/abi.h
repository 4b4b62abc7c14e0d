/*
 * kiln/abi.h — the base of Kiln's plugin ABI: versions, status objects, struct sizes,
 * capabilities and options schemas. Every other kiln/ header includes this one.
 *
 * VERSIONING RULES
 *  - KILN_ABI_MAJOR changes when anything is removed, reordered or retyped. A host loads a plugin
 *    only when the plugin's major equals the host's.
 *  - KILN_ABI_MINOR changes when something is appended (a struct field, a function slot, an enum
 *    value). A host accepts a plugin whose minor is not newer than its own; it reads appended
 *    fields only when `struct_size` says the writer had them.
 *  - Every struct begins with `size_t struct_size`, set by whoever fills the struct to
 *    sizeof(the struct as that side knows it). Readers check a field lies inside struct_size
 *    (KILN_HAS_FIELD) before touching it.
 *  - A NULL function slot means "not supported"; slots marked "required" must be non-NULL.
 *
 * OWNERSHIP (applies unless a field says otherwise)
 *  - `const char*` in descriptors and schemas: static strings owned by the plugin library, alive
 *    as long as the library is loaded (the host never unloads a plugin while it runs).
 *  - DLTensor arguments are borrowed views valid only for the duration of the call.
 *  - kiln_status* returned to the host is owned by the host, which destroys it.
 *
 * ERRORS: a function returning kiln_status* returns NULL on success; otherwise a status created
 * through kiln_host_api.make_status. No C++ exception may cross this boundary.
 */
#ifndef KILN_ABI_H_
#define KILN_ABI_H_

#include <stddef.h>
#include <stdint.h>

/* Torch's ATen/dlpack.h and Debian's dlpack/dlpack.h share one include guard and one layout
 * for DLTensor/DLDevice/DLDataType; whichever came first serves. */
#ifndef DLPACK_DLPACK_H_
#include <dlpack/dlpack.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_MAJOR 1
#define KILN_ABI_MINOR 14

/* Symbol visibility for the plugin entry points (everything else should stay hidden). */
#if defined(_WIN32)
#define KILN_EXPORT __declspec(dllexport)
#else
#define KILN_EXPORT __attribute__((visibility("default")))
#endif

/* C linkage for definitions written in C++ files. */
#ifdef __cplusplus
#define KILN_EXTERN_C extern "C"
#else
#define KILN_EXTERN_C
#endif

/* KILN_MUST_USE marks a function whose result the caller must use (a kiln_status* it owns):
 * [[nodiscard]] in C++17 and C23, GCC's and Clang's warn_unused_result in older C, nothing
 * elsewhere. KILN_MUST_USE_SLOT marks a function-pointer member (a vtable or services slot):
 * only warn_unused_result applies to one (GCC and Clang, C and C++; [[nodiscard]] cannot, GCC
 * ignores it there with a warning), so other compilers get nothing. Neither works on a typedef
 * of a function-pointer type with Clang. GCC warns even when the result is cast to void: use it. */
#if defined(__cplusplus) && __cplusplus >= 201703L
#define KILN_MUST_USE [[nodiscard]]
#elif !defined(__cplusplus) && defined(__STDC_VERSION__) && __STDC_VERSION__ >= 202311L
#define KILN_MUST_USE [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define KILN_MUST_USE __attribute__((warn_unused_result))
#else
#define KILN_MUST_USE
#endif
#if defined(__GNUC__) || defined(__clang__)
#define KILN_MUST_USE_SLOT __attribute__((warn_unused_result))
#else
#define KILN_MUST_USE_SLOT
#endif

/* Initialiser macros (KILN_*_INIT) fill a struct with every field named: C99 designated
 * initialisers in C and C++20, the same fields in order in older C++ (which has no designated
 * initialisers). They set struct_size and zero the reserved fields, so a plugin never copies a
 * positional list of a struct's fields. */
#if !defined(__cplusplus) || __cplusplus >= 202002L
#define KILN_FIELD_(field) .field =
#else
#define KILN_FIELD_(field)
#endif
/* Entries of a static array. */
#define KILN_COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* Size of `type` up to and including `field`: the minimum struct_size that contains it. */
#define KILN_SIZE_UP_TO(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))
/* True when the struct pointed to by `ptr` (of type `type`) was filled with `field` present. */
#define KILN_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= KILN_SIZE_UP_TO(type, field))

/* ---- status ------------------------------------------------------------------------------- */

/* Opaque error object. NULL means success. Created by kiln_host_api.make_status, owned and
 * destroyed by the host. */
typedef struct kiln_status kiln_status;

/* Status codes (stored as int32_t). */
enum {
  KILN_OK = 0,
  KILN_ERR_INVALID_ARGUMENT = 1,    /* an input or option is out of its allowed domain */
  KILN_ERR_UNSUPPORTED = 2,         /* device, dtype or feature the component does not handle */
  KILN_ERR_FAILED_PRECONDITION = 3, /* called in a state that does not allow it */
  KILN_ERR_OUT_OF_MEMORY = 4,       /* an allocation failed */
  KILN_ERR_INTERNAL = 5,            /* a bug or an unexpected exception inside the component */
  KILN_ERR_CANCELLED = 6,           /* the operation was cancelled by the host */
  KILN_ERR_DATA_LOSS = 7 /* 1.7: a sample's data is missing, truncated or corrupt (datasets) */
};

/* ---- versions ------------------------------------------------------------------------------ */

/* Semantic version of a plugin or component. */
typedef struct kiln_version {
  uint32_t major; /* incompatible changes */
  uint32_t minor; /* compatible additions */
  uint32_t patch; /* fixes */
} kiln_version;

/* A kiln_version initialiser: KILN_VERSION_INIT(1, 2, 0). */
#define KILN_VERSION_INIT(major_, minor_, patch_) \
  { KILN_FIELD_(major)(major_), KILN_FIELD_(minor)(minor_), KILN_FIELD_(patch)(patch_) }

/* ---- capabilities -------------------------------------------------------------------------- */

/* Capability bits (kiln_capabilities.flags). Unknown bits are ignored by readers. */
#define KILN_CAP_DEVICE_CPU ((uint64_t)1 << 0)         /* runs on CPU tensors */
#define KILN_CAP_DEVICE_CUDA ((uint64_t)1 << 1)        /* runs on CUDA tensors */
#define KILN_CAP_DTYPE_F32 ((uint64_t)1 << 8)          /* accepts float32 tensors */
#define KILN_CAP_DTYPE_F16 ((uint64_t)1 << 9)          /* accepts float16 tensors */
#define KILN_CAP_DTYPE_BF16 ((uint64_t)1 << 10)        /* accepts bfloat16 tensors */
#define KILN_CAP_DTYPE_F64 ((uint64_t)1 << 11)         /* accepts float64 tensors */
#define KILN_CAP_NEEDS_COLLECTIVES ((uint64_t)1 << 16) /* calls the host collectives */
#define KILN_CAP_IN_PLACE ((uint64_t)1 << 17)          /* may write its output over its input */
#define KILN_CAP_MULTI_TENSOR ((uint64_t)1 << 18)      /* processes a whole tensor list per call */
#define KILN_CAP_CAPTURABLE ((uint64_t)1 << 19) /* 1.4, optimizers: step may be graph-captured */
/* 1.14, optimizers: steps an inner optimizer (the pipeline's [optimizer.inner]) through
 * kiln_host_api.inner_step; the host refuses a pipeline that gives it none. */
#define KILN_CAP_WRAPS_OPTIMIZER ((uint64_t)1 << 20)

/* A free-form name/value capability (e.g. {"activations", "leaky_relu,elu,identity"}). */
typedef struct kiln_attribute {
  const char* name;  /* static, owned by the plugin */
  const char* value; /* static, owned by the plugin */
} kiln_attribute;

/* What a component can do; the host checks it against the pipeline before training. */
typedef struct kiln_capabilities {
  size_t struct_size;               /* sizeof(kiln_capabilities) as the plugin knows it */
  uint64_t flags;                   /* KILN_CAP_* bits */
  size_t attribute_count;           /* entries in `attributes` */
  const kiln_attribute* attributes; /* static array owned by the plugin; may be NULL if count 0 */
} kiln_capabilities;

/* kiln_capabilities initialisers: flags only, or flags and a static kiln_attribute array. */
#define KILN_CAPABILITIES_INIT(flags_) KILN_CAPABILITIES_ATTRIBUTES_INIT_(flags_, 0, NULL)
#define KILN_CAPABILITIES_ATTRIBUTES_INIT(flags_, attributes_) \
  KILN_CAPABILITIES_ATTRIBUTES_INIT_(flags_, KILN_COUNT(attributes_), attributes_)
#define KILN_CAPABILITIES_ATTRIBUTES_INIT_(flags_, count_, attributes_)                          \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_capabilities), KILN_FIELD_(flags)(flags_), KILN_FIELD_(attribute_count)(count_), \
        KILN_FIELD_(attributes)(attributes_)                                                     \
  }

/* ---- options schema ------------------------------------------------------------------------ */

/* Option value types (stored as int32_t). */
enum {
  KILN_OPT_BOOL = 1,       /* TOML boolean */
  KILN_OPT_INT = 2,        /* TOML integer (int64) */
  KILN_OPT_FLOAT = 3,      /* TOML float; an integer literal is accepted and converted */
  KILN_OPT_STRING = 4,     /* TOML string; `choices` may restrict it */
  KILN_OPT_INT_LIST = 5,   /* TOML array of integers */
  KILN_OPT_FLOAT_LIST = 6, /* TOML array of numbers */
  KILN_OPT_STRING_LIST = 7 /* TOML array of strings */
};

/* One option a component accepts. The host validates the pipeline's TOML against it, fills the
 * default when the key is absent, and generates documentation from it. */
typedef struct kiln_option_spec {
  size_t struct_size;        /* sizeof(kiln_option_spec) as the plugin knows it */
  const char* name;          /* key in the component's TOML table; static */
  int32_t type;              /* KILN_OPT_* */
  int32_t has_min;           /* nonzero: numeric values (and list items) must be >= min */
  int32_t has_max;           /* nonzero: numeric values (and list items) must be <= max */
  int32_t reserved;          /* zero */
  double min;                /* lower bound, inclusive, when has_min */
  double max;                /* upper bound, inclusive, when has_max */
  const char* default_value; /* default as a TOML literal ("0.9", "true", "\"x\"", "[1, 2]");
                                NULL: the option is required; static */
  const char* choices;       /* strings only: comma-separated allowed values, or NULL; static */
  const char* doc;           /* one line of documentation; static */
} kiln_option_spec;

/* kiln_option_spec initialisers. `default_` is a TOML literal or NULL (required option); every
 * string is static. The general form names every field; the others are shorthands:
 *   KILN_OPTION_INIT("nesterov", KILN_OPT_BOOL, "false", "Nesterov momentum")
 *   KILN_OPTION_MIN_INIT("momentum", KILN_OPT_FLOAT, 0.0, "0.0", "momentum factor, >= 0")
 *   KILN_OPTION_RANGE_INIT("gamma", KILN_OPT_FLOAT, 0.0, 1.0, "0.1", "decay factor in [0, 1]")
 *   KILN_OPTION_CHOICES_INIT("mode", "min,max", "\"min\"", "which extreme") (a string) */
#define KILN_OPTION_SPEC_INIT(name_, type_, has_min_, min_, has_max_, max_, default_, choices_,  \
                              doc_)                                                              \
  {                                                                                              \
    KILN_FIELD_(struct_size)                                                                     \
    sizeof(kiln_option_spec), KILN_FIELD_(name)(name_), KILN_FIELD_(type)(type_),                \
        KILN_FIELD_(has_min)(has_min_), KILN_FIELD_(has_max)(has_max_), KILN_FIELD_(reserved) 0, \
        KILN_FIELD_(min)(min_), KILN_FIELD_(max)(max_), KILN_FIELD_(default_value)(default_),    \
        KILN_FIELD_(choices)(choices_), KILN_FIELD_(doc)(doc_)                                   \
  }
#define KILN_OPTION_INIT(name_, type_, default_, doc_) \
  KILN_OPTION_SPEC_INIT(name_, type_, 0, 0.0, 0, 0.0, default_, NULL, doc_)
#define KILN_OPTION_MIN_INIT(name_, type_, min_, default_, doc_) \
  KILN_OPTION_SPEC_INIT(name_, type_, 1, min_, 0, 0.0, default_, NULL, doc_)
#define KILN_OPTION_RANGE_INIT(name_, type_, min_, max_, default_, doc_) \
  KILN_OPTION_SPEC_INIT(name_, type_, 1, min_, 1, max_, default_, NULL, doc_)
#define KILN_OPTION_CHOICES_INIT(name_, choices_, default_, doc_) \
  KILN_OPTION_SPEC_INIT(name_, KILN_OPT_STRING, 0, 0.0, 0, 0.0, default_, choices_, doc_)

/* A validated option value as the host passes it to a component. */
typedef struct kiln_option_value {
  size_t struct_size;             /* sizeof(kiln_option_value) as the host knows it */
  const char* name;               /* the option's name; owned by the host, valid during the call */
  int32_t type;                   /* KILN_OPT_*, equal to the spec's type */
  int32_t bool_value;             /* KILN_OPT_BOOL: 0 or 1 */
  int64_t int_value;              /* KILN_OPT_INT */
  double float_value;             /* KILN_OPT_FLOAT */
  const char* string_value;       /* KILN_OPT_STRING; host-owned, valid during the call */
  const int64_t* int_list;        /* KILN_OPT_INT_LIST; host-owned, valid during the call */
  const double* float_list;       /* KILN_OPT_FLOAT_LIST; host-owned, valid during the call */
  size_t list_length;             /* entries in int_list, float_list or string_list */
  const char* const* string_list; /* KILN_OPT_STRING_LIST; host-owned, valid during the call */
} kiln_option_value;

/* All options of one component instance, every schema option present (defaults filled). */
typedef struct kiln_options {
  size_t struct_size;              /* sizeof(kiln_options) as the host knows it */
  size_t count;                    /* entries in `values` */
  const kiln_option_value* values; /* host-owned array, valid during the call that receives it */
} kiln_options;

/* Lookup helpers: return the named option or NULL. Plugins copy what they need at create time. */
static inline const kiln_option_value* kiln_options_find(const kiln_options* options,
                                                         const char* name) {
  size_t i;
  if (options == NULL || name == NULL) return NULL;
  for (i = 0; i < options->count; ++i) {
    const char* a = options->values[i].name;
    const char* b = name;
    while (*a != '\0' && *a == *b) {
      ++a;
      ++b;
    }
    if (*a == '\0' && *b == '\0') return &options->values[i];
  }
  return NULL;
}
static inline double kiln_options_float(const kiln_options* options, const char* name,
                                        double fallback) {
  const kiln_option_value* v = kiln_options_find(options, name);
  if (v == NULL) return fallback;
  if (v->type == KILN_OPT_INT) return (double)v->int_value;
  return v->type == KILN_OPT_FLOAT ? v->float_value : fallback;
}
static inline int64_t kiln_options_int(const kiln_options* options, const char* name,
                                       int64_t fallback) {
  const kiln_option_value* v = kiln_options_find(options, name);
  return (v != NULL && v->type == KILN_OPT_INT) ? v->int_value : fallback;
}
static inline int kiln_options_bool(const kiln_options* options, const char* name, int fallback) {
  const kiln_option_value* v = kiln_options_find(options, name);
  return (v != NULL && v->type == KILN_OPT_BOOL) ? v->bool_value : fallback;
}
static inline const char* kiln_options_string(const kiln_options* options, const char* name,
                                              const char* fallback) {
  const kiln_option_value* v = kiln_options_find(options, name);
  return (v != NULL && v->type == KILN_OPT_STRING) ? v->string_value : fallback;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_ABI_H_ */
