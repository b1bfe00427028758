//! The `jemalloc` feature (Linux): jemalloc is the `malloc` of the whole process, MLX's C++
//! included, with burn-mlx's options, and MLX work allocates and frees through it correctly.
//!
//! Compiled to an empty binary without the feature; `.ci/run` runs it as
//! `cargo test --features jemalloc --test jemalloc`.
#![cfg(all(feature = "jemalloc", target_os = "linux"))]

use burn_autodiff::Autodiff;
use burn_mlx::{Mlx, MlxDevice};
use burn_tensor::{Tensor, TensorData, Tolerance};
use std::ffi::{c_char, c_int, c_void, CStr};

extern "C" {
    /// jemalloc's control interface (unprefixed, as the feature builds it).
    fn mallctl(
        name: *const c_char,
        oldp: *mut c_void,
        oldlenp: *mut usize,
        newp: *mut c_void,
        newlen: usize,
    ) -> c_int;
}

/// The file of the loaded object that defines the `malloc` every library's calls resolve to.
fn object_defining_malloc() -> String {
    // SAFETY: dlsym and dladdr read the dynamic linker's tables; `info` is written by dladdr.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr());
        assert!(!f.is_null(), "dlsym found no malloc");
        let mut info: libc::Dl_info = std::mem::zeroed();
        assert!(
            libc::dladdr(f, &mut info) != 0,
            "dladdr knows no object at malloc"
        );
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    }
}

/// A jemalloc option of type `ssize_t`.
fn option_isize(name: &CStr) -> isize {
    let mut value: isize = 0;
    let mut len = std::mem::size_of::<isize>();
    // SAFETY: `value` has the size `len` says, which jemalloc checks against the option's type.
    let rc = unsafe {
        mallctl(
            name.as_ptr(),
            (&mut value as *mut isize).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    assert_eq!(rc, 0, "mallctl({name:?}) failed with {rc}");
    value
}

#[test]
fn malloc_of_every_library_is_jemalloc_with_burn_mlx_options() {
    // glibc's malloc lives in libc.so.6; with the feature the executable exports jemalloc's, which
    // the dynamic linker then gives libmlx.so as well.
    let owner = object_defining_malloc();
    assert!(
        !owner.contains("libc.so"),
        "malloc still resolves to glibc ({owner}): MLX's C++ would not use jemalloc"
    );
    // burn-mlx keeps freed pages (src/alloc.rs); MALLOC_CONF in the environment may override it.
    if std::env::var_os("MALLOC_CONF").is_none() {
        assert_eq!(option_isize(c"opt.dirty_decay_ms"), -1);
        assert_eq!(option_isize(c"opt.muzzy_decay_ms"), -1);
    }
}

#[test]
fn mlx_work_allocates_and_frees_through_jemalloc() {
    type B = Autodiff<Mlx>;
    let device = MlxDevice::Cpu;
    // Buffers made by MLX's C++ on one thread and dropped on others, and a gradient step.
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(
            (0..64 * 32).map(|i| (i % 7) as f32 * 0.1).collect(),
            [64, 32],
        ),
        &device,
    );
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let x = x.clone().inner();
            std::thread::spawn(move || {
                let mut y = x;
                for _ in 0..50 {
                    y = (y.clone().matmul(y.clone().transpose()).tanh() * 0.5).matmul(y) + t as f32;
                    y = y.clamp(-4.0, 4.0);
                }
                y.sum().into_scalar()
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().expect("a worker thread panicked").is_finite());
    }
    // d/dW sum(x W) = x^T 1: every row of the gradient is the column sum of x.
    let w = Tensor::<B, 2>::ones([32, 8], &device).require_grad();
    let grads = x.clone().matmul(w.clone()).sum().backward();
    let got = w.grad(&grads).expect("w has a gradient");
    let col = x.inner().sum_dim(0).transpose().repeat_dim(1, 8);
    got.into_data()
        .assert_approx_eq::<f32>(&col.into_data(), Tolerance::default());
}
