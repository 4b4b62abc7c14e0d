//! Raw declarations mirroring `sdk/include/kiln/kiln.h` and the parts of `kiln/abi.h` it uses.
//!
//! Every struct is `#[repr(C)]` with the header's fields in the header's order and types, and
//! the function table keeps the header's slot order: a slot's position is its ABI. Slots are
//! `Option<fn>` because the C side is a plain pointer; the safe layer checks them once in
//! [`crate::Api::load`]. `tests/layout.rs` pins sizes and offsets against the C compiler.

use std::os::raw::{c_char, c_void};

/// `KILN_CAPI_VERSION`: the C API version these declarations describe (the table below has
/// version 2's slots; a version-1 library fills only the first `KILN_API_V1_SIZE` bytes).
pub const KILN_CAPI_VERSION: u32 = 2;

// Status codes: kiln/abi.h's, then kiln.h's own.
pub const KILN_OK: i32 = 0;
pub const KILN_ERR_INVALID_ARGUMENT: i32 = 1;
pub const KILN_ERR_UNSUPPORTED: i32 = 2;
pub const KILN_ERR_FAILED_PRECONDITION: i32 = 3;
pub const KILN_ERR_OUT_OF_MEMORY: i32 = 4;
pub const KILN_ERR_INTERNAL: i32 = 5;
pub const KILN_ERR_CANCELLED: i32 = 6;
pub const KILN_ERR_CONFIG: i32 = 16;
pub const KILN_ERR_PLUGIN_REFUSED: i32 = 17;
pub const KILN_ERR_RUN_FAILED: i32 = 18;

// kiln_session_options.log_level
pub const KILN_LOG_DEFAULT: i32 = 0;
pub const KILN_LOG_DEBUG: i32 = 1;
pub const KILN_LOG_INFO: i32 = 2;
pub const KILN_LOG_WARN: i32 = 3;
pub const KILN_LOG_ERROR: i32 = 4;
pub const KILN_LOG_OFF: i32 = 5;

// kiln_session_options.process_settings (bits)
pub const KILN_PROCESS_COUNT_CPU_MEMORY: u32 = 1;
pub const KILN_PROCESS_TORCH_SETTINGS: u32 = 2;
pub const KILN_PROCESS_TUNE_HEAP: u32 = 4;
pub const KILN_PROCESS_SIGNALS: u32 = 8;
pub const KILN_PROCESS_ALL: u32 = 15;

// kiln_progress.state
pub const KILN_SESSION_READY: i32 = 0;
pub const KILN_SESSION_FINISHED: i32 = 1;
pub const KILN_SESSION_CANCELLED: i32 = 2;
pub const KILN_SESSION_STOPPED: i32 = 3;
pub const KILN_SESSION_FAILED: i32 = 4;

// kiln_metrics.kind
pub const KILN_METRICS_STEP: i32 = 1;
pub const KILN_METRICS_EVAL: i32 = 2;

// The KILN_*_V1_SIZE macros (KILN_SIZE_UP_TO(type, last v1 field)) on LP64 targets, where
// size_t and pointers are 8 bytes. They differ from size_of only where the struct has tail
// padding (kiln_plugin_info: 60 vs 64). tests/layout.rs checks them against the compiler.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("the kiln crate mirrors kiln.h for 64-bit targets only (LibTorch's platforms)");

pub const KILN_SESSION_OPTIONS_V1_SIZE: usize = 64;
pub const KILN_SESSION_OPTIONS_V2_SIZE: usize = 96;
pub const KILN_PROGRESS_V1_SIZE: usize = 88;
pub const KILN_METRICS_V1_SIZE: usize = 120;
pub const KILN_METRICS_V2_SIZE: usize = 128;
pub const KILN_METRICS_V3_SIZE: usize = 136;
pub const KILN_METRICS_V4_SIZE: usize = 140;
pub const KILN_PLUGIN_INFO_V1_SIZE: usize = 60;
pub const KILN_API_V1_SIZE: usize = 192;
pub const KILN_API_V2_SIZE: usize = 248;
pub const KILN_STATUS_LOCATION_V1_SIZE: usize = 40;

// session_tensors' kinds (bits)
pub const KILN_TENSORS_PARAMETERS: u32 = 1;
pub const KILN_TENSORS_BUFFERS: u32 = 2;
pub const KILN_TENSORS_MODEL: u32 = 3;
pub const KILN_TENSORS_OPTIMIZER: u32 = 4;
pub const KILN_TENSORS_AVERAGE: u32 = 8;

// kiln_metrics.weights: which weights an evaluation measured
pub const KILN_WEIGHTS_TRAINED: i32 = 1;
pub const KILN_WEIGHTS_AVERAGE: i32 = 2;

// session_load_tensors' flags (bits); 0 is strict
pub const KILN_LOAD_ALLOW_MISSING: u32 = 1;
pub const KILN_LOAD_ALLOW_UNEXPECTED: u32 = 2;

/// Opaque `kiln_status` (kiln/abi.h).
#[repr(C)]
pub struct KilnStatus {
    _private: [u8; 0],
}

/// Opaque `kiln_session`.
#[repr(C)]
pub struct KilnSession {
    _private: [u8; 0],
}

/// Opaque `kiln_plugin_list`.
#[repr(C)]
pub struct KilnPluginList {
    _private: [u8; 0],
}

/// `kiln_version` (kiln/abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KilnVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

/// `kiln_session_options`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnSessionOptions {
    pub struct_size: usize,
    pub overrides: *const *const c_char,
    pub override_count: usize,
    pub plugin_paths: *const *const c_char,
    pub plugin_path_count: usize,
    pub metrics_path: *const c_char,
    pub resume: *const c_char,
    pub log_level: i32,
    pub distributed: i32,
    pub process_settings: u32,
    /// Since V2 (KILN_SESSION_OPTIONS_V2_SIZE): in-process plugin descriptors, borrowed for
    /// the session's life.
    pub components: *const *const KilnPluginDescriptor,
    pub component_count: usize,
    pub component_origin: *const c_char,
}

/// `kiln_progress`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnProgress {
    pub struct_size: usize,
    pub state: i32,
    pub epoch_ended: i32,
    pub step: i64,
    pub max_steps: i64,
    pub epoch: i64,
    pub epochs: i64,
    pub batches_in_epoch: i64,
    pub batches_per_epoch: i64,
    pub rank: i32,
    pub world_size: i32,
    pub stop_reason: *const c_char,
    pub last_checkpoint: *const c_char,
}

/// `kiln_metrics`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnMetrics {
    pub struct_size: usize,
    pub kind: i32,
    pub skipped: i32,
    pub step: i64,
    pub epoch: i64,
    pub loss: f64,
    pub accuracy: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub loss_scale: f64,
    pub step_seconds: f64,
    pub data_seconds: f64,
    pub samples_per_second: f64,
    pub tensor_mb: f64,
    pub tensor_peak_mb: f64,
    pub activation_mb: f64,
    /// Since V2 (KILN_METRICS_V2_SIZE).
    pub accuracy_top5: f64,
    /// Since V3 (KILN_METRICS_V3_SIZE).
    pub map: f64,
    /// Since V4 (KILN_METRICS_V4_SIZE): KILN_WEIGHTS_* on evaluations, 0 on steps.
    pub weights: i32,
}

/// `kiln_metrics_callback`: return 0 to go on, nonzero to stop after this step.
pub type KilnMetricsCallback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, metrics: *const KilnMetrics) -> i32>;

/// `kiln_plugin_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnPluginInfo {
    pub struct_size: usize,
    pub name: *const c_char,
    pub kind: *const c_char,
    pub summary: *const c_char,
    pub library: *const c_char,
    pub version: KilnVersion,
    pub abi_major: u32,
    pub abi_minor: u32,
}

/// `kiln_status_location` (version 2): where a KILN_ERR_CONFIG status points.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnStatusLocation {
    pub struct_size: usize,
    /// Owned by the status, valid until status_release.
    pub file: *const c_char,
    pub line: i64,
    pub column: i64,
    /// Owned by the status, valid until status_release.
    pub key: *const c_char,
}

/// Opaque `kiln_tensor_list` (version 2).
#[repr(C)]
pub struct KilnTensorList {
    _private: [u8; 0],
}

// ---- DLPack (dlpack/dlpack.h): the unversioned managed tensor that ATen's at::toDLPack makes
// and kiln.h's tensor functions exchange. Its layout is the same in DLPack 0.6 (Debian's
// libdlpack-dev) and 1.x (LibTorch's ATen/dlpack.h). ----

// DLDeviceType
pub const DL_CPU: i32 = 1;
pub const DL_CUDA: i32 = 2;
pub const DL_CUDA_HOST: i32 = 3;
// DLDataTypeCode
pub const DL_INT: u8 = 0;
pub const DL_UINT: u8 = 1;
pub const DL_FLOAT: u8 = 2;
pub const DL_OPAQUE_HANDLE: u8 = 3;
pub const DL_BFLOAT: u8 = 4;
pub const DL_COMPLEX: u8 = 5;
/// Since DLPack 0.8 (what LibTorch 2.x uses for torch.bool).
pub const DL_BOOL: u8 = 6;

/// `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// A `DLDeviceType` (a C enum: int).
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// A `DLDataTypeCode`.
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    /// In elements; NULL: compact row-major.
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`: the tensor, its producer's context and the deleter that frees both.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensor)>,
}

/// `kiln_api`: the function table returned by [`kiln_get_api`], with version 2's slots
/// appended. A table of version 1 ends at `KILN_API_V1_SIZE`: never read past its struct_size.
#[repr(C)]
pub struct KilnApi {
    pub struct_size: usize,
    pub version: u32,
    pub reserved: u32,

    // ---- versions ----
    pub version_string: Option<unsafe extern "C" fn() -> *const c_char>,
    pub plugin_abi: Option<unsafe extern "C" fn(major: *mut u32, minor: *mut u32)>,

    // ---- statuses ----
    pub status_code: Option<unsafe extern "C" fn(status: *const KilnStatus) -> i32>,
    pub status_message: Option<unsafe extern "C" fn(status: *const KilnStatus) -> *const c_char>,
    pub status_release: Option<unsafe extern "C" fn(status: *mut KilnStatus)>,

    // ---- sessions ----
    pub session_create_from_file: Option<
        unsafe extern "C" fn(
            path: *const c_char,
            options: *const KilnSessionOptions,
            out: *mut *mut KilnSession,
        ) -> *mut KilnStatus,
    >,
    pub session_create_from_string: Option<
        unsafe extern "C" fn(
            toml: *const c_char,
            name: *const c_char,
            options: *const KilnSessionOptions,
            out: *mut *mut KilnSession,
        ) -> *mut KilnStatus,
    >,
    pub session_destroy: Option<unsafe extern "C" fn(session: *mut KilnSession)>,
    pub session_set_metrics_callback: Option<
        unsafe extern "C" fn(
            session: *mut KilnSession,
            callback: KilnMetricsCallback,
            user_data: *mut c_void,
        ) -> *mut KilnStatus,
    >,
    pub session_run: Option<unsafe extern "C" fn(session: *mut KilnSession) -> *mut KilnStatus>,
    pub session_step: Option<unsafe extern "C" fn(session: *mut KilnSession) -> *mut KilnStatus>,
    pub session_evaluate: Option<
        unsafe extern "C" fn(session: *mut KilnSession, out: *mut KilnMetrics) -> *mut KilnStatus,
    >,
    pub session_save_checkpoint: Option<
        unsafe extern "C" fn(
            session: *mut KilnSession,
            path: *mut *const c_char,
        ) -> *mut KilnStatus,
    >,
    pub session_cancel: Option<unsafe extern "C" fn(session: *mut KilnSession)>,
    pub session_progress: Option<
        unsafe extern "C" fn(
            session: *const KilnSession,
            out: *mut KilnProgress,
        ) -> *mut KilnStatus,
    >,
    pub session_last_metrics: Option<
        unsafe extern "C" fn(
            session: *const KilnSession,
            kind: i32,
            out: *mut KilnMetrics,
        ) -> *mut KilnStatus,
    >,

    // ---- plugins ----
    pub plugins_list: Option<
        unsafe extern "C" fn(
            extra_dirs: *const *const c_char,
            extra_dir_count: usize,
            out: *mut *mut KilnPluginList,
        ) -> *mut KilnStatus,
    >,
    pub plugins_count: Option<unsafe extern "C" fn(list: *const KilnPluginList) -> usize>,
    pub plugins_get: Option<
        unsafe extern "C" fn(
            list: *const KilnPluginList,
            index: usize,
            out: *mut KilnPluginInfo,
        ) -> *mut KilnStatus,
    >,
    pub plugins_refused_count: Option<unsafe extern "C" fn(list: *const KilnPluginList) -> usize>,
    pub plugins_refused:
        Option<unsafe extern "C" fn(list: *const KilnPluginList, index: usize) -> *const c_char>,
    pub plugins_release: Option<unsafe extern "C" fn(list: *mut KilnPluginList)>,

    // ==== version 2 (present when struct_size >= KILN_API_V2_SIZE) ====
    pub status_location: Option<
        unsafe extern "C" fn(status: *const KilnStatus, out: *mut KilnStatusLocation) -> i32,
    >,
    pub session_tensors: Option<
        unsafe extern "C" fn(
            session: *mut KilnSession,
            kinds: u32,
            out: *mut *mut KilnTensorList,
        ) -> *mut KilnStatus,
    >,
    pub tensor_list_count: Option<unsafe extern "C" fn(list: *const KilnTensorList) -> usize>,
    pub tensor_list_name:
        Option<unsafe extern "C" fn(list: *const KilnTensorList, index: usize) -> *const c_char>,
    pub tensor_list_get: Option<
        unsafe extern "C" fn(
            list: *const KilnTensorList,
            index: usize,
            out: *mut *mut DLManagedTensor,
        ) -> *mut KilnStatus,
    >,
    pub tensor_list_release: Option<unsafe extern "C" fn(list: *mut KilnTensorList)>,
    pub session_load_tensors: Option<
        unsafe extern "C" fn(
            session: *mut KilnSession,
            names: *const *const c_char,
            tensors: *const *const DLManagedTensor,
            count: usize,
            flags: u32,
        ) -> *mut KilnStatus,
    >,
}

// ---- the plugin ABI (kiln/abi.h, kiln/host.h, kiln/plugin.h, kiln/lr_policy.h): what an
// in-process component (kiln_session_options.components) is made of ----

/// `KILN_COMPONENT_LR_POLICY` (kiln_component_descriptor.kind).
pub const KILN_COMPONENT_LR_POLICY: i32 = 2;
/// `KILN_CAP_DEVICE_CPU`, `KILN_CAP_DEVICE_CUDA` (kiln_capabilities.flags).
pub const KILN_CAP_DEVICE_CPU: u64 = 1;
pub const KILN_CAP_DEVICE_CUDA: u64 = 2;
// kiln_option_spec.type / kiln_option_value.type
pub const KILN_OPT_BOOL: i32 = 1;
pub const KILN_OPT_INT: i32 = 2;
pub const KILN_OPT_FLOAT: i32 = 3;
pub const KILN_OPT_STRING: i32 = 4;
pub const KILN_OPT_INT_LIST: i32 = 5;
pub const KILN_OPT_FLOAT_LIST: i32 = 6;
pub const KILN_OPT_STRING_LIST: i32 = 7;

/// The first slots of `kiln_host_api` (kiln/host.h), all an LR policy calls. Received by
/// pointer from the host, never made here, so the rest of the table need not be spelt out.
#[repr(C)]
pub struct KilnHostApiHead {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub make_status:
        Option<unsafe extern "C" fn(code: i32, message: *const c_char) -> *mut KilnStatus>,
}

/// `kiln_option_spec` (kiln/abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnOptionSpec {
    pub struct_size: usize,
    pub name: *const c_char,
    pub type_: i32,
    pub has_min: i32,
    pub has_max: i32,
    pub reserved: i32,
    pub min: f64,
    pub max: f64,
    pub default_value: *const c_char,
    pub choices: *const c_char,
    pub doc: *const c_char,
}

/// `kiln_option_value` (kiln/abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnOptionValue {
    pub struct_size: usize,
    pub name: *const c_char,
    pub type_: i32,
    pub bool_value: i32,
    pub int_value: i64,
    pub float_value: f64,
    pub string_value: *const c_char,
    pub int_list: *const i64,
    pub float_list: *const f64,
    pub list_length: usize,
    pub string_list: *const *const c_char,
}

/// `kiln_options` (kiln/abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnOptions {
    pub struct_size: usize,
    pub count: usize,
    pub values: *const KilnOptionValue,
}

/// `kiln_capabilities` (kiln/abi.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnCapabilities {
    pub struct_size: usize,
    pub flags: u64,
    pub attribute_count: usize,
    pub attributes: *const c_void,
}

/// `kiln_lr_schedule` (kiln/lr_policy.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnLrSchedule {
    pub struct_size: usize,
    pub base_lr: f64,
    pub max_iters: i64,
    pub warmup_iters: i64,
    pub iters_per_epoch: i64,
}

/// `kiln_lr_policy_vtable` (kiln/lr_policy.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnLrPolicyVtable {
    pub struct_size: usize,
    pub create: Option<
        unsafe extern "C" fn(
            host: *const KilnHostApiHead,
            options: *const KilnOptions,
            schedule: *const KilnLrSchedule,
            out: *mut *mut c_void,
        ) -> *mut KilnStatus,
    >,
    pub destroy: Option<unsafe extern "C" fn(instance: *mut c_void)>,
    pub lr_at: Option<
        unsafe extern "C" fn(instance: *mut c_void, iter: i64, lr: *mut f64) -> *mut KilnStatus,
    >,
    /// ABI 1.15: each evaluation's results.
    pub observe: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            observation: *const KilnLrObservation,
        ) -> *mut KilnStatus,
    >,
    /// ABI 1.15: the policy's state as numbers, for checkpoints.
    pub get_state: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            values: *mut f64,
            capacity: usize,
            count: *mut usize,
        ) -> *mut KilnStatus,
    >,
    /// ABI 1.15: restores what get_state wrote.
    pub set_state: Option<
        unsafe extern "C" fn(
            instance: *mut c_void,
            values: *const f64,
            count: usize,
        ) -> *mut KilnStatus,
    >,
}

/// `kiln_lr_observation` (kiln/lr_policy.h, ABI 1.15): one evaluation's results.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnLrObservation {
    pub struct_size: usize,
    pub iter: i64,
    pub epoch: i64,
    pub count: usize,
    pub names: *const *const c_char,
    pub values: *const f64,
}

/// `kiln_component_descriptor` (kiln/plugin.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnComponentDescriptor {
    pub struct_size: usize,
    pub kind: i32,
    pub reserved: i32,
    pub name: *const c_char,
    pub version: KilnVersion,
    pub summary: *const c_char,
    pub capabilities: *const KilnCapabilities,
    pub option_count: usize,
    pub options: *const KilnOptionSpec,
    pub vtable: *const c_void,
}

/// `kiln_plugin_descriptor` (kiln/plugin.h).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnPluginDescriptor {
    pub struct_size: usize,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub name: *const c_char,
    pub version: KilnVersion,
    pub component_count: usize,
    pub components: *const *const KilnComponentDescriptor,
    pub init: Option<unsafe extern "C" fn(host: *const KilnHostApiHead) -> *mut KilnStatus>,
    pub torch_version: *const c_char,
    pub torch_cxx11_abi: i32,
    pub reserved: i32,
}

// Zero-filled structs with struct_size set to this binding's size, as the header asks callers
// to prepare them. All-zero bytes are valid for every field (integers, floats, raw pointers).
macro_rules! sized_default {
    ($($t:ident),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                // SAFETY: every field is an integer, a float, a raw pointer or an Option of a
                // function pointer (all-zero: None).
                let mut v: Self = unsafe { std::mem::zeroed() };
                v.struct_size = std::mem::size_of::<Self>();
                v
            }
        }
    )*};
}
sized_default!(
    KilnSessionOptions,
    KilnStatusLocation,
    KilnProgress,
    KilnMetrics,
    KilnPluginInfo,
    KilnOptionSpec,
    KilnCapabilities,
    KilnLrPolicyVtable,
    KilnLrObservation,
    KilnComponentDescriptor,
    KilnPluginDescriptor
);

extern "C" {
    /// The table of API `version`, or NULL when the library does not serve it. Static.
    pub fn kiln_get_api(version: u32) -> *const KilnApi;
}
