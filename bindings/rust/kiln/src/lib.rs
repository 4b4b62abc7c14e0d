//! Safe Rust bindings to libkiln, the C API of the Kiln training framework (`kiln/kiln.h`).
//!
//! ```no_run
//! use kiln::{LogLevel, Options, Session, State};
//!
//! fn main() -> Result<(), kiln::Error> {
//!     let options = Options::new().set("run.epochs=2").log_level(LogLevel::Warn);
//!     let mut session = Session::from_file("configs/quickstart.toml", &options)?;
//!     while session.progress()?.state == State::Ready {
//!         session.step()?;
//!         if session.progress()?.epoch_ended {
//!             println!("accuracy {:.4}", session.evaluate()?.accuracy);
//!         }
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Ownership follows the header: every `kiln_status` is released before a call returns (its
//! code and message are copied into [`Error`]), library-owned strings are copied into `String`s
//! at once, and a [`Session`] destroys its native session when dropped.
//!
//! Threads: [`Session`] is `Send` but not `Sync`; training calls take `&mut self`. To stop a
//! session from another thread while it trains, take a [`Canceller`].
//!
//! C API version 2 (asked for first; a version-1 library still works, its version-2 calls
//! return UNSUPPORTED): [`Error::location`] says where a configuration error points, and
//! [`Session::tensors`] / [`Session::load_tensors`] reach the model's and the optimizer's
//! tensors without copies (see [`tensor`]).

use std::any::Any;
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, RwLock, Weak};

pub mod components;
pub mod sys;

pub use tensor::{DType, Device, Element, Slice, SliceMut, Tensor, TensorView};

/// Status codes ([`Error::code`]): kiln/abi.h's `KILN_ERR_*` and kiln.h's own.
pub mod code {
    use crate::sys;
    pub const OK: i32 = sys::KILN_OK;
    pub const INVALID_ARGUMENT: i32 = sys::KILN_ERR_INVALID_ARGUMENT;
    pub const UNSUPPORTED: i32 = sys::KILN_ERR_UNSUPPORTED;
    pub const FAILED_PRECONDITION: i32 = sys::KILN_ERR_FAILED_PRECONDITION;
    pub const OUT_OF_MEMORY: i32 = sys::KILN_ERR_OUT_OF_MEMORY;
    pub const INTERNAL: i32 = sys::KILN_ERR_INTERNAL;
    pub const CANCELLED: i32 = sys::KILN_ERR_CANCELLED;
    pub const CONFIG: i32 = sys::KILN_ERR_CONFIG;
    pub const PLUGIN_REFUSED: i32 = sys::KILN_ERR_PLUGIN_REFUSED;
    pub const RUN_FAILED: i32 = sys::KILN_ERR_RUN_FAILED;

    /// The code's name without the `KILN_ERR_` prefix ("CONFIG"), or "UNKNOWN".
    pub fn name(code: i32) -> &'static str {
        match code {
            OK => "OK",
            INVALID_ARGUMENT => "INVALID_ARGUMENT",
            UNSUPPORTED => "UNSUPPORTED",
            FAILED_PRECONDITION => "FAILED_PRECONDITION",
            OUT_OF_MEMORY => "OUT_OF_MEMORY",
            INTERNAL => "INTERNAL",
            CANCELLED => "CANCELLED",
            CONFIG => "CONFIG",
            PLUGIN_REFUSED => "PLUGIN_REFUSED",
            RUN_FAILED => "RUN_FAILED",
            _ => "UNKNOWN",
        }
    }
}

// ---- errors ------------------------------------------------------------------------------------

/// A failed call: the library's status code and message (unchanged, so TOML errors keep their
/// file:line:column), or an error of this binding with the closest code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// One of [`code`]'s constants.
    pub code: i32,
    pub message: String,
    /// Where a configuration error (code CONFIG) points, from C API version 2's
    /// status_location; None for other errors, errors of this binding and version-1 libraries.
    pub location: Option<Location>,
}

/// Where a configuration error points (`kiln_status_location`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// The pipeline file as given (the name passed to [`Session::from_str`] for TOML text),
    /// "--set" for an override, "" when unknown.
    pub file: String,
    /// 1-based; 0 when the error is not at a place in the file (an override, a default).
    pub line: i64,
    /// 1-based; 0 when line is 0.
    pub column: i64,
    /// The dotted key the error is about ("run.epochz"), or "" (a TOML syntax error).
    pub key: String,
}

impl Error {
    pub fn new(code: i32, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
            location: None,
        }
    }

    /// The code's name ("CONFIG", "FAILED_PRECONDITION", ...).
    pub fn code_name(&self) -> &'static str {
        code::name(self.code)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{} (code {})", self.code_name(), self.code)
        } else {
            write!(f, "{}: {}", self.code_name(), self.message)
        }
    }
}

impl std::error::Error for Error {}

// ---- the function table ------------------------------------------------------------------------

/// The slot `$name` of a table that [`Api::load`] has checked to be complete.
macro_rules! slot {
    ($api:expr, $name:ident) => {
        $api.raw.$name.expect(concat!(
            "kiln_api.",
            stringify!($name),
            " was checked by Api::load"
        ))
    };
}

/// The version-2 slot `$name`, or an UNSUPPORTED error when the table is version 1's.
macro_rules! slot_v2 {
    ($api:expr, $name:ident) => {
        $api.raw.$name.ok_or_else(|| {
            Error::new(
                code::UNSUPPORTED,
                format!(
                    "{} needs C API version 2; libkiln's table is version {}",
                    stringify!($name),
                    $api.raw.version
                ),
            )
        })
    };
}

// After slot_v2!, which it uses.
pub mod tensor;

/// Bits of [`Session::tensors`]' kinds (`KILN_TENSORS_*`).
pub mod kinds {
    use crate::sys;
    /// The model's parameters, by state_dict name ("layers.0.linear.weight").
    pub const PARAMETERS: u32 = sys::KILN_TENSORS_PARAMETERS;
    /// The model's buffers ("bn1.running_mean").
    pub const BUFFERS: u32 = sys::KILN_TENSORS_BUFFERS;
    /// Both, as a checkpoint's model.safetensors names them.
    pub const MODEL: u32 = sys::KILN_TENSORS_MODEL;
    /// The optimizer's state, `"<parameter>.<slot>"` ("head.weight.momentum_buffer").
    pub const OPTIMIZER: u32 = sys::KILN_TENSORS_OPTIMIZER;
    /// `[ema]`'s moving average of the parameters and buffers, `"ema/<name>"`; an error
    /// (FailedPrecondition) when the pipeline keeps none.
    pub const AVERAGE: u32 = sys::KILN_TENSORS_AVERAGE;
}

/// Bits of [`Session::load_tensors`]' flags (`KILN_LOAD_*`).
pub mod load {
    use crate::sys;
    /// Every model tensor must be given, and every name must be the model's.
    pub const STRICT: u32 = 0;
    /// Model tensors not given keep their values.
    pub const ALLOW_MISSING: u32 = sys::KILN_LOAD_ALLOW_MISSING;
    /// Given names the model does not have are skipped.
    pub const ALLOW_UNEXPECTED: u32 = sys::KILN_LOAD_ALLOW_UNEXPECTED;
}

/// libkiln's function table (C API version 2, or 1 from an older library). Cheap to copy;
/// valid while the process runs (libkiln is linked, never unloaded).
#[derive(Clone, Copy)]
pub struct Api {
    /// Always a whole `sys::KilnApi`: a version-1 table is copied into a zero-filled one (see
    /// `whole_table`), so the version-2 slots of a version-1 table read as None.
    raw: &'static sys::KilnApi,
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api")
            .field("struct_size", &self.raw.struct_size)
            .field("version", &self.raw.version)
            .finish()
    }
}

/// Zero-filled copies of short tables (index: the version), made once and kept for the
/// process's life: reading a version-1 table as the whole struct would read past its end.
static SHORT_TABLES: [std::sync::atomic::AtomicPtr<sys::KilnApi>; 3] = [
    std::sync::atomic::AtomicPtr::new(ptr::null_mut()),
    std::sync::atomic::AtomicPtr::new(ptr::null_mut()),
    std::sync::atomic::AtomicPtr::new(ptr::null_mut()),
];

/// The table at `p` (served as `version`, `size` bytes long) as a whole `sys::KilnApi`.
///
/// SAFETY: `p` is a static table of at least `size` bytes, as kiln_get_api returns.
unsafe fn whole_table(p: *const sys::KilnApi, version: u32, size: usize) -> &'static sys::KilnApi {
    use std::sync::atomic::Ordering;
    if size >= std::mem::size_of::<sys::KilnApi>() {
        return &*p;
    }
    let cache = &SHORT_TABLES[version as usize];
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return &*cached;
    }
    let mut copy: Box<sys::KilnApi> = Box::new(std::mem::zeroed());
    ptr::copy_nonoverlapping(
        p as *const u8,
        &mut *copy as *mut sys::KilnApi as *mut u8,
        size,
    );
    let fresh = Box::into_raw(copy);
    match cache.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => &*fresh,
        Err(other) => {
            // Another thread made it first: keep theirs.
            drop(Box::from_raw(fresh));
            &*other
        }
    }
}

impl Api {
    /// Asks libkiln for the version-2 table, or the version-1 table when the library does not
    /// serve version 2 (then [`Session::tensors`], [`Session::load_tensors`] and
    /// [`Error::location`] are unavailable: UNSUPPORTED, None).
    pub fn load() -> Result<Api, Error> {
        // SAFETY: kiln_get_api may be called from any thread.
        if unsafe { sys::kiln_get_api(sys::KILN_CAPI_VERSION) }.is_null() {
            Api::load_version(1)
        } else {
            Api::load_version(sys::KILN_CAPI_VERSION)
        }
    }

    /// Asks libkiln for the table of `version` (1 or 2) and checks it is whole: a library that
    /// serves only a shorter table, or leaves a slot empty, is refused here rather than
    /// crashing later. Version 1 is what a program written for the first C API gets.
    pub fn load_version(version: u32) -> Result<Api, Error> {
        let need = match version {
            1 => sys::KILN_API_V1_SIZE,
            2 => sys::KILN_API_V2_SIZE,
            _ => {
                return Err(Error::new(
                    code::UNSUPPORTED,
                    format!("this crate knows C API versions 1 and 2, not {}", version),
                ))
            }
        };
        // SAFETY: kiln_get_api may be called from any thread; the table is static.
        let p = unsafe { sys::kiln_get_api(version) };
        if p.is_null() {
            return Err(Error::new(
                code::UNSUPPORTED,
                format!("libkiln does not serve C API version {}", version),
            ));
        }
        // SAFETY: non-NULL and static; struct_size and version begin every version's table.
        let (size, served) = unsafe { ((*p).struct_size, (*p).version) };
        if size < need {
            return Err(Error::new(
                code::UNSUPPORTED,
                format!(
                    "libkiln's function table has struct_size {}, smaller than version {}'s {}",
                    size, version, need
                ),
            ));
        }
        if served != version {
            return Err(Error::new(
                code::UNSUPPORTED,
                format!(
                    "libkiln answered C API version {} when asked for {}",
                    served, version
                ),
            ));
        }
        // SAFETY: a static table of `size` bytes.
        let raw = unsafe { whole_table(p, version, size) };
        macro_rules! require {
            ($($name:ident),*) => {$(
                if raw.$name.is_none() {
                    return Err(Error::new(
                        code::UNSUPPORTED,
                        concat!("libkiln's function table has no ", stringify!($name)),
                    ));
                }
            )*};
        }
        require!(
            version_string,
            plugin_abi,
            status_code,
            status_message,
            status_release,
            session_create_from_file,
            session_create_from_string,
            session_destroy,
            session_set_metrics_callback,
            session_run,
            session_step,
            session_evaluate,
            session_save_checkpoint,
            session_cancel,
            session_progress,
            session_last_metrics,
            plugins_list,
            plugins_count,
            plugins_get,
            plugins_refused_count,
            plugins_refused,
            plugins_release
        );
        if version >= 2 {
            require!(
                status_location,
                session_tensors,
                tensor_list_count,
                tensor_list_name,
                tensor_list_get,
                tensor_list_release,
                session_load_tensors
            );
        }
        Ok(Api { raw })
    }

    /// The C API version of this table (2, or 1 from an older library).
    pub fn api_version(&self) -> u32 {
        self.raw.version
    }

    /// A session made through this table: [`Session::from_file`] for a chosen version.
    pub fn session_from_file(
        &self,
        path: impl AsRef<Path>,
        options: &Options,
    ) -> Result<Session, Error> {
        let api = *self;
        let path = path_cstring("pipeline path", path.as_ref())?;
        let opts = RawOptions::new(options)?;
        let mut out: *mut sys::KilnSession = ptr::null_mut();
        // SAFETY: borrowed strings and options alive across the call; `out` caller-owned.
        let status =
            unsafe { slot!(api, session_create_from_file)(path.as_ptr(), &opts.raw, &mut out) };
        Session::created(api, status, out, &options.components)
    }

    /// A session made through this table: [`Session::from_str`] for a chosen version.
    pub fn session_from_str(
        &self,
        toml: &str,
        name: &str,
        options: &Options,
    ) -> Result<Session, Error> {
        let api = *self;
        let toml = cstring("pipeline text", toml.as_bytes())?;
        let name = cstring("pipeline name", name.as_bytes())?;
        let opts = RawOptions::new(options)?;
        let mut out: *mut sys::KilnSession = ptr::null_mut();
        // SAFETY: as in session_from_file.
        let status = unsafe {
            slot!(api, session_create_from_string)(
                toml.as_ptr(),
                name.as_ptr(),
                &opts.raw,
                &mut out,
            )
        };
        Session::created(api, status, out, &options.components)
    }

    /// The raw table, for calls this crate does not wrap.
    pub fn raw(&self) -> &'static sys::KilnApi {
        self.raw
    }

    /// "kiln 0.1.0, C API 1, plugin ABI 1.2, LibTorch 2.11.0".
    pub fn version(&self) -> String {
        // SAFETY: static string.
        unsafe { string_from(slot!(self, version_string)()) }
    }

    /// The plugin ABI (major, minor) the library loads.
    pub fn plugin_abi(&self) -> (u32, u32) {
        let (mut major, mut minor) = (0u32, 0u32);
        // SAFETY: caller-owned outs.
        unsafe { slot!(self, plugin_abi)(&mut major, &mut minor) };
        (major, minor)
    }

    /// The components of the plugin libraries in the built-in folder, KILN_PLUGIN_PATH and
    /// `extra_dirs`, and the libraries refused ("<path>: <reason>").
    pub fn plugins<P: AsRef<Path>>(
        &self,
        extra_dirs: &[P],
    ) -> Result<(Vec<PluginInfo>, Vec<String>), Error> {
        let dirs = extra_dirs
            .iter()
            .map(|d| path_cstring("plugin folder", d.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let dir_ptrs: Vec<*const c_char> = dirs.iter().map(|d| d.as_ptr()).collect();
        let mut list: *mut sys::KilnPluginList = ptr::null_mut();
        // SAFETY: borrowed array of valid C strings; `list` is a caller-owned out.
        let status = unsafe {
            slot!(self, plugins_list)(
                if dir_ptrs.is_empty() {
                    ptr::null()
                } else {
                    dir_ptrs.as_ptr()
                },
                dir_ptrs.len(),
                &mut list,
            )
        };
        self.check(status)?;
        // Released on every path below, the error ones included.
        struct Guard(Api, *mut sys::KilnPluginList);
        impl Drop for Guard {
            fn drop(&mut self) {
                // SAFETY: the list came from plugins_list and is released once.
                unsafe { slot!(self.0, plugins_release)(self.1) }
            }
        }
        let guard = Guard(*self, list);

        let mut infos = Vec::new();
        // SAFETY (all calls below): `guard.1` is a live list; strings are copied before release.
        let count = unsafe { slot!(self, plugins_count)(guard.1) };
        for i in 0..count {
            let mut raw = sys::KilnPluginInfo::default();
            self.check(unsafe { slot!(self, plugins_get)(guard.1, i, &mut raw) })?;
            infos.push(unsafe { PluginInfo::from_raw(&raw) });
        }
        let mut refused = Vec::new();
        let refused_count = unsafe { slot!(self, plugins_refused_count)(guard.1) };
        for i in 0..refused_count {
            refused.push(unsafe { string_from(slot!(self, plugins_refused)(guard.1, i)) });
        }
        drop(guard);
        Ok((infos, refused))
    }

    /// Turns a returned status into a Result, releasing the status.
    fn check(&self, status: *mut sys::KilnStatus) -> Result<(), Error> {
        if status.is_null() {
            return Ok(());
        }
        // SAFETY: a status returned by this table; its strings are copied before the release.
        unsafe {
            let code = slot!(self, status_code)(status);
            let message = string_from(slot!(self, status_message)(status));
            let location = match self.raw.status_location {
                Some(status_location) => {
                    let mut raw = sys::KilnStatusLocation::default();
                    if status_location(status, &mut raw) != 0 {
                        Some(Location {
                            file: string_from(raw.file),
                            line: raw.line,
                            column: raw.column,
                            key: string_from(raw.key),
                        })
                    } else {
                        None
                    }
                }
                None => None,
            };
            slot!(self, status_release)(status);
            Err(Error {
                code,
                message,
                location,
            })
        }
    }
}

/// [`Api::version`] of the linked library.
pub fn version() -> Result<String, Error> {
    Ok(Api::load()?.version())
}

/// [`Api::plugin_abi`] of the linked library.
pub fn plugin_abi() -> Result<(u32, u32), Error> {
    Ok(Api::load()?.plugin_abi())
}

/// [`Api::plugins`] of the linked library.
pub fn plugins<P: AsRef<Path>>(extra_dirs: &[P]) -> Result<(Vec<PluginInfo>, Vec<String>), Error> {
    Api::load()?.plugins(extra_dirs)
}

// ---- plain data --------------------------------------------------------------------------------

/// A component's semantic version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// One component of a plugin library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginInfo {
    /// As a pipeline names it ("sgd").
    pub name: String,
    /// "optimizer", "lr_policy", "norm", "precision", "model" or "dataset".
    pub kind: String,
    pub summary: String,
    /// Path of the plugin library.
    pub library: String,
    pub version: Version,
    /// The plugin ABI the library was built with.
    pub abi_major: u32,
    pub abi_minor: u32,
}

impl PluginInfo {
    unsafe fn from_raw(raw: &sys::KilnPluginInfo) -> PluginInfo {
        PluginInfo {
            name: string_from(raw.name),
            kind: string_from(raw.kind),
            summary: string_from(raw.summary),
            library: string_from(raw.library),
            version: Version {
                major: raw.version.major,
                minor: raw.version.minor,
                patch: raw.version.patch,
            },
            abi_major: raw.abi_major,
            abi_minor: raw.abi_minor,
        }
    }
}

/// How much Kiln logs to stderr. It applies to the whole process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogLevel {
    /// Leave the level as it is (info, unless set before).
    #[default]
    Default,
    Debug,
    Info,
    Warn,
    Error,
    Off,
}

impl LogLevel {
    fn raw(self) -> i32 {
        match self {
            LogLevel::Default => sys::KILN_LOG_DEFAULT,
            LogLevel::Debug => sys::KILN_LOG_DEBUG,
            LogLevel::Info => sys::KILN_LOG_INFO,
            LogLevel::Warn => sys::KILN_LOG_WARN,
            LogLevel::Error => sys::KILN_LOG_ERROR,
            LogLevel::Off => sys::KILN_LOG_OFF,
        }
    }
}

/// How a session is made. `Options::default()` gives the library's defaults; the builder
/// methods set one field each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// "dotted.key=value" strings, as `kiln run --set` (the value is TOML; a bare word is a
    /// string).
    pub overrides: Vec<String>,
    /// Extra plugin folders, searched after the built-in one and KILN_PLUGIN_PATH.
    pub plugin_paths: Vec<PathBuf>,
    /// Write metrics as JSON lines to this file (as `kiln run --metrics`).
    pub metrics_path: Option<PathBuf>,
    /// "auto" (the newest usable checkpoint of the newest run folder <output_dir>/version_N
    /// that has one) or a checkpoint folder; None starts afresh, in a new run folder.
    pub resume: Option<String>,
    pub log_level: LogLevel,
    /// Join the data-parallel run the environment describes (torchrun, Slurm, `kiln launch`).
    pub distributed: bool,
    /// What the session may change in the whole process (`process::*` bits): 0, the default,
    /// leaves the process as it is; `process::ALL` does what `kiln run` does.
    pub process_settings: u32,
    /// In-process LR policies (closures), named by the pipeline like plugins' components; the
    /// session keeps them alive until it is dropped.
    pub components: Vec<components::LrPolicy>,
}

/// Bits of `Options::process_settings` (`KILN_PROCESS_*`).
pub mod process {
    use crate::sys;
    /// c10's CPU allocator becomes Kiln's counting one: the CPU's tensor_* metrics (else NaN).
    pub const COUNT_CPU_MEMORY: u32 = sys::KILN_PROCESS_COUNT_CPU_MEMORY;
    /// run.threads, run.tf32 and run.cudnn_benchmark on torch's global context.
    pub const TORCH_SETTINGS: u32 = sys::KILN_PROCESS_TORCH_SETTINGS;
    /// glibc's malloc thresholds tuned for training.
    pub const TUNE_HEAP: u32 = sys::KILN_PROCESS_TUNE_HEAP;
    /// SIGINT/SIGTERM stop the session after a whole step, while it lives (one at a time).
    pub const SIGNALS: u32 = sys::KILN_PROCESS_SIGNALS;
    /// All of the above, as `kiln run`.
    pub const ALL: u32 = sys::KILN_PROCESS_ALL;
}

impl Options {
    pub fn new() -> Options {
        Options::default()
    }
    /// Adds one "dotted.key=value" override.
    pub fn set(mut self, key_value: impl Into<String>) -> Options {
        self.overrides.push(key_value.into());
        self
    }
    pub fn plugin_path(mut self, dir: impl Into<PathBuf>) -> Options {
        self.plugin_paths.push(dir.into());
        self
    }
    pub fn metrics_path(mut self, file: impl Into<PathBuf>) -> Options {
        self.metrics_path = Some(file.into());
        self
    }
    pub fn resume(mut self, checkpoint: impl Into<String>) -> Options {
        self.resume = Some(checkpoint.into());
        self
    }
    pub fn log_level(mut self, level: LogLevel) -> Options {
        self.log_level = level;
        self
    }
    pub fn distributed(mut self, on: bool) -> Options {
        self.distributed = on;
        self
    }
    pub fn process_settings(mut self, bits: u32) -> Options {
        self.process_settings = bits;
        self
    }
    /// Adds an in-process LR policy (see [`components`]).
    pub fn component(mut self, policy: components::LrPolicy) -> Options {
        self.components.push(policy);
        self
    }
}

/// `kiln_session_options` and the C strings its pointers refer to; the pointers stay valid
/// while this lives (they point into heap buffers, which moving the struct does not move).
struct RawOptions {
    raw: sys::KilnSessionOptions,
    _strings: Vec<CString>,
    _overrides: Vec<*const c_char>,
    _plugin_paths: Vec<*const c_char>,
    _components: Vec<*const sys::KilnPluginDescriptor>,
}

impl RawOptions {
    fn new(o: &Options) -> Result<RawOptions, Error> {
        let mut strings = Vec::new();
        let mut overrides = Vec::new();
        for s in &o.overrides {
            let c = cstring("override", s.as_bytes())?;
            overrides.push(c.as_ptr());
            strings.push(c);
        }
        let mut plugin_paths = Vec::new();
        for p in &o.plugin_paths {
            let c = path_cstring("plugin path", p)?;
            plugin_paths.push(c.as_ptr());
            strings.push(c);
        }
        let mut raw = sys::KilnSessionOptions::default();
        if let Some(p) = &o.metrics_path {
            let c = path_cstring("metrics path", p)?;
            raw.metrics_path = c.as_ptr();
            strings.push(c);
        }
        if let Some(r) = &o.resume {
            let c = cstring("resume", r.as_bytes())?;
            raw.resume = c.as_ptr();
            strings.push(c);
        }
        raw.overrides = if overrides.is_empty() {
            ptr::null()
        } else {
            overrides.as_ptr()
        };
        raw.override_count = overrides.len();
        raw.plugin_paths = if plugin_paths.is_empty() {
            ptr::null()
        } else {
            plugin_paths.as_ptr()
        };
        raw.plugin_path_count = plugin_paths.len();
        raw.log_level = o.log_level.raw();
        raw.distributed = i32::from(o.distributed);
        raw.process_settings = o.process_settings;
        let components: Vec<*const sys::KilnPluginDescriptor> =
            o.components.iter().map(|c| c.descriptor()).collect();
        if !components.is_empty() {
            let origin = cstring("origin", b"<rust>")?;
            raw.components = components.as_ptr();
            raw.component_count = components.len();
            raw.component_origin = origin.as_ptr();
            strings.push(origin);
        }
        Ok(RawOptions {
            raw,
            _strings: strings,
            _overrides: overrides,
            _plugin_paths: plugin_paths,
            _components: components,
        })
    }
}

/// Where a session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// More steps to take.
    Ready,
    /// Every step of run.epochs / run.max_steps is done.
    Finished,
    /// A cancel (or a callback asking to stop) stopped it after a whole step.
    Cancelled,
    /// A guard stopped it; see [`Progress::stop_reason`].
    Stopped,
    /// A call failed with RUN_FAILED; the session can only be dropped.
    Failed,
    /// A state this binding does not know (a newer library).
    Unknown(i32),
}

impl State {
    fn from_raw(v: i32) -> State {
        match v {
            sys::KILN_SESSION_READY => State::Ready,
            sys::KILN_SESSION_FINISHED => State::Finished,
            sys::KILN_SESSION_CANCELLED => State::Cancelled,
            sys::KILN_SESSION_STOPPED => State::Stopped,
            sys::KILN_SESSION_FAILED => State::Failed,
            other => State::Unknown(other),
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            State::Ready => f.write_str("ready"),
            State::Finished => f.write_str("finished"),
            State::Cancelled => f.write_str("cancelled"),
            State::Stopped => f.write_str("stopped"),
            State::Failed => f.write_str("failed"),
            State::Unknown(v) => write!(f, "unknown state {}", v),
        }
    }
}

/// Where training stands (`kiln_progress`, strings copied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub state: State,
    /// The latest step was the last of its epoch.
    pub epoch_ended: bool,
    /// Optimizer steps taken (applied and skipped), over resumes.
    pub step: i64,
    /// Steps the whole run takes.
    pub max_steps: i64,
    /// The epoch of the latest step (1-based; 0 before any).
    pub epoch: i64,
    /// run.epochs.
    pub epochs: i64,
    pub batches_in_epoch: i64,
    pub batches_per_epoch: i64,
    pub rank: i32,
    pub world_size: i32,
    /// Why the session stopped ("" unless Stopped or Cancelled).
    pub stop_reason: String,
    /// The newest checkpoint folder the session wrote, or "".
    pub last_checkpoint: String,
}

/// The kind of a metrics record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetricsKind {
    /// One optimizer step.
    Step,
    /// One evaluation on the test split.
    Eval,
    /// A kind this binding does not know (a newer library).
    Unknown(i32),
}

impl MetricsKind {
    fn raw(self) -> i32 {
        match self {
            MetricsKind::Step => sys::KILN_METRICS_STEP,
            MetricsKind::Eval => sys::KILN_METRICS_EVAL,
            MetricsKind::Unknown(v) => v,
        }
    }
    fn from_raw(v: i32) -> MetricsKind {
        match v {
            sys::KILN_METRICS_STEP => MetricsKind::Step,
            sys::KILN_METRICS_EVAL => MetricsKind::Eval,
            other => MetricsKind::Unknown(other),
        }
    }
}

/// One metrics record, as `kiln run --metrics` writes per line. Fields that do not apply to
/// the kind are NaN (floats) or 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metrics {
    pub kind: MetricsKind,
    /// Step: non-finite gradients skipped the update.
    pub skipped: bool,
    /// Optimizer steps taken when the record was made (1-based).
    pub step: i64,
    /// The record's epoch (1-based).
    pub epoch: i64,
    /// Step: mean training loss; eval: mean test loss.
    pub loss: f64,
    /// Eval: test accuracy in [0, 1].
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
    /// Eval: top-5 test accuracy in [0, 1] (top-min(5, classes)).
    pub accuracy_top5: f64,
    /// Eval of multi-label data: mean average precision in [0, 1] (the accuracies are then NaN);
    /// NaN otherwise.
    pub map: f64,
    /// Eval: it measured `[ema]`'s moving average of the weights, not the trained weights.
    pub averaged: bool,
}

impl Metrics {
    fn from_raw(m: &sys::KilnMetrics) -> Metrics {
        Metrics {
            kind: MetricsKind::from_raw(m.kind),
            skipped: m.skipped != 0,
            step: m.step,
            epoch: m.epoch,
            loss: m.loss,
            accuracy: m.accuracy,
            lr: m.lr,
            grad_norm: m.grad_norm,
            loss_scale: m.loss_scale,
            step_seconds: m.step_seconds,
            data_seconds: m.data_seconds,
            samples_per_second: m.samples_per_second,
            tensor_mb: m.tensor_mb,
            tensor_peak_mb: m.tensor_peak_mb,
            activation_mb: m.activation_mb,
            accuracy_top5: m.accuracy_top5,
            map: m.map,
            averaged: m.weights == sys::KILN_WEIGHTS_AVERAGE,
        }
    }
}

// ---- sessions ----------------------------------------------------------------------------------

/// The native session. Shared by a [`Session`] (strongly) and its [`Canceller`]s (weakly):
/// the last strong reference destroys it.
#[derive(Debug)]
struct Inner {
    api: Api,
    raw: *mut sys::KilnSession,
    /// In-process components the native session borrows; dropped after it is destroyed.
    _components: Vec<components::LrPolicy>,
}

// SAFETY: the header lets session calls come from any thread (serialized inside libkiln).
// Through a shared reference only session_cancel is made (by Canceller), which is any-thread;
// everything else goes through Session's exclusive borrow.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: created by session_create_*, destroyed exactly once, here.
        unsafe { slot!(self.api, session_destroy)(self.raw) }
    }
}

/// The metrics callback's closure and what it reported, passed to C as `user_data`.
struct CallbackState {
    f: Box<dyn FnMut(&Metrics) -> bool + Send>,
    /// The first panic since the last training call, reported by that call.
    panic: Option<String>,
}

/// Calls the closure; a panic must not unwind into C, so it is caught, kept for the
/// training call to report, and turned into "stop".
unsafe extern "C" fn metrics_trampoline(
    user_data: *mut c_void,
    metrics: *const sys::KilnMetrics,
) -> i32 {
    if user_data.is_null() || metrics.is_null() {
        return 0;
    }
    // SAFETY: user_data is the CallbackState that Session registered and keeps alive; the
    // callback runs on the thread inside step/run/evaluate, which hold &mut Session, so no
    // other reference to it is in use.
    let state = &mut *(user_data as *mut CallbackState);
    let record = Metrics::from_raw(&*metrics);
    let f = &mut state.f;
    match panic::catch_unwind(AssertUnwindSafe(|| f(&record))) {
        Ok(stop) => i32::from(stop),
        Err(payload) => {
            if state.panic.is_none() {
                state.panic = Some(panic_message(&*payload));
            }
            1
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

/// A training session: one resolved pipeline with its plugins, model, optimizer and data.
/// Dropping it destroys the native session (it writes nothing: call
/// [`save_checkpoint`](Session::save_checkpoint) first to keep the state).
pub struct Session {
    inner: Arc<Inner>,
    /// Box::into_raw of the registered callback state, or null. Kept as a raw pointer because
    /// libkiln holds a copy of it.
    callback: *mut CallbackState,
    /// Shared with this session's [`Tensor`]s: a slice of a tensor holds it (read for
    /// `as_slice`, write for `as_mut_slice`), and the calls that read or write the training's
    /// tensors take it too, so no Rust reference ever sees its memory change.
    access: Arc<RwLock<()>>,
}

// SAFETY: Inner is Send + Sync and the callback state holds only Send data; `callback` is
// touched only through &mut Session or by the trampoline on the thread of a &mut call.
unsafe impl Send for Session {}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("raw", &self.inner.raw)
            .field("has_callback", &!self.callback.is_null())
            .finish()
    }
}

impl Session {
    /// Reads the pipeline file `path`, applies `options.overrides`, loads plugins, validates
    /// everything and builds the run. A bad pipeline gives code CONFIG with file:line:column.
    pub fn from_file(path: impl AsRef<Path>, options: &Options) -> Result<Session, Error> {
        Api::load()?.session_from_file(path, options)
    }

    /// The same from TOML text; `name` stands for the file in messages and in the default
    /// output folder runs/<name>. Relative data paths are taken from the current directory.
    pub fn from_str(toml: &str, name: &str, options: &Options) -> Result<Session, Error> {
        Api::load()?.session_from_str(toml, name, options)
    }

    fn created(
        api: Api,
        status: *mut sys::KilnStatus,
        out: *mut sys::KilnSession,
        components: &[components::LrPolicy],
    ) -> Result<Session, Error> {
        api.check(status)?;
        if out.is_null() {
            return Err(Error::new(
                code::INTERNAL,
                "libkiln reported success but returned no session",
            ));
        }
        Ok(Session {
            inner: Arc::new(Inner {
                api,
                raw: out,
                _components: components.to_vec(),
            }),
            callback: ptr::null_mut(),
            access: Arc::new(RwLock::new(())),
        })
    }

    /// The table this session calls through.
    pub fn api(&self) -> Api {
        self.inner.api
    }

    /// The native session, for calls this crate does not wrap. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::KilnSession {
        self.inner.raw
    }

    /// Trains until the state leaves Ready, as `kiln run` does (evaluating and checkpointing
    /// as the pipeline says). Ok when training ended (finished, cancelled or stopped by a
    /// guard: read [`progress`](Session::progress)); an error when the callback panicked.
    pub fn run(&mut self) -> Result<(), Error> {
        let access = Arc::clone(&self.access);
        let _busy = tensor::exclusive(&access, "run")?;
        // SAFETY: live session.
        let status = unsafe { slot!(self.inner.api, session_run)(self.inner.raw) };
        self.finish(status)
    }

    /// One optimizer step. It does not evaluate: when [`Progress::epoch_ended`], call
    /// [`evaluate`](Session::evaluate). Code FAILED_PRECONDITION when the state is not Ready.
    pub fn step(&mut self) -> Result<(), Error> {
        let access = Arc::clone(&self.access);
        let _busy = tensor::exclusive(&access, "step")?;
        // SAFETY: live session.
        let status = unsafe { slot!(self.inner.api, session_step)(self.inner.raw) };
        self.finish(status)
    }

    /// Evaluates the model on the test split now (the record also goes to the metrics file
    /// and the callback). In a data-parallel run every rank must call it.
    pub fn evaluate(&mut self) -> Result<Metrics, Error> {
        let access = Arc::clone(&self.access);
        let _reading = tensor::shared(&access, "evaluate")?;
        let mut out = sys::KilnMetrics::default();
        // SAFETY: live session; `out` caller-owned.
        let status = unsafe { slot!(self.inner.api, session_evaluate)(self.inner.raw, &mut out) };
        self.finish(status)?;
        Ok(Metrics::from_raw(&out))
    }

    /// Writes a checkpoint of the current state, even when run.checkpoints is off, and returns
    /// its folder ("" on ranks other than 0).
    pub fn save_checkpoint(&mut self) -> Result<String, Error> {
        let access = Arc::clone(&self.access);
        let _reading = tensor::shared(&access, "save_checkpoint")?;
        let mut path: *const c_char = ptr::null();
        // SAFETY: live session; the path is library-owned until the next call, copied at once.
        let status =
            unsafe { slot!(self.inner.api, session_save_checkpoint)(self.inner.raw, &mut path) };
        self.inner.api.check(status)?;
        Ok(unsafe { string_from(path) })
    }

    /// Where training stands.
    pub fn progress(&self) -> Result<Progress, Error> {
        let mut p = sys::KilnProgress::default();
        // SAFETY: live session; strings are library-owned until the next call on the session
        // and copied before this returns (Session is not Sync, so no call runs meanwhile on
        // it except a Canceller's session_cancel).
        unsafe {
            self.inner
                .api
                .check(slot!(self.inner.api, session_progress)(
                    self.inner.raw,
                    &mut p,
                ))?;
            Ok(Progress {
                state: State::from_raw(p.state),
                epoch_ended: p.epoch_ended != 0,
                step: p.step,
                max_steps: p.max_steps,
                epoch: p.epoch,
                epochs: p.epochs,
                batches_in_epoch: p.batches_in_epoch,
                batches_per_epoch: p.batches_per_epoch,
                rank: p.rank,
                world_size: p.world_size,
                stop_reason: string_from(p.stop_reason),
                last_checkpoint: string_from(p.last_checkpoint),
            })
        }
    }

    /// The latest record of `kind`, or None when there is none yet.
    pub fn last_metrics(&self, kind: MetricsKind) -> Result<Option<Metrics>, Error> {
        let mut out = sys::KilnMetrics::default();
        // SAFETY: live session; `out` caller-owned.
        let status = unsafe {
            slot!(self.inner.api, session_last_metrics)(self.inner.raw, kind.raw(), &mut out)
        };
        self.inner.api.check(status)?;
        Ok(if out.kind == 0 {
            None
        } else {
            Some(Metrics::from_raw(&out))
        })
    }

    /// Calls `f` after every step and every evaluation with the new record, on the thread
    /// that called step/run/evaluate. `f` returning true stops the session after this step,
    /// as a cancel does. A panic in `f` also stops it, and the step/run/evaluate call that
    /// was running returns an INTERNAL error carrying the panic's message. Replaces any
    /// earlier callback.
    pub fn set_metrics_callback<F>(&mut self, f: F) -> Result<(), Error>
    where
        F: FnMut(&Metrics) -> bool + Send + 'static,
    {
        let state = Box::into_raw(Box::new(CallbackState {
            f: Box::new(f),
            panic: None,
        }));
        // SAFETY: live session; `state` stays allocated until replaced or the session drops.
        let status = unsafe {
            slot!(self.inner.api, session_set_metrics_callback)(
                self.inner.raw,
                Some(metrics_trampoline),
                state as *mut c_void,
            )
        };
        if let Err(e) = self.inner.api.check(status) {
            // SAFETY: not registered, so ours alone.
            drop(unsafe { Box::from_raw(state) });
            return Err(e);
        }
        self.free_callback();
        self.callback = state;
        Ok(())
    }

    /// Removes the metrics callback.
    pub fn clear_metrics_callback(&mut self) -> Result<(), Error> {
        // SAFETY: live session.
        let status = unsafe {
            slot!(self.inner.api, session_set_metrics_callback)(
                self.inner.raw,
                None,
                ptr::null_mut(),
            )
        };
        self.inner.api.check(status)?;
        self.free_callback();
        Ok(())
    }

    /// A handle that stops this session from any thread (see [`Canceller`]).
    pub fn canceller(&self) -> Canceller {
        Canceller {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Asks the session to stop after the step in progress (or before the next one).
    pub fn cancel(&self) {
        // SAFETY: live session; any thread, never blocks.
        unsafe { slot!(self.inner.api, session_cancel)(self.inner.raw) }
    }

    fn free_callback(&mut self) {
        if !self.callback.is_null() {
            // SAFETY: from Box::into_raw, no longer registered with libkiln.
            drop(unsafe { Box::from_raw(self.callback) });
            self.callback = ptr::null_mut();
        }
    }

    /// The result of a training call: the library's error first, then a callback panic.
    fn finish(&mut self, status: *mut sys::KilnStatus) -> Result<(), Error> {
        let result = self.inner.api.check(status);
        let panic = if self.callback.is_null() {
            None
        } else {
            // SAFETY: registered state; no call is running, so nobody else uses it.
            unsafe { (*self.callback).panic.take() }
        };
        match (result, panic) {
            (r, None) => r,
            (Ok(()), Some(p)) => Err(Error::new(
                code::INTERNAL,
                format!(
                    "the metrics callback panicked ({}); the session was stopped",
                    p
                ),
            )),
            (Err(mut e), Some(p)) => {
                e.message
                    .push_str(&format!(" (the metrics callback also panicked: {})", p));
                Err(e)
            }
        }
    }
}

impl Session {
    /// Takes steps while the session is Ready (at most `limit` of them when given), yielding
    /// each step's record. It does not evaluate; leaving the loop leaves the session where it
    /// is. An error is yielded once and ends the iteration.
    ///
    /// ```no_run
    /// # fn f(session: &mut kiln::Session) {
    /// for m in session.steps(Some(100)) {
    ///     let m = m.expect("a step");
    ///     println!("step {} loss {:.4}", m.step, m.loss);
    /// }
    /// # }
    /// ```
    pub fn steps(&mut self, limit: Option<u64>) -> Steps<'_> {
        Steps {
            session: self,
            left: limit,
            done: false,
        }
    }
}

/// The iterator of [`Session::steps`].
#[derive(Debug)]
pub struct Steps<'a> {
    session: &'a mut Session,
    left: Option<u64>,
    done: bool,
}

impl Iterator for Steps<'_> {
    type Item = Result<Metrics, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.left == Some(0) {
            return None;
        }
        let result = (|| {
            if self.session.progress()?.state != State::Ready {
                return Ok(None);
            }
            self.session.step()?;
            self.session.last_metrics(MetricsKind::Step)
        })();
        if let Some(left) = self.left.as_mut() {
            *left -= 1;
        }
        match result {
            Ok(Some(m)) => Some(Ok(m)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.callback.is_null() {
            // A Canceller may hold the native session a moment longer (and destroy it on its
            // thread), so unregister the closure before freeing it. If that fails, leak it:
            // a leak is better than a pointer to freed memory.
            // SAFETY: live session.
            let status = unsafe {
                slot!(self.inner.api, session_set_metrics_callback)(
                    self.inner.raw,
                    None,
                    ptr::null_mut(),
                )
            };
            if self.inner.api.check(status).is_ok() {
                self.free_callback();
            }
        }
        // `inner` drops next: the native session is destroyed unless a Canceller is in the
        // middle of cancel(), in which case that call destroys it when it returns.
    }
}

/// Stops a [`Session`] from another thread, e.g. a signal-handling or watchdog thread, while
/// the session trains. It is `Send + Sync + Clone`.
///
/// Lifetime rule: a Canceller never keeps the session alive. It holds a weak reference; once
/// the `Session` is dropped, [`cancel`](Canceller::cancel) does nothing and returns false, so
/// it can never reach a destroyed session.
#[derive(Clone, Debug)]
pub struct Canceller {
    inner: Weak<Inner>,
}

impl Canceller {
    /// Asks the session to stop after the step in progress; it moves to [`State::Cancelled`]
    /// (writing that step's checkpoint when run.checkpoints is on). Never blocks, except in
    /// the rare case that the Session is dropped during this call, when the session is
    /// destroyed here. Returns false when the session no longer exists.
    pub fn cancel(&self) -> bool {
        match self.inner.upgrade() {
            Some(inner) => {
                // SAFETY: the strong reference keeps the session alive; any thread.
                unsafe { slot!(inner.api, session_cancel)(inner.raw) };
                true
            }
            None => false,
        }
    }
}

// ---- strings -----------------------------------------------------------------------------------

/// Copies a C string; NULL reads as "".
unsafe fn string_from(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

fn cstring(what: &str, bytes: &[u8]) -> Result<CString, Error> {
    CString::new(bytes).map_err(|e| {
        Error::new(
            code::INVALID_ARGUMENT,
            format!(
                "{} contains a NUL byte at offset {}",
                what,
                e.nul_position()
            ),
        )
    })
}

#[cfg(unix)]
fn path_cstring(what: &str, path: &Path) -> Result<CString, Error> {
    use std::os::unix::ffi::OsStrExt;
    cstring(what, path.as_os_str().as_bytes())
}

#[cfg(not(unix))]
fn path_cstring(what: &str, path: &Path) -> Result<CString, Error> {
    match path.to_str() {
        Some(s) => cstring(what, s.as_bytes()),
        None => Err(Error::new(
            code::INVALID_ARGUMENT,
            format!("{} {:?} is not valid UTF-8", what, path),
        )),
    }
}
