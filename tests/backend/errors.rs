//! Error paths: every misuse gives a clear error naming the op, shapes and dtypes, never an abort
//! or a silent wrong answer.
//!
//! - Burn's infallible ops panic with a message (checked through `catch_unwind`); the backend's own
//!   messages are reached by calling the backend traits directly, below Burn's shape checks.
//! - Burn's fallible paths (`try_into_data`, `Backend::sync`) return `ExecutionError`.
//! - The low-level API (`MlxTensor`, `MlxOps`) returns `MlxError`.
//! - Devices: the GPU on a machine without one, and device ids that do not exist, are clear errors,
//!   and the CPU keeps working afterwards.

use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn_backend::{Backend, DType, DeviceId, ExecutionError, Shape};
use burn_mlx::{Mlx, MlxDevice, MlxError, MlxOps, MlxTensor};
use burn_tensor::{Int, Tensor, TensorData};
use std::panic::{catch_unwind, AssertUnwindSafe};

const CPU: MlxDevice = MlxDevice::Cpu;

/// Runs `f`, which must panic, and returns its panic message.
fn panic_message<T>(f: impl FnOnce() -> T) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("expected a panic, but the call returned"),
        Err(e) => e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(non-string panic)".into()),
    }
}

/// Asserts that `msg` contains every one of `parts`.
fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} does not mention {p:?}");
    }
}

/// The CPU still computes correctly (after an error).
fn cpu_still_works() {
    let t = Tensor::<Mlx, 1>::from_floats([1.0, 2.0, 3.0], &CPU);
    let v: Vec<f32> = (t * 2.0).into_data().to_vec().unwrap();
    assert_eq!(v, vec![2.0, 4.0, 6.0]);
}

fn prim(shape: [usize; 2], dtype: DType) -> MlxTensor {
    let n: usize = shape.iter().product();
    let data = TensorData::new((0..n).map(|i| i as f32).collect::<Vec<_>>(), shape);
    MlxTensor::from_data(data.convert_dtype(dtype), CPU).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Burn's infallible ops: panics naming the op, shapes and dtypes
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_mismatch_panics_with_op_shapes_dtypes() {
    let msg =
        panic_message(|| Mlx::float_matmul(prim([2, 3], DType::F32), prim([4, 5], DType::F32)));
    assert_mentions(&msg, &["float_matmul", "[2, 3]", "[4, 5]", "Float32"]);
    cpu_still_works();
}

#[test]
fn matmul_mismatch_through_tensor_api_panics() {
    let a = Tensor::<Mlx, 2>::ones([2, 3], &CPU);
    let b = Tensor::<Mlx, 2>::ones([4, 5], &CPU);
    let msg = panic_message(|| a.matmul(b).into_data());
    assert!(msg.to_lowercase().contains("matmul"), "{msg}");
    cpu_still_works();
}

#[test]
fn elementwise_broadcast_mismatch_panics() {
    let msg = panic_message(|| Mlx::float_add(prim([2, 3], DType::F32), prim([4, 5], DType::F32)));
    assert_mentions(&msg, &["float_add", "[2, 3]", "[4, 5]"]);
    let msg = panic_message(|| Mlx::int_mul(prim([2, 3], DType::I32), prim([3, 2], DType::I32)));
    assert_mentions(&msg, &["int_mul", "[2, 3]", "[3, 2]", "Int32"]);
    cpu_still_works();
}

#[test]
fn reshape_to_wrong_element_count_panics() {
    let msg = panic_message(|| Mlx::float_reshape(prim([2, 3], DType::F32), Shape::new([4, 2])));
    assert_mentions(&msg, &["reshape", "[2, 3]"]);
    // Burn's own check fires first through the tensor API.
    let msg = panic_message(|| Tensor::<Mlx, 2>::ones([2, 3], &CPU).reshape([4, 2]));
    assert!(msg.contains("reshape") || msg.contains("Reshape"), "{msg}");
    cpu_still_works();
}

#[test]
fn cat_mismatch_panics() {
    let msg = panic_message(|| {
        Mlx::float_cat(vec![prim([2, 3], DType::F32), prim([2, 4], DType::F32)], 0)
    });
    assert_mentions(&msg, &["cat", "[2, 3]", "[2, 4]"]);
    let msg = panic_message(|| Mlx::float_cat(vec![], 0));
    assert_mentions(&msg, &["cat"]);
    cpu_still_works();
}

#[test]
fn int_only_op_given_a_float_tensor_panics() {
    // The trait takes an int primitive; a float array smuggled in is rejected by MLX, not
    // reinterpreted.
    let msg =
        panic_message(|| Mlx::bitwise_and(prim([2, 2], DType::F32), prim([2, 2], DType::F32)));
    assert_mentions(&msg, &["bitwise_and"]);
    let msg = panic_message(|| Mlx::bool_and(prim([2, 2], DType::F32), prim([3, 3], DType::F32)));
    assert_mentions(&msg, &["bool_and", "[2, 2]", "[3, 3]"]);
    cpu_still_works();
}

#[test]
fn argmax_of_empty_dim_panics_clearly() {
    let t = Tensor::<Mlx, 2>::zeros([2, 0], &CPU);
    let msg = panic_message(|| t.argmax(1).into_data());
    assert_mentions(&msg, &["argmax", "[2, 0]"]);
    cpu_still_works();
}

#[test]
fn too_large_dimension_panics_clearly() {
    let msg = panic_message(|| Tensor::<Mlx, 1>::zeros([1usize << 40], &CPU));
    assert_mentions(&msg, &["zeros", "1099511627776", "2^31"]);
    cpu_still_works();
}

// ---------------------------------------------------------------------------------------------
// Burn's fallible paths
// ---------------------------------------------------------------------------------------------

#[test]
fn fallible_reads_return_results() {
    let t = Tensor::<Mlx, 2>::ones([2, 2], &CPU) * 3.0;
    let data: Result<TensorData, ExecutionError> = t.try_into_data();
    assert_eq!(data.unwrap().to_vec::<f32>().unwrap(), vec![3.0; 4]);
    let i = Tensor::<Mlx, 1, Int>::arange(0..4, &CPU);
    assert_eq!(
        i.try_into_data().unwrap().to_vec::<i64>().unwrap(),
        vec![0, 1, 2, 3]
    );
    assert!(Mlx::sync(&CPU).is_ok());
}

#[test]
fn mlx_errors_become_execution_errors_with_their_message() {
    let e = MlxTensor::ones::<f32>(&[2, 3], CPU)
        .matmul(&MlxTensor::ones::<f32>(&[4, 5], CPU).unwrap())
        .unwrap_err();
    let text = e.to_string();
    let exec: ExecutionError = e.into();
    assert!(format!("{exec:?}").contains(&text), "{exec:?} lost {text}");
}

// ---------------------------------------------------------------------------------------------
// The low-level API returns MlxError
// ---------------------------------------------------------------------------------------------

#[test]
fn api_matmul_mismatch_is_an_error() {
    let a = MlxTensor::ones::<f32>(&[2, 3], CPU).unwrap();
    let b = MlxTensor::ones::<f32>(&[4, 5], CPU).unwrap();
    match (&a).matmul(&b) {
        Err(MlxError::Mlx { op, message }) => {
            assert_eq!(op, "matmul");
            assert_mentions(&message, &["[2, 3]", "[4, 5]", "Float32"]);
        }
        other => panic!("expected MlxError::Mlx, got {other:?}"),
    }
    // Errors travel to the end of a chain, untouched.
    let chained = a.matmul(&b).relu().softmax().sum().eval();
    assert!(matches!(chained, Err(MlxError::Mlx { ref op, .. }) if op == "matmul"));
}

#[test]
fn api_wrong_element_type_is_an_error() {
    let t = MlxTensor::from_slice(&[1i32, 2, 3], &[3], CPU).unwrap();
    match t.to_vec::<f32>() {
        Err(MlxError::Dtype { op, dtype, .. }) => {
            assert_eq!(op, "to_vec");
            assert!(dtype.contains("Int32"), "{dtype}");
        }
        other => panic!("expected MlxError::Dtype, got {other:?}"),
    }
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, 2, 3]);
    assert_eq!(
        t.cast::<f32>().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0]
    );
}

#[test]
fn api_shape_errors() {
    match MlxTensor::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2], CPU) {
        Err(MlxError::Shape { op, shapes }) => {
            assert_eq!(op, "from_slice");
            assert_mentions(&shapes, &["3 values", "[2, 2]"]);
        }
        other => panic!("expected MlxError::Shape, got {other:?}"),
    }
    let t = MlxTensor::ones::<f32>(&[2, 3], CPU).unwrap();
    assert!(matches!(t.reshape(&[4, 2]), Err(MlxError::Mlx { ref op, .. }) if op == "reshape"));
    assert!(matches!(
        MlxTensor::zeros::<f32>(&[1usize << 33], CPU),
        Err(MlxError::Shape { .. })
    ));
    // Dimensions that fit but a buffer larger than the machine's memory: an error, not a crash.
    match MlxTensor::zeros::<f32>(&[1 << 20, 1 << 20], CPU) {
        Err(MlxError::Memory { bytes, .. }) => assert_eq!(bytes, 1 << 42),
        other => panic!("expected MlxError::Memory, got {other:?}"),
    }
    let big = MlxTensor::ones::<f32>(&[1 << 20, 1], CPU).unwrap();
    let row = MlxTensor::ones::<f32>(&[1, 1 << 20], CPU).unwrap();
    assert!(matches!(big.matmul(&row), Err(MlxError::Memory { ref op, .. }) if op == "matmul"));
}

#[test]
fn api_op_given_an_unsupported_dtype_is_an_error() {
    // MLX's matmul takes floats only: int inputs come back as an error naming the op and dtypes.
    let a = MlxTensor::from_slice(&[1i32, 2, 3, 4], &[2, 2], CPU).unwrap();
    match (&a).matmul(&a) {
        Err(MlxError::Mlx { op, message }) => {
            assert_eq!(op, "matmul");
            assert_mentions(&message, &["[2, 2]", "Int32"]);
        }
        other => panic!("expected MlxError::Mlx, got {other:?}"),
    }
    // Casting first makes it work.
    let f = a.cast::<f32>().unwrap();
    assert_eq!(
        (&f).matmul(&f).unwrap().to_vec::<f32>().unwrap(),
        vec![7.0, 10.0, 15.0, 22.0]
    );
}

// ---------------------------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------------------------

#[test]
fn gpu_without_gpu_is_a_clear_error_and_cpu_keeps_working() {
    if MlxDevice::gpu_available() {
        eprintln!("this machine has an MLX GPU: nothing to check");
        return;
    }
    let gpu = MlxDevice::Gpu;
    assert!(!gpu.is_available());
    assert_eq!(MlxDevice::default(), MlxDevice::Cpu);
    match gpu.check() {
        Err(MlxError::Device { device, hint }) => {
            assert_eq!(device, "Gpu");
            assert!(hint.contains("MlxDevice::Cpu"), "{hint}");
        }
        other => panic!("expected MlxError::Device, got {other:?}"),
    }
    // Burn's API: creation, data upload and moves all panic with the device error.
    let msg = panic_message(|| Tensor::<Mlx, 1>::zeros([3], &gpu));
    assert_mentions(&msg, &["Gpu", "not available"]);
    cpu_still_works();
    let msg = panic_message(|| Tensor::<Mlx, 1>::from_floats([1.0, 2.0], &gpu));
    assert_mentions(&msg, &["Gpu", "not available"]);
    cpu_still_works();
    let msg = panic_message(|| Tensor::<Mlx, 1>::ones([3], &CPU).to_device(&gpu));
    assert_mentions(&msg, &["to_device", "not available"]);
    cpu_still_works();
    let msg = panic_message(|| Tensor::<Mlx, 1, Int>::arange(0..4, &gpu));
    assert_mentions(&msg, &["Gpu", "not available"]);
    cpu_still_works();
    // The low-level API returns the error.
    assert!(matches!(
        MlxTensor::zeros::<f32>(&[2], gpu),
        Err(MlxError::Device { .. })
    ));
    assert!(matches!(
        MlxTensor::random_uniform(&[2], 0.0, 1.0, gpu),
        Err(MlxError::Device { .. })
    ));
    assert!(matches!(
        MlxTensor::from_data(TensorData::new(vec![1.0f32], [1]), gpu),
        Err(MlxError::Device { .. })
    ));
    // f64 on a GPU is refused up front (the device check comes first without a GPU).
    assert!(MlxTensor::zeros::<f64>(&[2], gpu).is_err());
    assert!(Mlx::dtype_usage(&gpu, DType::F64).is_empty());
    assert!(!Mlx::dtype_usage(&CPU, DType::F64).is_empty());
    assert_eq!(Mlx::device_count(1), 0);
    cpu_still_works();
}

#[test]
fn device_that_does_not_exist_is_a_clear_error() {
    use burn_backend::Device;
    // Burn can name devices by id; an id beyond what MLX has maps to the GPU, which this machine
    // does not offer.
    let dev = MlxDevice::from_id(DeviceId {
        type_id: 7,
        index_id: 3,
    });
    if dev.is_available() {
        return;
    }
    let msg = panic_message(|| Tensor::<Mlx, 2>::ones([2, 2], &dev));
    assert_mentions(&msg, &["not available"]);
    assert!(dev.check().is_err());
    assert_eq!(
        MlxDevice::from_id(DeviceId {
            type_id: 0,
            index_id: 0
        }),
        MlxDevice::Cpu
    );
    cpu_still_works();
}

#[test]
fn f64_stays_usable_on_the_cpu() {
    let t = MlxTensor::from_slice(&[1.5f64, 2.5], &[2], CPU).unwrap();
    assert_eq!(
        t.scale(2.0).unwrap().to_vec::<f64>().unwrap(),
        vec![3.0, 5.0]
    );
    let b =
        Tensor::<Mlx, 1>::from_data(TensorData::new(vec![1.5f64, 2.5], [2]), (&CPU, DType::F64));
    assert_eq!(b.into_data().to_vec::<f64>().unwrap(), vec![1.5, 2.5]);
}
