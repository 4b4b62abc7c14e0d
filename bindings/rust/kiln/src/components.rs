//! In-process components: a Rust closure as a session's learning-rate policy, with no plugin
//! library to build.
//!
//! ```no_run
//! use kiln::components::{LrPolicy, OptionSpec};
//! use kiln::{Options, Session};
//!
//! # fn main() -> Result<(), kiln::Error> {
//! let halve = LrPolicy::with_options(
//!     "halve_every",
//!     vec![OptionSpec::int("every", 100).min(1.0)],
//!     Box::new(|iter, s| {
//!         let every = s.int("every").unwrap_or(100);
//!         s.base_lr * 0.5f64.powi(((iter - 1) / every) as i32)
//!     }),
//! )?;
//! let options = Options::new().component(halve); // [lr_policy] name = "halve_every"
//! let mut session = Session::from_file("pipeline.toml", &options)?;
//! session.run()?;
//! # Ok(())
//! # }
//! ```
//!
//! An [`LrPolicy`] is the C function table a plugin library exports (kiln/plugin.h and
//! kiln/lr_policy.h), handed to the session in `kiln_session_options.components`: libkiln
//! validates it as a library's, the pipeline names it like any plugin's component, and its
//! options are checked against the [`OptionSpec`]s given here (a misspelt key is CONFIG).
//!
//! The closure runs on the thread that trains (inside [`Session::step`](crate::Session::step)
//! and friends), for the 1-based optimizer step about to run, after any warm-up the host applies
//! itself; it must be pure. A panic in it is caught (it never unwinds into C) and fails the
//! training call with RUN_FAILED and the panic's message; [`LrPolicy::last_panic`] keeps it.
//!
//! Optimizers: their vtable works on tensors (DLPack), so this crate offers no closure form;
//! code that writes the C function table itself (an optimizer component in a
//! `sys::KilnPluginDescriptor`) passes it in `sys::KilnSessionOptions::components` directly.
//!
//! A policy may also react to evaluations (ABI 1.15), as torch's ReduceLROnPlateau does:
//! [`LrPolicy::reacting`] takes an `observe` closure, called after each evaluation with an
//! [`Observation`] (the metrics by name), which keeps what it learns in the instance's
//! [`Schedule::state`]; the entries it names are checkpointed and restored on a resume.
//!
//! At most [`MAX_LR_POLICIES`] policies live at once: C's `create` carries no user data, so each
//! policy takes one of a fixed set of entry points while it lives.

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_void};
use std::panic::{self, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex, Weak};

use crate::{code, cstring, panic_message, sys, Api, Error};

/// A validated option value, as the pipeline gave it (or the schema's default).
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    IntList(Vec<i64>),
    FloatList(Vec<f64>),
    StrList(Vec<String>),
}

/// The schedule's frame an instance is made for (`kiln_lr_schedule`), in optimizer steps,
/// and the component's options.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Base learning rate after linear batch scaling.
    pub base_lr: f64,
    /// Optimizer steps of the whole run.
    pub max_iters: i64,
    /// Steps of the host's warm-up (0: none); the closure is asked for later steps only.
    pub warmup_iters: i64,
    pub iters_per_epoch: i64,
    /// Every option of the schema, in schema order, defaults filled.
    pub options: Vec<(String, OptionValue)>,
    /// The instance's own numbers, for a policy that reacts to evaluations (ABI 1.15): its
    /// observe closure writes them, lr_at reads them, and the entries named by
    /// [`LrPolicy::reacting`]'s `state` go into checkpoints and come back on a resume.
    pub state: Vec<(String, f64)>,
}

impl Schedule {
    /// The state entry `name`, if set.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.state.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    /// Sets the state entry `name`.
    pub fn set(&mut self, name: &str, value: f64) {
        match self.state.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value,
            None => self.state.push((name.to_string(), value)),
        }
    }
    pub fn option(&self, name: &str) -> Option<&OptionValue> {
        self.options.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
    pub fn float(&self, name: &str) -> Option<f64> {
        match self.option(name)? {
            OptionValue::Float(v) => Some(*v),
            _ => None,
        }
    }
    pub fn int(&self, name: &str) -> Option<i64> {
        match self.option(name)? {
            OptionValue::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn bool(&self, name: &str) -> Option<bool> {
        match self.option(name)? {
            OptionValue::Bool(v) => Some(*v),
            _ => None,
        }
    }
    pub fn str(&self, name: &str) -> Option<&str> {
        match self.option(name)? {
            OptionValue::Str(v) => Some(v),
            _ => None,
        }
    }
}

/// One option of a component's schema (`kiln_option_spec`): name, type and default, inclusive
/// bounds for numbers, allowed strings, one line of documentation.
#[derive(Clone, Debug, PartialEq)]
pub struct OptionSpec {
    name: String,
    type_: i32,
    default: Option<String>, // a TOML literal; None: required
    min: Option<f64>,
    max: Option<f64>,
    choices: Option<String>,
    doc: String,
}

impl OptionSpec {
    fn of(name: &str, type_: i32, default: Option<String>) -> OptionSpec {
        OptionSpec {
            name: name.to_string(),
            type_,
            default,
            min: None,
            max: None,
            choices: None,
            doc: String::new(),
        }
    }
    pub fn float(name: &str, default: f64) -> OptionSpec {
        let literal = if default.is_nan() {
            "nan".to_string()
        } else if default.is_infinite() {
            (if default > 0.0 { "inf" } else { "-inf" }).to_string()
        } else {
            format!("{:?}", default) // "0.5", "1e-5": TOML floats
        };
        OptionSpec::of(name, sys::KILN_OPT_FLOAT, Some(literal))
    }
    pub fn int(name: &str, default: i64) -> OptionSpec {
        OptionSpec::of(name, sys::KILN_OPT_INT, Some(default.to_string()))
    }
    pub fn bool(name: &str, default: bool) -> OptionSpec {
        OptionSpec::of(name, sys::KILN_OPT_BOOL, Some(default.to_string()))
    }
    pub fn string(name: &str, default: &str) -> OptionSpec {
        let quoted = format!("\"{}\"", default.replace('\\', "\\\\").replace('"', "\\\""));
        OptionSpec::of(name, sys::KILN_OPT_STRING, Some(quoted))
    }
    /// An option the pipeline must set, of `type_` (`sys::KILN_OPT_*`).
    pub fn required(name: &str, type_: i32) -> OptionSpec {
        OptionSpec::of(name, type_, None)
    }
    pub fn min(mut self, min: f64) -> OptionSpec {
        self.min = Some(min);
        self
    }
    pub fn max(mut self, max: f64) -> OptionSpec {
        self.max = Some(max);
        self
    }
    pub fn range(self, min: f64, max: f64) -> OptionSpec {
        self.min(min).max(max)
    }
    pub fn choices(mut self, allowed: &[&str]) -> OptionSpec {
        self.choices = Some(allowed.join(","));
        self
    }
    pub fn doc(mut self, doc: &str) -> OptionSpec {
        self.doc = doc.to_string();
        self
    }
}

/// The closure of an [`LrPolicy`]: (1-based optimizer step, schedule) -> learning rate.
pub type LrFn = Box<dyn Fn(i64, &Schedule) -> f64 + Send + Sync>;

/// One evaluation's results (`kiln_lr_observation`, ABI 1.15): the steps counted so far, the
/// epoch the evaluation closed, and its metrics by name ("loss", and "top1" and "top5" or
/// "map"; all-reduced under DDP).
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub iter: i64,
    pub epoch: i64,
    pub metrics: Vec<(String, f64)>,
}

impl Observation {
    /// The metric `name`, if the evaluation has it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

/// A policy's reaction to an evaluation: updates the instance's [`Schedule::state`].
pub type ObserveFn = Box<dyn Fn(&Observation, &mut Schedule) + Send + Sync>;

/// How many [`LrPolicy`] values may live at once.
pub const MAX_LR_POLICIES: usize = 32;

/// An LR policy whose `lr_at` is a Rust closure; pass it to [`crate::Options::component`].
/// Cloning shares it; a session keeps its policies alive until it is dropped, and one policy
/// may serve several sessions (each makes its own instance).
#[derive(Clone)]
pub struct LrPolicy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    slot: usize,
    name: String,
    f: LrFn,
    observe: Option<ObserveFn>,
    state_keys: Vec<String>,
    last_panic: Mutex<Option<String>>,
    // The C tables the host reads for the life of every session given this policy; boxed (or
    // in heap buffers) so their addresses never move.
    _strings: Vec<CString>,
    _specs: Vec<sys::KilnOptionSpec>,
    _caps: Box<sys::KilnCapabilities>,
    _vtable: Box<sys::KilnLrPolicyVtable>,
    _component: Box<sys::KilnComponentDescriptor>,
    _components: Box<[*const sys::KilnComponentDescriptor; 1]>,
    descriptor: Box<sys::KilnPluginDescriptor>,
}

// SAFETY: the raw pointers point into the policy's own immutable heap data; the closure is
// Send + Sync and the panic record is behind a mutex.
unsafe impl Send for PolicyInner {}
unsafe impl Sync for PolicyInner {}

impl Drop for PolicyInner {
    fn drop(&mut self) {
        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get_mut(self.slot) {
            *s = None;
        }
    }
}

impl LrPolicy {
    /// A policy named `name` in the pipeline's `[lr_policy]` table, without options.
    pub fn new(name: &str, lr_at: LrFn) -> Result<LrPolicy, Error> {
        LrPolicy::with_options(name, Vec::new(), lr_at)
    }

    /// A policy with an options schema; their values reach the closure in
    /// [`Schedule::options`].
    pub fn with_options(
        name: &str,
        options: Vec<OptionSpec>,
        lr_at: LrFn,
    ) -> Result<LrPolicy, Error> {
        LrPolicy::build(name, options, lr_at, None, Vec::new())
    }

    /// A policy that reacts to evaluations (ABI 1.15; torch's ReduceLROnPlateau and the like):
    /// `observe` runs after each evaluation and keeps what it learns in the instance's
    /// [`Schedule::state`], which `lr_at` reads; the entries named in `state` are written into
    /// checkpoints and restored on a resume (an entry not set counts as unset again).
    pub fn reacting(
        name: &str,
        options: Vec<OptionSpec>,
        lr_at: LrFn,
        observe: ObserveFn,
        state: &[&str],
    ) -> Result<LrPolicy, Error> {
        let keys = state.iter().map(|k| k.to_string()).collect();
        LrPolicy::build(name, options, lr_at, Some(observe), keys)
    }

    fn build(
        name: &str,
        options: Vec<OptionSpec>,
        lr_at: LrFn,
        observe: Option<ObserveFn>,
        state_keys: Vec<String>,
    ) -> Result<LrPolicy, Error> {
        let (abi_major, abi_minor) = Api::load()?.plugin_abi();
        if observe.is_some() && (abi_major, abi_minor) < (1, 15) {
            return Err(Error::new(
                code::FAILED_PRECONDITION,
                format!(
                    "LrPolicy '{}': reacting to evaluations needs a Kiln library of ABI 1.15 or \
                     later; this one is {}.{}",
                    name, abi_major, abi_minor
                ),
            ));
        }
        let mut strings = Vec::new();
        let mut keep = |what: &str, s: &str| -> Result<*const c_char, Error> {
            let c = cstring(what, s.as_bytes())?;
            let p = c.as_ptr(); // the CString's heap buffer: moving it does not move this
            strings.push(c);
            Ok(p)
        };
        let c_name = keep("policy name", name)?;
        let summary = keep("summary", &format!("Rust closure LR policy {}", name))?;
        let plugin_name = keep("policy name", &format!("rust:{}", name))?;
        let mut specs = Vec::new();
        for o in &options {
            let mut s = sys::KilnOptionSpec::default();
            s.name = keep("option name", &o.name)?;
            s.type_ = o.type_;
            if let Some(min) = o.min {
                s.has_min = 1;
                s.min = min;
            }
            if let Some(max) = o.max {
                s.has_max = 1;
                s.max = max;
            }
            if let Some(d) = &o.default {
                s.default_value = keep("option default", d)?;
            }
            if let Some(c) = &o.choices {
                s.choices = keep("option choices", c)?;
            }
            s.doc = keep("option doc", &o.doc)?;
            specs.push(s);
        }

        let mut slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            slots.resize(MAX_LR_POLICIES, None);
        }
        let slot = match slots
            .iter()
            .position(|s| s.as_ref().map_or(true, |w| w.strong_count() == 0))
        {
            Some(i) => i,
            None => {
                return Err(Error::new(
                    code::FAILED_PRECONDITION,
                    format!(
                        "LrPolicy '{}': {} Rust LR policies live already (the most at once)",
                        name, MAX_LR_POLICIES
                    ),
                ))
            }
        };

        let mut caps = Box::new(sys::KilnCapabilities::default());
        caps.flags = sys::KILN_CAP_DEVICE_CPU | sys::KILN_CAP_DEVICE_CUDA;
        let mut vtable = Box::new(sys::KilnLrPolicyVtable::default());
        vtable.create = Some(CREATES[slot]);
        vtable.destroy = Some(destroy);
        vtable.lr_at = Some(lr_at_trampoline);
        if observe.is_some() {
            vtable.observe = Some(observe_trampoline);
            vtable.get_state = Some(get_state_trampoline);
            vtable.set_state = Some(set_state_trampoline);
        }
        let mut component = Box::new(sys::KilnComponentDescriptor::default());
        component.kind = sys::KILN_COMPONENT_LR_POLICY;
        component.name = c_name;
        component.version = sys::KilnVersion {
            major: 1,
            minor: 0,
            patch: 0,
        };
        component.summary = summary;
        component.capabilities = &*caps;
        component.option_count = specs.len();
        component.options = if specs.is_empty() {
            ptr::null()
        } else {
            specs.as_ptr()
        };
        component.vtable = &*vtable as *const sys::KilnLrPolicyVtable as *const c_void;
        let components = Box::new([&*component as *const sys::KilnComponentDescriptor]);
        let mut descriptor = Box::new(sys::KilnPluginDescriptor::default());
        descriptor.abi_major = abi_major;
        descriptor.abi_minor = abi_minor;
        descriptor.name = plugin_name;
        descriptor.version = component.version;
        descriptor.component_count = 1;
        descriptor.components = components.as_ptr();
        descriptor.torch_cxx11_abi = -1; // no LibTorch: a function of numbers

        let inner = Arc::new(PolicyInner {
            slot,
            name: name.to_string(),
            f: lr_at,
            observe,
            state_keys,
            last_panic: Mutex::new(None),
            _strings: strings,
            _specs: specs,
            _caps: caps,
            _vtable: vtable,
            _component: component,
            _components: components,
            descriptor,
        });
        slots[slot] = Some(Arc::downgrade(&inner));
        Ok(LrPolicy { inner })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The message of the latest panic of the closure, if any.
    pub fn last_panic(&self) -> Option<String> {
        self.inner
            .last_panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The plugin descriptor handed to libkiln; valid while this policy (or a clone) lives.
    pub fn descriptor(&self) -> *const sys::KilnPluginDescriptor {
        &*self.inner.descriptor
    }
}

impl fmt::Debug for LrPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LrPolicy")
            .field("name", &self.inner.name)
            .finish()
    }
}

/// The same policy (clones compare equal).
impl PartialEq for LrPolicy {
    fn eq(&self, other: &LrPolicy) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for LrPolicy {}

// ---- the C side ----

/// The live policies by entry point: CREATES[i] makes instances of SLOTS[i].
static SLOTS: Mutex<Vec<Option<Weak<PolicyInner>>>> = Mutex::new(Vec::new());

type CreateFn = unsafe extern "C" fn(
    *const sys::KilnHostApiHead,
    *const sys::KilnOptions,
    *const sys::KilnLrSchedule,
    *mut *mut c_void,
) -> *mut sys::KilnStatus;

unsafe extern "C" fn create_slot<const N: usize>(
    host: *const sys::KilnHostApiHead,
    options: *const sys::KilnOptions,
    schedule: *const sys::KilnLrSchedule,
    out: *mut *mut c_void,
) -> *mut sys::KilnStatus {
    create(N, host, options, schedule, out)
}

macro_rules! creates {
    ($($n:literal)*) => { [$(create_slot::<$n> as CreateFn),*] };
}
static CREATES: [CreateFn; MAX_LR_POLICIES] = creates!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
);

/// One instance: what create made, owned by the host until destroy.
struct Instance {
    policy: Arc<PolicyInner>,
    schedule: Schedule,
    host: *const sys::KilnHostApiHead,
}

/// A status made by the host (a NULL one only when the host gave no make_status, which it
/// always does).
unsafe fn status(
    host: *const sys::KilnHostApiHead,
    code: i32,
    message: &str,
) -> *mut sys::KilnStatus {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    match host.as_ref().and_then(|h| h.make_status) {
        Some(make) => make(code, text.as_ptr()),
        None => ptr::null_mut(),
    }
}

unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// The validated options of a create call, copied (the host's array lives for the call only).
unsafe fn option_values(options: *const sys::KilnOptions) -> Vec<(String, OptionValue)> {
    let mut out = Vec::new();
    let o = match options.as_ref() {
        Some(o) if !o.values.is_null() => o,
        _ => return out,
    };
    for i in 0..o.count {
        let v = &*o.values.add(i);
        let n = v.list_length;
        let value = match v.type_ {
            sys::KILN_OPT_BOOL => OptionValue::Bool(v.bool_value != 0),
            sys::KILN_OPT_INT => OptionValue::Int(v.int_value),
            sys::KILN_OPT_FLOAT => OptionValue::Float(v.float_value),
            sys::KILN_OPT_STRING => OptionValue::Str(text(v.string_value)),
            sys::KILN_OPT_INT_LIST if n == 0 || !v.int_list.is_null() => {
                OptionValue::IntList((0..n).map(|j| *v.int_list.add(j)).collect())
            }
            sys::KILN_OPT_FLOAT_LIST if n == 0 || !v.float_list.is_null() => {
                OptionValue::FloatList((0..n).map(|j| *v.float_list.add(j)).collect())
            }
            sys::KILN_OPT_STRING_LIST if n == 0 || !v.string_list.is_null() => {
                OptionValue::StrList((0..n).map(|j| text(*v.string_list.add(j))).collect())
            }
            _ => continue,
        };
        out.push((text(v.name), value));
    }
    out
}

unsafe fn create(
    slot: usize,
    host: *const sys::KilnHostApiHead,
    options: *const sys::KilnOptions,
    schedule: *const sys::KilnLrSchedule,
    out: *mut *mut c_void,
) -> *mut sys::KilnStatus {
    let policy = {
        let slots = SLOTS.lock().unwrap_or_else(|e| e.into_inner());
        slots
            .get(slot)
            .and_then(|s| s.as_ref())
            .and_then(|w| w.upgrade())
    };
    let policy = match policy {
        Some(p) => p,
        None => {
            return status(
                host,
                code::INTERNAL,
                "Rust LR policy: create called after its LrPolicy was dropped",
            )
        }
    };
    if out.is_null() || schedule.is_null() {
        return status(
            host,
            code::INVALID_ARGUMENT,
            "Rust LR policy: NULL out or schedule",
        );
    }
    let made = panic::catch_unwind(AssertUnwindSafe(|| {
        let s = &*schedule;
        Box::new(Instance {
            schedule: Schedule {
                base_lr: s.base_lr,
                max_iters: s.max_iters,
                warmup_iters: s.warmup_iters,
                iters_per_epoch: s.iters_per_epoch,
                options: option_values(options),
                state: Vec::new(),
            },
            policy: policy.clone(),
            host,
        })
    }));
    match made {
        Ok(instance) => {
            *out = Box::into_raw(instance) as *mut c_void;
            ptr::null_mut()
        }
        Err(payload) => status(
            host,
            code::INTERNAL,
            &format!(
                "{}: create panicked: {}",
                policy.name,
                panic_message(&*payload)
            ),
        ),
    }
}

unsafe extern "C" fn destroy(instance: *mut c_void) {
    if !instance.is_null() {
        // A panic in a drop must not unwind into C either.
        let _ = panic::catch_unwind(AssertUnwindSafe(|| {
            drop(Box::from_raw(instance as *mut Instance))
        }));
    }
}

unsafe extern "C" fn lr_at_trampoline(
    instance: *mut c_void,
    iter: i64,
    lr: *mut f64,
) -> *mut sys::KilnStatus {
    let instance = match (instance as *const Instance).as_ref() {
        Some(i) => i,
        None => return ptr::null_mut(),
    };
    let policy = &instance.policy;
    match panic::catch_unwind(AssertUnwindSafe(|| (policy.f)(iter, &instance.schedule))) {
        Ok(value) => {
            if !lr.is_null() {
                *lr = value;
            }
            ptr::null_mut()
        }
        Err(payload) => {
            let message = panic_message(&*payload);
            *policy.last_panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.clone());
            status(
                instance.host,
                code::INTERNAL,
                &format!("{}: lr_at({}) panicked: {}", policy.name, iter, message),
            )
        }
    }
}

/// Records a panic's message and turns it into a status naming `what`.
unsafe fn panicked(
    instance: &Instance,
    what: &str,
    payload: &(dyn std::any::Any + Send),
) -> *mut sys::KilnStatus {
    let message = panic_message(payload);
    let policy = &instance.policy;
    *policy.last_panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.clone());
    status(
        instance.host,
        code::INTERNAL,
        &format!("{}: {} panicked: {}", policy.name, what, message),
    )
}

unsafe extern "C" fn observe_trampoline(
    instance: *mut c_void,
    observation: *const sys::KilnLrObservation,
) -> *mut sys::KilnStatus {
    // The host never calls an instance from two threads at once: this is the only reference.
    let instance = match (instance as *mut Instance).as_mut() {
        Some(i) => i,
        None => return ptr::null_mut(),
    };
    let o = match observation.as_ref() {
        Some(o) => o,
        None => {
            return status(
                instance.host,
                code::INVALID_ARGUMENT,
                "observe: NULL observation",
            )
        }
    };
    let mut metrics = Vec::with_capacity(o.count);
    for i in 0..o.count {
        metrics.push((text(*o.names.add(i)), *o.values.add(i)));
    }
    let seen = Observation {
        iter: o.iter,
        epoch: o.epoch,
        metrics,
    };
    let policy = instance.policy.clone();
    let schedule = &mut instance.schedule;
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        if let Some(f) = &policy.observe {
            f(&seen, schedule)
        }
    }));
    match result {
        Ok(()) => ptr::null_mut(),
        Err(payload) => panicked(instance, "observe", &*payload),
    }
}

unsafe extern "C" fn get_state_trampoline(
    instance: *mut c_void,
    values: *mut f64,
    capacity: usize,
    count: *mut usize,
) -> *mut sys::KilnStatus {
    let instance = match (instance as *const Instance).as_ref() {
        Some(i) => i,
        None => return ptr::null_mut(),
    };
    let keys = &instance.policy.state_keys;
    for (i, key) in keys.iter().enumerate().take(capacity) {
        if !values.is_null() {
            *values.add(i) = instance.schedule.get(key).unwrap_or(f64::NAN);
        }
    }
    if !count.is_null() {
        *count = keys.len();
    }
    ptr::null_mut()
}

unsafe extern "C" fn set_state_trampoline(
    instance: *mut c_void,
    values: *const f64,
    count: usize,
) -> *mut sys::KilnStatus {
    let instance = match (instance as *mut Instance).as_mut() {
        Some(i) => i,
        None => return ptr::null_mut(),
    };
    let keys = instance.policy.state_keys.clone();
    if count != keys.len() || (count > 0 && values.is_null()) {
        return status(
            instance.host,
            code::INVALID_ARGUMENT,
            &format!(
                "{}: the checkpoint holds {} state values, this policy keeps {} ({})",
                instance.policy.name,
                count,
                keys.len(),
                keys.join(", ")
            ),
        );
    }
    instance.schedule.state.clear();
    for (i, key) in keys.iter().enumerate() {
        let v = *values.add(i);
        if !v.is_nan() {
            // NaN: the entry was not set when the checkpoint was written.
            instance.schedule.set(key, v);
        }
    }
    ptr::null_mut()
}
