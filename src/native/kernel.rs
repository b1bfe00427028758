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
}

impl CudaKernel {
    /// A kernel named `name` over `inputs` and `outputs` (the names the body uses), with `header`
    /// (helper functions) placed before it. Inputs are used in their own layout: the body must
    /// read them row-contiguous, which the callers ensure.
    pub(crate) fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
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
                true,
                0,
            );
            mlx_sys::mlx_vector_string_free(vi);
            mlx_sys::mlx_vector_string_free(vo);
            handle
        };
        Self {
            handle,
            name: name.to_string(),
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
        let names: Vec<CString> = template
            .iter()
            .map(|t| match t {
                TemplateArg::Dtype(n, _) | TemplateArg::Int(n, _) => {
                    CString::new(*n).expect("template names have no NUL")
                }
            })
            .collect();
        // SAFETY: the kernel handle is live (owned by `self`); the config, the input vector and
        // the output vector are created and freed here; the input arrays are live for the call;
        // each output array is copied into a handle owned by the returned `Array`.
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
            ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_grid(config, grid[0], grid[1], grid[2])
                == 0;
            ok &= mlx_sys::mlx_fast_cuda_kernel_config_set_thread_group(
                config, block[0], block[1], block[2],
            ) == 0;
            let handles: Vec<mlx_sys::mlx_array> = inputs.iter().map(|a| a.as_ptr()).collect();
            let vin = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len());
            let mut vout = mlx_sys::mlx_vector_array_new();
            if ok {
                ok = mlx_sys::mlx_fast_cuda_kernel_apply(
                    &mut vout,
                    self.handle,
                    vin,
                    config,
                    stream.as_ptr(),
                ) == 0;
            }
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
            mlx_sys::mlx_fast_cuda_kernel_config_free(config);
            if ok && arrays.len() == outputs.len() {
                Ok(arrays)
            } else {
                Err(fail())
            }
        }
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: the handle was made by `mlx_fast_cuda_kernel_new` and is freed once.
        unsafe {
            mlx_sys::mlx_fast_cuda_kernel_free(self.handle);
        }
    }
}
