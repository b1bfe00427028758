//! The process-wide random state behind every random tensor: [`Backend::seed`] on [`Mlx`] sets
//! it, and each random op takes a fresh MLX key from it, so that a seeded program draws the same
//! values on every run and no two draws share a key.
//!
//! It is state of the backend, not of one op, so it sits below both the backend's `seed` and
//! the random ops that read it.
//!
//! [`Backend::seed`]: burn_backend::Backend::seed
//! [`Mlx`]: crate::backend::Mlx

use crate::native;
use crate::tensor::OrPanic;
use mlx_rs::{random, Array};
use std::sync::Mutex;

/// The process-wide random state: `Mlx::seed` sets it; every random tensor takes a fresh key.
static RNG: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Seeds the random state of every device.
pub(crate) fn seed(seed: u64) {
    *RNG.lock().unwrap_or_else(|p| p.into_inner()) = Some((seed, 0));
}

/// The next random key (a lazy MLX key array).
pub(crate) fn next_key() -> Array {
    native::thread_init();
    let mut state = RNG.lock().unwrap_or_else(|p| p.into_inner());
    let (seed, counter) = state.get_or_insert_with(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (now, 0)
    });
    // SplitMix64 of (seed, counter): independent, reproducible keys.
    let mut z = seed.wrapping_add(counter.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    *counter += 1;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    random::key(z).or_panic("random", &[])
}
