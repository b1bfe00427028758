//! Real FFT and its inverse along one axis, on MLX's `fft` module.
//!
//! MLX computes FFTs in single precision (`complex64`); other float dtypes are converted to f32
//! and the results back to the input's dtype.

use super::common::{run_many, Res};
use crate::tensor::MlxTensor;
use mlx_rs::{complex64, Array, Dtype};

fn to_f32(a: &Array) -> Res {
    Ok(if a.dtype() == Dtype::Float32 {
        a.clone()
    } else {
        a.as_dtype(Dtype::Float32)?
    })
}

fn to_dtype(a: Array, dtype: Dtype) -> Res {
    Ok(if a.dtype() == dtype {
        a
    } else {
        a.as_dtype(dtype)?
    })
}

/// The real FFT of `signal` along `dim`, truncated or zero-padded to `n` samples first when `n`
/// is given: the real and imaginary parts of the `n / 2 + 1` bins.
pub(super) fn rfft(signal: MlxTensor, dim: usize, n: Option<usize>) -> (MlxTensor, MlxTensor) {
    let (re, im) = run_many("rfft", &[&signal], || {
        let dtype = signal.array.dtype();
        let spectrum = mlx_rs::fft::rfft(to_f32(&signal.array)?, n.map(|n| n as i32), dim as i32)?;
        Ok((
            to_dtype(spectrum.real()?, dtype)?,
            to_dtype(spectrum.imag()?, dtype)?,
        ))
    });
    (signal.with(re), signal.with(im))
}

/// The inverse real FFT along `dim` of the spectrum `re + i·im`, with `n` output samples
/// (`2 * (bins - 1)` when `n` is not given).
pub(super) fn irfft(
    spectrum_re: MlxTensor,
    spectrum_im: MlxTensor,
    dim: usize,
    n: Option<usize>,
) -> MlxTensor {
    let out = run_many("irfft", &[&spectrum_re, &spectrum_im], || {
        let dtype = spectrum_re.array.dtype();
        let re = to_f32(&spectrum_re.array)?.as_dtype(Dtype::Complex64)?;
        let im = to_f32(&spectrum_im.array)?.as_dtype(Dtype::Complex64)?;
        let i = Array::from_complex(complex64::new(0.0, 1.0));
        let spectrum = re.add(im.multiply(&i)?)?;
        let signal = mlx_rs::fft::irfft(&spectrum, n.map(|n| n as i32), dim as i32)?;
        to_dtype(signal, dtype)
    });
    spectrum_re.with(out)
}
