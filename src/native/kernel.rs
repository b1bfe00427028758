//! MLX's custom CUDA kernels (`mlx::core::fast::cuda_kernel`, through mlx-c's
//! `mlx_fast_cuda_kernel_*`): a kernel body written in CUDA, compiled by MLX with NVRTC on its
//! first launch in a process and run as one primitive of the graph (for [`crate::decode`]).
//!
//! MLX generates the kernel's signature: each input `x` is a `const T* x` in its dtype's CUDA
//! type, each output `y` a `T* y`; the template arguments become `constexpr` values (and `using`
//! types) at the top of the body, and are part of the kernel's name, so MLX compiles one kernel
//! per distinct set. The grid is given in threads, as in MLX's Python `mx.fast.cuda_kernel`.

use super::init;
use crate::error::MlxError;
use mlx_rs::{Array, Dtype, Stream};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;

/// A compile-time argument of a kernel: a type name bound to a dtype's CUDA type, or an `int`.
#[derive(Debug, Clone)]
pub(crate) enum TemplateArg {
    /// `using NAME = <the dtype's CUDA type>;`
    Dtype(&'static str, Dtype),
    /// `constexpr int NAME = value;`
    Int(&'static str, i32),
}

/// A kernel made once from its source; [`apply`](Self::apply) adds it to the graph.
pub(crate) struct CudaKernel {
    handle: mlx_sys::mlx_fast_cuda_kernel,
    name: String,
    /// The launch configurations made so far, by their outputs, template arguments and grid: a
    /// decode step launches each kernel with the same few, once per layer.
    configs: RefCell<HashMap<Vec<i64>, mlx_sys::mlx_fast_cuda_kernel_config>>,
}

impl CudaKernel {
    /// A kernel named `name` over `inputs` and `outputs` (the names the body uses), with `header`
    /// (helper functions) placed before it. With `row_contiguous`, the body reads every input
    /// row-contiguous: MLX copies an input that is not. Without it, inputs come as they are, and
    /// the body indexes them through `NAME_strides` (a transposed view is then read in place).
    pub(crate) fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
        row_contiguous: bool,
    ) -> Self {
        init();
        let cstrings = |names: &[&str]| -> Vec<CString> {
            names
                .iter()
                .map(|n| CString::new(*n).expect("kernel argument names have no NUL"))
                .collect()
        };
        let (ins, outs) = (cstrings(inputs), cstrings(outputs));
        let c_name = CString::new(name).expect("kernel names have no NUL");
        let c_source = CString::new(source).expect("kernel sources have no NUL");
        let c_header = CString::new(header).expect("kernel headers have no NUL");
        // SAFETY: every string outlives the calls; the vectors are created, filled and freed
        // here (mlx-c copies their contents into the kernel object, which this struct owns).
        let handle = unsafe {
            let vec = |names: &[CString]| {
                let v = mlx_sys::mlx_vector_string_new();
                for n in names {
                    mlx_sys::mlx_vector_string_append_value(v, n.as_ptr());
                }
                v
            };
            let (vi, vo) = (vec(&ins), vec(&outs));
            let handle = mlx_sys::mlx_fast_cuda_kernel_new(
                c_name.as_ptr(),
                vi,
                vo,
                c_source.as_ptr(),
                c_header.as_ptr(),
                row_contiguous,
                0,
            );
            mlx_sys::mlx_vector_string_free(vi);
            mlx_sys::mlx_vector_string_free(vo);
            handle
        };
        Self {
            handle,
            name: name.to_string(),
            configs: RefCell::new(HashMap::new()),
        }
    }

    /// The kernel's outputs (each `(shape, dtype)`) for `inputs`, launched on `grid` threads in
    /// blocks of `block`, on the thread's default stream (which must be the GPU's).
    pub(crate) fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[(&[i32], Dtype)],
        template: &[TemplateArg],
        grid: [i32; 3],
        block: [i32; 3],
    ) -> Result<Vec<Array>, MlxError> {
        let fail = || {
            MlxError::mlx(
                &format!("custom CUDA kernel {}", self.name),
                "MLX rejected the launch (see the shapes and dtypes of its inputs)",
            )
        };
        let stream = Stream::thread_local_or_default();
        let mut key: Vec<i64> = Vec::with_capacity(32);
        for (shape, dtype) in outputs {
            key.push(*dtype as i64);
            key.push(shape.len() as i64);
            key.extend(shape.iter().map(|&d| d as i64));
        }
        for arg in template {
            match arg {
                TemplateArg::Dtype(_, d) => key.extend([0, *d as i64]),
                TemplateArg::Int(_, v) => key.extend([1, *v as i64]),
            }
        }
        key.extend(grid.iter().chain(&block).map(|&g| g as i64));
        let mut configs = self.configs.borrow_mut();
        let config = match configs.get(&key) {
            Some(config) => *config,
            None => {
                let config = make_config(outputs, template, grid, block).ok_or_else(fail)?;
                configs.insert(key, config);
                config
            }
        };
        // SAFETY: the kernel handle and the config are live (owned by `self`); the input and
        // output vectors are created and freed here; the input arrays are live for the call;
        // each output array is copied into a handle owned by the returned `Array`.
        unsafe {
            let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
            let vin = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
            let mut vout = mlx_sys::mlx_vector_array_new();
            let ok = mlx_sys::mlx_fast_cuda_kernel_apply(
                &mut vout,
                self.handle,
                vin,
                config,
                stream.as_ptr(),
            ) == 0;
            let mut arrays = Vec::new();
            if ok {
                let n = mlx_sys::mlx_vector_array_size(vout);
                for i in 0..n {
                    let mut a = mlx_sys::mlx_array_new();
                    mlx_sys::mlx_vector_array_get(&mut a, vout, i);
                    arrays.push(Array::from_ptr(a));
                }
            }
            mlx_sys::mlx_vector_array_free(vout);
            mlx_sys::mlx_vector_array_free(vin);
            if ok && arrays.len() == outputs.len() {
                Ok(arrays)
            } else {
                Err(fail())
            }
        }
    }
}

/// A launch configuration: the outputs' shapes and dtypes, the template arguments, the grid and
/// the block; `None` when mlx-c rejects a part of it.
fn make_config(
    outputs: &[(&[i32], Dtype)],
    template: &[TemplateArg],
    grid: [i32; 3],
    block: [i32; 3],
) -> Option<mlx_sys::mlx_fast_cuda_kernel_config> {
    let names: Vec<CString> = template
        .iter()
        .map(|t| match t {
            TemplateArg::Dtype(n, _) | TemplateArg::Int(n, _) => {
                CString::new(*n).expect("template names have no NUL")
            }
        })
        .collect();
    // SAFETY: the config is created here and either returned (its owner frees it) or freed;
    // the shapes and names outlive the calls, and mlx-c copies them.
    unsafe {
        let config = mlx_sys::mlx_fast_cuda_kernel_config_new();
        let mut ok = true;
        for (shape, dtype) in outputs {
            ok &= mlx_sys::mlx_fast_cuda_kernel_config_add_output_arg(
                config,
                shape.as_ptr(),
                shape.len(),
                *dtype as mlx_sys::mlx_dtype,
            ) == 0;
        }
        for (arg, name) in template.iter().zip(&names) {
            ok &= match arg {
                TemplateArg::Dtype(_, d) => {
                    mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_dtype(
                        config,
                        name.as_ptr(),
                        *d as mlx_sys::mlx_dtype,
                    )
                }
                TemplateArg::Int(_, v) => {
                    mlx_sys::mlx_fast_cuda_kernel_config_add_template_arg_int(
                        config,
                        name.as_ptr(),
                        *v,
                    )
                }
            } == 0;
        }
        ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid[0], grid[1], grid[2]) == 0;
        ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
            config, block[0], block[1], block[2],
        ) == 0;
        if ok {
            Some(config)
        } else {
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            None
        }
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: the handle and each config were made by mlx-c and are freed once.
        unsafe {
            for (_, config) in self.configs.borrow_mut().drain() {
                mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            }
            mlx_sys::mlx_fast_cuda_kernel_free(self.handle);
        }
    }
}

/// Whether MLX ops made now run on MLX's CUDA device: the thread's default stream is on the GPU,
/// on Linux (where MLX's GPU backend is CUDA).
pub(crate) fn default_stream_on_cuda() -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let stream = Stream::thread_local_or_default();
    // SAFETY: the device handle is created, read and freed here; the stream is live.
    unsafe {
        let mut device = mlx_sys::mlx_device_new();
        let mut kind = mlx_sys::mlx_device_type__MLX_CPU;
        let ok = mlx_sys::mlx_stream_get_device(&mut device, stream.as_ptr()) == 0
            && mlx_sys::mlx_device_get_type(&mut kind, device) == 0;
        mlx_sys::mlx_device_free(device);
        ok && kind == mlx_sys::mlx_device_type__MLX_GPU
    }
}

/// Runs `f` on the kernel `name` of this thread, made on first use from `source()` and `header`
/// (MLX compiles it on its first launch in the process), whose inputs MLX makes row-contiguous.
/// Kernels are made per thread because MLX's graph building is per thread.
pub(crate) fn with_kernel<T>(
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    source: impl FnOnce() -> String,
    header: &str,
    f: impl FnOnce(&CudaKernel) -> T,
) -> T {
    with_any_kernel(name, inputs, outputs, source, header, true, f)
}

/// [`with_kernel`] for a kernel that reads its inputs as they are laid out, through their
/// strides (see [`CudaKernel::new`]).
pub(crate) fn with_strided_kernel<T>(
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    source: impl FnOnce() -> String,
    header: &str,
    f: impl FnOnce(&CudaKernel) -> T,
) -> T {
    with_any_kernel(name, inputs, outputs, source, header, false, f)
}

fn with_any_kernel<T>(
    name: &'static str,
    inputs: &[&str],
    outputs: &[&str],
    source: impl FnOnce() -> String,
    header: &str,
    row_contiguous: bool,
    f: impl FnOnce(&CudaKernel) -> T,
) -> T {
    thread_local! {
        static KERNELS: RefCell<HashMap<&'static str, CudaKernel>> = RefCell::new(HashMap::new());
    }
    KERNELS.with(|cell| {
        let mut map = cell.borrow_mut();
        let kernel = map.entry(name).or_insert_with(|| {
            CudaKernel::new(name, inputs, outputs, &source(), header, row_contiguous)
        });
        f(kernel)
    })
}

/// The number of streaming multiprocessors of CUDA device 0, from the CUDA driver that MLX has
/// loaded (`cuDeviceGetAttribute`); `None` where no driver is loaded or it does not answer.
/// Kernels that synchronize their whole grid launch at most this many blocks, so that every
/// block is resident at once.
#[cfg(target_os = "linux")]
pub(crate) fn multiprocessors() -> Option<usize> {
    static COUNT: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *COUNT.get_or_init(|| {
        type Init = unsafe extern "C" fn(u32) -> i32;
        type Get = unsafe extern "C" fn(*mut i32, i32) -> i32;
        type Attribute = unsafe extern "C" fn(*mut i32, i32, i32) -> i32;
        // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
        const MULTIPROCESSORS: i32 = 16;
        // SAFETY: the library is opened only if already loaded (by MLX's CUDA backend) and never
        // closed; each symbol is called with the signature of the CUDA driver API and pointers
        // to locals.
        unsafe {
            let lib = libc::dlopen(
                c"libcuda.so.1".as_ptr(),
                libc::RTLD_LAZY | libc::RTLD_NOLOAD,
            );
            if lib.is_null() {
                return None;
            }
            let sym = |name: &std::ffi::CStr| libc::dlsym(lib, name.as_ptr());
            let (init, get, attribute) = (
                sym(c"cuInit"),
                sym(c"cuDeviceGet"),
                sym(c"cuDeviceGetAttribute"),
            );
            if init.is_null() || get.is_null() || attribute.is_null() {
                return None;
            }
            let init: Init = std::mem::transmute(init);
            let get: Get = std::mem::transmute(get);
            let attribute: Attribute = std::mem::transmute(attribute);
            let (mut device, mut count) = (0i32, 0i32);
            (init(0) == 0
                && get(&mut device, 0) == 0
                && attribute(&mut count, MULTIPROCESSORS, device) == 0
                && count > 0)
                .then_some(count as usize)
        }
    })
}

/// No CUDA driver off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn multiprocessors() -> Option<usize> {
    None
}
