//! The [`Mlx`] backend type.

/// Burn's backend over MLX: `type B = Mlx;`, or `Autodiff<Mlx>` for training.
///
/// Floats default to f32 and integers to i64; Burn's `set_default_dtypes` selects others.
#[derive(Clone, Copy, Default, Debug)]
pub struct Mlx;
