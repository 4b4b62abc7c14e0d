//! A session's tensors through DLPack (C API version 2): the model's parameters and buffers
//! and the optimizer's state as live views, with no copies, and loading weights into a model.
//!
//! ```no_run
//! # fn f(a: &kiln::Session, b: &mut kiln::Session) -> Result<(), kiln::Error> {
//! for t in a.state_dict()? {
//!     println!("{} {:?} {:?}", t.name(), t.shape(), t.dtype());
//! }
//! let mut head = a.parameters()?.into_iter().find(|t| t.name() == "head.bias").unwrap();
//! head.as_mut_slice::<f32>()?.fill(0.0); // changes a's training: the slice IS the parameter
//! b.load_tensors_from(&a.state_dict()?, kiln::load::STRICT)?; // b's weights = a's
//! let w = vec![0.5f32; 10];
//! b.load_tensors(&[("head.bias", kiln::TensorView::new(&w, &[10])?)], kiln::load::ALLOW_MISSING)?;
//! # Ok(()) }
//! ```
//!
//! A [`Tensor`] owns one `DLManagedTensor` that aliases the training's own tensor: it sees every
//! later step and keeps the storage alive after the session is dropped. Its data is reached
//! through [`Slice`] / [`SliceMut`] guards that lock the session's tensors, so a slice never
//! changes under a Rust reference: while one is alive, the session's step/run/load_tensors
//! (and, for a `SliceMut`, evaluate and save_checkpoint) return FAILED_PRECONDITION instead of
//! touching the memory, and so does taking a slice while another thread's call is in progress
//! or inside the metrics callback.

use std::ffi::CString;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::raw::{c_char, c_void};
use std::ptr::{self, NonNull};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use crate::{code, cstring, string_from, sys, Api, Error, Session};

// ---- the session's lock over its tensors' memory ----------------------------------------------

fn busy(what: &str) -> Error {
    Error::new(
        code::FAILED_PRECONDITION,
        format!(
            "{}: the session's tensors are in use (a Slice/SliceMut of one is alive, or another \
             call is reading or writing them); drop the slice first",
            what
        ),
    )
}

/// For the calls that write the training's tensors (step, run, load_tensors). Never blocks:
/// waiting for a slice held on the calling thread would never end.
pub(crate) fn exclusive<'a>(
    access: &'a RwLock<()>,
    what: &str,
) -> Result<RwLockWriteGuard<'a, ()>, Error> {
    match access.try_write() {
        Ok(g) => Ok(g),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(busy(what)),
    }
}

/// For the calls that only read them (evaluate, save_checkpoint, a slice).
pub(crate) fn shared<'a>(
    access: &'a RwLock<()>,
    what: &str,
) -> Result<RwLockReadGuard<'a, ()>, Error> {
    match access.try_read() {
        Ok(g) => Ok(g),
        Err(TryLockError::Poisoned(p)) => Ok(p.into_inner()),
        Err(TryLockError::WouldBlock) => Err(busy(what)),
    }
}

// ---- element types -----------------------------------------------------------------------------

/// A tensor's element type (DLPack's code, bits and lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    BF16,
    I64,
    I32,
    I16,
    I8,
    U8,
    Bool,
    /// Any other DLPack type: (code, bits, lanes).
    Other(u8, u8, u16),
}

impl DType {
    pub fn from_raw(t: sys::DLDataType) -> DType {
        match (t.code, t.bits, t.lanes) {
            (sys::DL_FLOAT, 32, 1) => DType::F32,
            (sys::DL_FLOAT, 64, 1) => DType::F64,
            (sys::DL_FLOAT, 16, 1) => DType::F16,
            (sys::DL_BFLOAT, 16, 1) => DType::BF16,
            (sys::DL_INT, 64, 1) => DType::I64,
            (sys::DL_INT, 32, 1) => DType::I32,
            (sys::DL_INT, 16, 1) => DType::I16,
            (sys::DL_INT, 8, 1) => DType::I8,
            (sys::DL_UINT, 8, 1) => DType::U8,
            (sys::DL_BOOL, 8, 1) => DType::Bool,
            (code, bits, lanes) => DType::Other(code, bits, lanes),
        }
    }

    pub fn to_raw(self) -> sys::DLDataType {
        let (code, bits, lanes) = match self {
            DType::F32 => (sys::DL_FLOAT, 32, 1),
            DType::F64 => (sys::DL_FLOAT, 64, 1),
            DType::F16 => (sys::DL_FLOAT, 16, 1),
            DType::BF16 => (sys::DL_BFLOAT, 16, 1),
            DType::I64 => (sys::DL_INT, 64, 1),
            DType::I32 => (sys::DL_INT, 32, 1),
            DType::I16 => (sys::DL_INT, 16, 1),
            DType::I8 => (sys::DL_INT, 8, 1),
            DType::U8 => (sys::DL_UINT, 8, 1),
            DType::Bool => (sys::DL_BOOL, 8, 1),
            DType::Other(code, bits, lanes) => (code, bits, lanes),
        };
        sys::DLDataType { code, bits, lanes }
    }

    /// Bytes per element (rounded up).
    pub fn size(self) -> usize {
        let t = self.to_raw();
        (t.bits as usize * t.lanes as usize + 7) / 8
    }

    /// F32, F64, F16 or BF16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
}

mod private {
    pub trait Sealed {}
}

/// A Rust element type with a DLPack dtype: `f32`, `f64`, `i64`, `i32`, `i16`, `i8`, `u8`.
/// Sealed: every bit pattern of these is a valid value, which [`Tensor::as_slice`] relies on.
/// (`bool` is left out for that reason: read a Bool tensor with `to_vec::<u8>` after checking
/// [`Tensor::dtype`], or through [`Tensor::data_ptr`].)
pub trait Element: private::Sealed + Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl private::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, f64 => F64, i64 => I64, i32 => I32, i16 => I16, i8 => I8, u8 => U8);

/// Where a tensor's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// A CUDA device by index.
    Cuda(i32),
    /// Pinned host memory (kDLCUDAHost): readable from the CPU.
    CudaHost,
    /// Another DLPack device: (device_type, device_id).
    Other(i32, i32),
}

impl Device {
    fn from_raw(d: sys::DLDevice) -> Device {
        match d.device_type {
            sys::DL_CPU => Device::Cpu,
            sys::DL_CUDA => Device::Cuda(d.device_id),
            sys::DL_CUDA_HOST => Device::CudaHost,
            other => Device::Other(other, d.device_id),
        }
    }

    /// Whether the CPU can read the memory (Cpu, CudaHost).
    pub fn is_host(self) -> bool {
        matches!(self, Device::Cpu | Device::CudaHost)
    }
}

// ---- tensors -----------------------------------------------------------------------------------

/// One named tensor of a session (a parameter, a buffer or an optimizer state), owning the
/// `DLManagedTensor` that libkiln handed out: dropping it calls the deleter. No copy: it
/// aliases the training's tensor, so it shows every later step, and writing through
/// [`as_mut_slice`](Tensor::as_mut_slice) changes the training. It stays valid after the
/// session is dropped. `Send + Sync`.
pub struct Tensor {
    name: String,
    managed: NonNull<sys::DLManagedTensor>,
    /// The owning session's lock (see the module's notes).
    access: Arc<RwLock<()>>,
}

// SAFETY: the managed tensor holds its own reference to the storage (any thread may release
// it), its metadata never changes, and its data is reached only under `access`.
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: ours, from tensor_list_get; released exactly once, here.
        unsafe {
            let m = self.managed.as_ptr();
            if let Some(deleter) = (*m).deleter {
                deleter(m);
            }
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

impl Tensor {
    fn dl(&self) -> &sys::DLTensor {
        // SAFETY: valid until our deleter call in drop.
        unsafe { &self.managed.as_ref().dl_tensor }
    }

    /// The name session_tensors gives it: the model's state_dict name ("layers.0.linear.weight")
    /// or `"<parameter>.<slot>"` for optimizer state ("head.weight.momentum_buffer").
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn shape(&self) -> &[i64] {
        let t = self.dl();
        if t.ndim <= 0 || t.shape.is_null() {
            return &[];
        }
        // SAFETY: ndim entries owned by the managed tensor.
        unsafe { std::slice::from_raw_parts(t.shape, t.ndim as usize) }
    }

    /// Strides in elements (row-major ones when the producer gave none).
    pub fn strides(&self) -> Vec<i64> {
        let t = self.dl();
        if t.ndim > 0 && !t.strides.is_null() {
            // SAFETY: as in shape.
            return unsafe { std::slice::from_raw_parts(t.strides, t.ndim as usize) }.to_vec();
        }
        row_major(self.shape())
    }

    pub fn dtype(&self) -> DType {
        DType::from_raw(self.dl().dtype)
    }

    pub fn device(&self) -> Device {
        Device::from_raw(self.dl().device)
    }

    /// Elements in the tensor (the product of its shape).
    pub fn numel(&self) -> usize {
        self.shape().iter().map(|&d| d.max(0) as usize).product()
    }

    /// Row-major with no gaps (dimensions of size 1 may have any stride, as in torch).
    pub fn is_contiguous(&self) -> bool {
        let shape = self.shape();
        if shape.contains(&0) {
            return true;
        }
        let strides = self.strides();
        let mut expected = 1i64;
        for (&d, &s) in shape.iter().zip(strides.iter()).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// The address of the first element (data + byte_offset): the training tensor's own
    /// memory, the same for every view of it.
    pub fn data_ptr(&self) -> *mut c_void {
        let t = self.dl();
        (t.data as *mut u8).wrapping_add(t.byte_offset as usize) as *mut c_void
    }

    /// The managed tensor, still owned by `self`.
    pub fn as_raw(&self) -> *const sys::DLManagedTensor {
        self.managed.as_ptr()
    }

    /// Gives up ownership: the caller calls the deleter (or hands it to a DLPack consumer).
    pub fn into_raw(self) -> *mut sys::DLManagedTensor {
        let p = self.managed.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Why `T` cannot view this tensor's memory as one slice, if it cannot.
    fn check_slice<T: Element>(&self) -> Result<(), Error> {
        let invalid =
            |why: String| Error::new(code::INVALID_ARGUMENT, format!("'{}': {}", self.name, why));
        if self.dtype() != T::DTYPE {
            return Err(invalid(format!(
                "its dtype is {:?}, not {:?}",
                self.dtype(),
                T::DTYPE
            )));
        }
        if !self.device().is_host() {
            return Err(invalid(format!(
                "it is on {:?}, not on the CPU",
                self.device()
            )));
        }
        if !self.is_contiguous() {
            return Err(invalid(format!(
                "it is not contiguous (shape {:?}, strides {:?})",
                self.shape(),
                self.strides()
            )));
        }
        if self.numel() > 0 && (self.data_ptr() as usize) % std::mem::align_of::<T>() != 0 {
            return Err(invalid("its data is not aligned for the type".to_string()));
        }
        Ok(())
    }

    /// The data as `&[T]`, with no copy: CPU, contiguous, `T` the tensor's dtype (else
    /// INVALID_ARGUMENT). The guard holds the session's tensors for reading: while it lives,
    /// the session's step/run/load_tensors return FAILED_PRECONDITION (and taking it fails
    /// likewise while a [`SliceMut`] of the same session lives).
    pub fn as_slice<T: Element>(&self) -> Result<Slice<'_, T>, Error> {
        self.check_slice::<T>()?;
        let guard = shared(&self.access, "as_slice")?;
        let n = self.numel();
        let data: &[T] = if n == 0 {
            &[]
        } else {
            // SAFETY: checked above: host memory of n aligned Ts (every bit pattern valid),
            // kept alive by the managed tensor, not written while the read lock is held.
            unsafe { std::slice::from_raw_parts(self.data_ptr() as *const T, n) }
        };
        Ok(Slice {
            _guard: guard,
            data,
        })
    }

    /// The data as `&mut [T]`, with no copy: a write CHANGES THE TRAINING (the parameter the
    /// next step updates, the state it reads). Conditions as [`as_slice`](Tensor::as_slice);
    /// the guard holds the session's tensors exclusively (no other slice, no session call that
    /// reads or writes them, while it lives).
    pub fn as_mut_slice<T: Element>(&mut self) -> Result<SliceMut<'_, T>, Error> {
        self.check_slice::<T>()?;
        let guard = exclusive(&self.access, "as_mut_slice")?;
        let n = self.numel();
        let data: &mut [T] = if n == 0 {
            &mut []
        } else {
            // SAFETY: as in as_slice, and the write lock excludes every other reader.
            unsafe { std::slice::from_raw_parts_mut(self.data_ptr() as *mut T, n) }
        };
        Ok(SliceMut {
            _guard: guard,
            data,
        })
    }

    /// Element offsets (in elements) of every element in row-major order.
    fn offsets(&self) -> Vec<isize> {
        let shape = self.shape();
        let strides = self.strides();
        let n = self.numel();
        let mut out = Vec::with_capacity(n);
        let mut index = vec![0i64; shape.len()];
        for _ in 0..n {
            out.push(
                index
                    .iter()
                    .zip(strides.iter())
                    .map(|(i, s)| i * s)
                    .sum::<i64>() as isize,
            );
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        out
    }

    /// A copy of the data in row-major order (any strides); CPU, `T` the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, Error> {
        self.copy_out(T::DTYPE, |p, k| {
            // SAFETY: p points at element k's bytes; read_unaligned needs no alignment.
            unsafe { ptr::read_unaligned((p as *const T).offset(k)) }
        })
    }

    /// A copy converted to f32 in row-major order (any strides): F32, F64, F16 or BF16 on the
    /// CPU (else INVALID_ARGUMENT).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>, Error> {
        let dtype = self.dtype();
        // SAFETY (each): p points at element k's bytes of the matching type.
        match dtype {
            DType::F32 => self.to_vec::<f32>(),
            DType::F64 => self.copy_out(dtype, |p, k| unsafe {
                ptr::read_unaligned((p as *const f64).offset(k)) as f32
            }),
            DType::F16 => self.copy_out(dtype, |p, k| {
                f16_to_f32(unsafe { ptr::read_unaligned((p as *const u16).offset(k)) })
            }),
            DType::BF16 => self.copy_out(dtype, |p, k| {
                let bits = unsafe { ptr::read_unaligned((p as *const u16).offset(k)) };
                f32::from_bits(u32::from(bits) << 16)
            }),
            other => Err(Error::new(
                code::INVALID_ARGUMENT,
                format!("'{}': dtype {:?} is not floating-point", self.name, other),
            )),
        }
    }

    fn copy_out<T>(
        &self,
        dtype: DType,
        read: impl Fn(*const u8, isize) -> T,
    ) -> Result<Vec<T>, Error> {
        if self.dtype() != dtype {
            return Err(Error::new(
                code::INVALID_ARGUMENT,
                format!(
                    "'{}': its dtype is {:?}, not {:?}",
                    self.name,
                    self.dtype(),
                    dtype
                ),
            ));
        }
        if !self.device().is_host() {
            return Err(Error::new(
                code::INVALID_ARGUMENT,
                format!(
                    "'{}': it is on {:?}, not on the CPU",
                    self.name,
                    self.device()
                ),
            ));
        }
        let _reading = shared(&self.access, "to_vec")?;
        let base = self.data_ptr() as *const u8;
        Ok(self.offsets().into_iter().map(|k| read(base, k)).collect())
    }
}

fn row_major(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1].max(1);
    }
    strides
}

/// IEEE half to single precision (exact).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let mant = u32::from(h & 0x3ff);
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let shift = m.leading_zeros() - 21; // bits to move the top set bit to bit 10
            let m = (m << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// A tensor's data as `&[T]`, holding the session's tensors for reading (see
/// [`Tensor::as_slice`]). Derefs to `[T]`.
pub struct Slice<'a, T> {
    _guard: RwLockReadGuard<'a, ()>,
    data: &'a [T],
}

impl<T> Deref for Slice<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T: fmt::Debug> fmt::Debug for Slice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.data.fmt(f)
    }
}

/// A tensor's data as `&mut [T]`, holding the session's tensors exclusively (see
/// [`Tensor::as_mut_slice`]). Derefs to `[T]`; writes change the training.
pub struct SliceMut<'a, T> {
    _guard: RwLockWriteGuard<'a, ()>,
    data: &'a mut [T],
}

impl<T> Deref for SliceMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> DerefMut for SliceMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

impl<T: fmt::Debug> fmt::Debug for SliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.data.fmt(f)
    }
}

// ---- loading -----------------------------------------------------------------------------------

/// A Rust slice lent to [`Session::load_tensors`] as a CPU, contiguous tensor of a shape. The
/// library only reads it during the call.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    data: *const c_void,
    dtype: DType,
    shape: Vec<i64>,
    _borrow: PhantomData<&'a [u8]>,
}

impl<'a> TensorView<'a> {
    /// `data` in row-major order as a tensor of `shape` (whose product must be data.len();
    /// `&[]` is a scalar of one element).
    pub fn new<T: Element>(data: &'a [T], shape: &[i64]) -> Result<TensorView<'a>, Error> {
        let n: i64 = shape.iter().product();
        if shape.iter().any(|&d| d < 0) || n as usize != data.len() {
            return Err(Error::new(
                code::INVALID_ARGUMENT,
                format!(
                    "shape {:?} does not hold the {} elements given",
                    shape,
                    data.len()
                ),
            ));
        }
        Ok(TensorView {
            data: data.as_ptr() as *const c_void,
            dtype: T::DTYPE,
            shape: shape.to_vec(),
            _borrow: PhantomData,
        })
    }

    /// `data` as a tensor of one dimension.
    pub fn vector<T: Element>(data: &'a [T]) -> TensorView<'a> {
        TensorView {
            data: data.as_ptr() as *const c_void,
            dtype: T::DTYPE,
            shape: vec![data.len() as i64],
            _borrow: PhantomData,
        }
    }

    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The DLPack struct the call reads (no deleter: the library never calls it). Points into
    /// `self` (shape) and the borrowed data.
    fn managed(&self) -> sys::DLManagedTensor {
        sys::DLManagedTensor {
            dl_tensor: sys::DLTensor {
                data: self.data as *mut c_void,
                device: sys::DLDevice {
                    device_type: sys::DL_CPU,
                    device_id: 0,
                },
                ndim: self.shape.len() as i32,
                dtype: self.dtype.to_raw(),
                shape: self.shape.as_ptr() as *mut i64,
                strides: ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: ptr::null_mut(),
            deleter: None,
        }
    }
}

// ---- the session's calls -----------------------------------------------------------------------

impl Session {
    /// The session's live tensors of `kinds` ([`crate::kinds`] bits): parameters, then buffers,
    /// then optimizer state, each in the model's order. No data is copied (see [`Tensor`]).
    /// INVALID_ARGUMENT for kinds 0 or unknown bits; UNSUPPORTED from a version-1 library.
    pub fn tensors(&self, kinds: u32) -> Result<Vec<Tensor>, Error> {
        let api = self.inner.api;
        let session_tensors = slot_v2!(api, session_tensors)?;
        let mut list: *mut sys::KilnTensorList = ptr::null_mut();
        // SAFETY: live session; `list` caller-owned out.
        api.check(unsafe { session_tensors(self.inner.raw, kinds, &mut list) })?;
        let list = List { api, raw: list };
        let count = list.count();
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let mut managed: *mut sys::DLManagedTensor = ptr::null_mut();
            // SAFETY: live list, index in range, `managed` caller-owned out.
            api.check(unsafe { (api.raw.tensor_list_get.unwrap())(list.raw, i, &mut managed) })?;
            let managed = NonNull::new(managed).ok_or_else(|| {
                Error::new(
                    code::INTERNAL,
                    "tensor_list_get reported success but returned no tensor",
                )
            })?;
            out.push(Tensor {
                name: list.name(i),
                managed,
                access: Arc::clone(&self.access),
            });
        }
        Ok(out)
    }

    /// The names [`tensors`](Session::tensors) would give, without views.
    pub fn tensor_names(&self, kinds: u32) -> Result<Vec<String>, Error> {
        let api = self.inner.api;
        let session_tensors = slot_v2!(api, session_tensors)?;
        let mut list: *mut sys::KilnTensorList = ptr::null_mut();
        // SAFETY: as in tensors.
        api.check(unsafe { session_tensors(self.inner.raw, kinds, &mut list) })?;
        let list = List { api, raw: list };
        Ok((0..list.count()).map(|i| list.name(i)).collect())
    }

    /// The model's parameters and buffers, named as a checkpoint's model.safetensors.
    pub fn state_dict(&self) -> Result<Vec<Tensor>, Error> {
        self.tensors(crate::kinds::MODEL)
    }

    /// The model's parameters ("layers.0.linear.weight", "head.bias", ...).
    pub fn parameters(&self) -> Result<Vec<Tensor>, Error> {
        self.tensors(crate::kinds::PARAMETERS)
    }

    /// The model's buffers (batch norm's running statistics, ...).
    pub fn buffers(&self) -> Result<Vec<Tensor>, Error> {
        self.tensors(crate::kinds::BUFFERS)
    }

    /// The optimizer's state, `"<parameter>.<slot>"` ("head.weight.momentum_buffer"); empty
    /// before the first step for optimizers that create their state then.
    pub fn optimizer_state(&self) -> Result<Vec<Tensor>, Error> {
        self.tensors(crate::kinds::OPTIMIZER)
    }

    /// `[ema]`'s moving average of the parameters and buffers, `"ema/<name>"` in the model's
    /// order (floating ones at least f32), live as the others; FAILED_PRECONDITION when the
    /// pipeline keeps no average.
    pub fn average(&self) -> Result<Vec<Tensor>, Error> {
        self.tensors(crate::kinds::AVERAGE)
    }

    /// Copies the given tensors into the model's parameters and buffers of the same names
    /// (the optimizer's state is left as it is). `flags`: [`crate::load`] bits, 0 (STRICT):
    /// every model tensor given, no unknown names. Floating-point data is cast to the model's
    /// dtype; shapes must match. With `[ema]`, `"ema/<name>"` tensors load the average
    /// (optional). A refusal is INVALID_ARGUMENT naming the key, and changes nothing.
    pub fn load_tensors(
        &mut self,
        tensors: &[(&str, TensorView<'_>)],
        flags: u32,
    ) -> Result<(), Error> {
        let managed: Vec<sys::DLManagedTensor> = tensors.iter().map(|(_, v)| v.managed()).collect();
        let pointers: Vec<*const sys::DLManagedTensor> =
            managed.iter().map(|m| m as *const _).collect();
        let names = tensors
            .iter()
            .map(|(n, _)| cstring("tensor name", n.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        self.load_raw(&names, &pointers, flags)
    }

    /// [`load_tensors`](Session::load_tensors) from another session's tensors (by their names),
    /// e.g. `b.load_tensors_from(&a.state_dict()?, load::STRICT)`: no copy on the way, any
    /// device. Their session must not have a [`SliceMut`] alive.
    pub fn load_tensors_from(&mut self, tensors: &[Tensor], flags: u32) -> Result<(), Error> {
        // Read locks of the sources' sessions (each once; this session's own is taken below).
        let mut locks: Vec<&Arc<RwLock<()>>> = Vec::new();
        for t in tensors {
            if !Arc::ptr_eq(&t.access, &self.access)
                && !locks.iter().any(|l| Arc::ptr_eq(l, &t.access))
            {
                locks.push(&t.access);
            }
        }
        let _reading = locks
            .iter()
            .map(|l| shared(l, "load_tensors_from"))
            .collect::<Result<Vec<_>, _>>()?;
        let pointers: Vec<*const sys::DLManagedTensor> =
            tensors.iter().map(|t| t.as_raw()).collect();
        let names = tensors
            .iter()
            .map(|t| cstring("tensor name", t.name.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        self.load_raw(&names, &pointers, flags)
    }

    fn load_raw(
        &mut self,
        names: &[CString],
        tensors: &[*const sys::DLManagedTensor],
        flags: u32,
    ) -> Result<(), Error> {
        let api = self.inner.api;
        let load = slot_v2!(api, session_load_tensors)?;
        let access = Arc::clone(&self.access);
        let _busy = exclusive(&access, "load_tensors")?;
        let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
        // SAFETY: live session; names and tensors borrowed for the call (the tensors' data and
        // shapes outlive it); the library never calls their deleters.
        let status = unsafe {
            load(
                self.inner.raw,
                if name_ptrs.is_empty() {
                    ptr::null()
                } else {
                    name_ptrs.as_ptr()
                },
                if tensors.is_empty() {
                    ptr::null()
                } else {
                    tensors.as_ptr()
                },
                tensors.len(),
                flags,
            )
        };
        api.check(status)
    }
}

/// A tensor list, released on drop.
struct List {
    api: Api,
    raw: *mut sys::KilnTensorList,
}

impl List {
    fn count(&self) -> usize {
        // SAFETY: live list; the slots exist (session_tensors did).
        unsafe { (self.api.raw.tensor_list_count.unwrap())(self.raw) }
    }
    fn name(&self, i: usize) -> String {
        // SAFETY: live list; the name is copied before the release.
        unsafe { string_from((self.api.raw.tensor_list_name.unwrap())(self.raw, i)) }
    }
}

impl Drop for List {
    fn drop(&mut self) {
        if let Some(release) = self.api.raw.tensor_list_release {
            // SAFETY: from session_tensors, released once.
            unsafe { release(self.raw) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0200), 2f32.powi(-15));
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    #[test]
    fn row_major_strides() {
        assert_eq!(row_major(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(row_major(&[5]), vec![1]);
        assert!(row_major(&[]).is_empty());
    }
}
