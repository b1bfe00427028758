//! burn-ndarray keeps one random generator for the whole process, and the tests of this binary run
//! in parallel. A test that seeds it and expects the same starting weights on every run must seed
//! and draw while holding [`ndarray_rng`], and so must every other test that draws from it:
//! building a module draws its weights, and loading a record into a fresh NdArray module draws its
//! biases first (measured: one draw per bias, the generator's next values change across
//! `load_file`). Without the lock one CI run drew starting weights that no run here had seen, and
//! a run here built one test's MLP from two seeds' values.

use std::sync::{Mutex, MutexGuard};

static NDARRAY_RNG: Mutex<()> = Mutex::new(());

/// Holds burn-ndarray's random generator for the calling test until the guard is dropped.
pub fn ndarray_rng() -> MutexGuard<'static, ()> {
    NDARRAY_RNG.lock().unwrap_or_else(|e| e.into_inner())
}
