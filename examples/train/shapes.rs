//! The default dataset, generated here and deterministic in the seed: 28×28 images of ten kinds
//! of shapes at random positions, sizes, rotations, stroke widths and brightness, with pixel
//! noise and stray specks. It needs no files and no network.

use crate::data::{ImageItem, NUM_CLASSES, PIXELS, SIDE};

/// Added to `--seed` for the generated validation images, so they differ from the training ones.
const VALID_SEED_OFFSET: u64 = 1_000_003;
/// Names of the generated dataset's classes.
pub const SHAPE_NAMES: [&str; NUM_CLASSES] = [
    "ring",
    "disk",
    "square",
    "filled square",
    "triangle",
    "filled triangle",
    "plus",
    "cross",
    "horizontal bar",
    "vertical bar",
];

/// SplitMix64: a small, fast, deterministic generator (no dependency needed).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x853c_49e6_748f_ea9b)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.uniform()
    }
    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.uniform().max(1e-7);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }
}

/// Signed distance from `(x, y)` to a box of half extents `(hx, hy)` centred at the origin.
fn sd_box(x: f32, y: f32, hx: f32, hy: f32) -> f32 {
    let qx = x.abs() - hx;
    let qy = y.abs() - hy;
    let outside = (qx.max(0.0).powi(2) + qy.max(0.0).powi(2)).sqrt();
    outside + qx.max(qy).min(0.0)
}

/// Signed distance to an equilateral triangle of circumradius `r`, pointing up (image y down).
fn sd_triangle(x: f32, y: f32, r: f32) -> f32 {
    // Inradius is r/2; the triangle is the intersection of three half-planes.
    let y = -y;
    let n = [(0.0f32, -1.0f32), (0.866_025_4, 0.5), (-0.866_025_4, 0.5)];
    n.iter()
        .map(|(nx, ny)| x * nx + y * ny - r * 0.5)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Renders one generated image of class `label` (see [`SHAPE_NAMES`]).
pub fn render_shape(label: usize, rng: &mut Rng) -> Vec<f32> {
    let size = rng.range(5.5, 10.5);
    let margin = size + 1.5;
    let cx = rng.range(margin, SIDE as f32 - margin);
    let cy = rng.range(margin, SIDE as f32 - margin);
    let stroke = rng.range(1.2, 2.6);
    let brightness = rng.range(0.55, 1.0);
    let jitter = rng.range(-0.3, 0.3); // ±17°
    let angle = match label {
        7 => std::f32::consts::FRAC_PI_4 + jitter,
        9 => std::f32::consts::FRAC_PI_2 + jitter * 0.5,
        8 => jitter * 0.5,
        _ => jitter,
    };
    let (sin, cos) = angle.sin_cos();
    let mut img = vec![0.0f32; PIXELS];
    for py in 0..SIDE {
        for px in 0..SIDE {
            let dx = px as f32 + 0.5 - cx;
            let dy = py as f32 + 0.5 - cy;
            let (x, y) = (cos * dx + sin * dy, -sin * dx + cos * dy);
            // Signed distance (negative inside); outlines use |d| - stroke/2.
            let d = match label {
                0 => ((x * x + y * y).sqrt() - size).abs() - stroke / 2.0,
                1 => (x * x + y * y).sqrt() - size,
                2 => sd_box(x, y, size * 0.8, size * 0.8).abs() - stroke / 2.0,
                3 => sd_box(x, y, size * 0.8, size * 0.8),
                4 => sd_triangle(x, y, size * 1.1).abs() - stroke / 2.0,
                5 => sd_triangle(x, y, size * 1.1),
                6 | 7 => sd_box(x, y, size, stroke / 2.0).min(sd_box(x, y, stroke / 2.0, size)),
                8 | 9 => sd_box(x, y, size, stroke / 2.0 + 0.4),
                _ => unreachable!("label {label} out of range"),
            };
            img[py * SIDE + px] = (0.5 - d).clamp(0.0, 1.0) * brightness;
        }
    }
    // Distractors: a few small specks, then pixel noise.
    let specks = (rng.uniform() * 4.0) as usize;
    for _ in 0..specks {
        let sx = (rng.uniform() * SIDE as f32) as usize;
        let sy = (rng.uniform() * SIDE as f32) as usize;
        img[sy.min(SIDE - 1) * SIDE + sx.min(SIDE - 1)] = rng.range(0.4, 1.0);
    }
    let noise = rng.range(0.05, 0.2);
    for p in &mut img {
        *p = (*p + noise * rng.normal()).clamp(0.0, 1.0);
    }
    img
}

/// `n` generated images with balanced classes, deterministic in `seed`.
pub fn generate_shapes(n: usize, seed: u64) -> Vec<ImageItem> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|i| {
            let label = i % NUM_CLASSES;
            ImageItem {
                pixels: render_shape(label, &mut rng),
                label,
            }
        })
        .collect()
}

/// The `n` validation images of the run seeded with `seed` (another stream of the generator than
/// the training images).
pub fn generate_validation_shapes(n: usize, seed: u64) -> Vec<ImageItem> {
    generate_shapes(n, seed.wrapping_add(VALID_SEED_OFFSET))
}
