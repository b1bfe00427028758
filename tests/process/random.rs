//! `Backend::seed` on `Mlx`: MLX keeps one random generator for the whole process, so a seed
//! followed by draws is reproducible only while no other test draws in between.

use burn_mlx::Mlx;
use burn_tensor::backend::Backend;
use burn_tensor::{Distribution, Int, Tensor};

#[test]
fn random_seed_reproducible() {
    let _alone = crate::one_at_a_time();
    let dev = Default::default();
    let draw = || {
        (
            Tensor::<Mlx, 2>::random([16, 16], Distribution::Uniform(0.0, 1.0), &dev).into_data(),
            Tensor::<Mlx, 2>::random([16, 16], Distribution::Normal(0.0, 1.0), &dev).into_data(),
            Tensor::<Mlx, 2, Int>::random([16, 16], Distribution::Uniform(0.0, 100.0), &dev)
                .into_data(),
        )
    };
    Mlx::seed(&dev, 42);
    let a = draw();
    Mlx::seed(&dev, 42);
    let b = draw();
    Mlx::seed(&dev, 43);
    let c = draw();
    assert_eq!(a, b, "same seed must give the same values");
    assert_ne!(
        a.0, c.0,
        "different seeds should give different uniform values"
    );
    assert_ne!(
        a.1, c.1,
        "different seeds should give different normal values"
    );
    // Two draws in a row differ.
    Mlx::seed(&dev, 42);
    let d1 = Tensor::<Mlx, 1>::random([64], Distribution::Default, &dev).into_data();
    let d2 = Tensor::<Mlx, 1>::random([64], Distribution::Default, &dev).into_data();
    assert_ne!(d1, d2, "consecutive draws after one seed must differ");
}
