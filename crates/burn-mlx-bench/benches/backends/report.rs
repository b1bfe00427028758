//! The report of the benchmark run: `BENCHMARKS.md` at the repository root.
//!
//! The bench binary (`main.rs`) runs every workload through criterion; this module then reads
//! criterion's estimates (`<criterion dir>/<workload>/<backend>/new/estimates.json`, the median's
//! point estimate in nanoseconds), writes the table and the notes, keeps everything of the old
//! `BENCHMARKS.md` below [`HAND_KEPT`] as it is (`scripts/benchmarks_md.py` generates that part
//! from `benches/*.md`), and has [`plot`](super::plot) draw `benches/plot.svg`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The line of `BENCHMARKS.md` below which a run changes nothing: the records measured by other
/// commands, which `scripts/benchmarks_md.py` generates from `benches/*.md`.
pub const HAND_KEPT: &str = "<!-- cargo bench rewrites only what is above this line; \
                             scripts/benchmarks_md.py generates what is below it. -->";

/// The implementations compared, as `(criterion function id, column title)`, `Mlx` first.
/// `mlx-compiled` is Burn on `Mlx` with the workload's function compiled by
/// `burn_mlx::compile_float` (opt-in; only elementwise workloads have it).
pub const BACKENDS: [(&str, &str); 6] = [
    ("mlx", "Burn + Mlx"),
    ("mlx-compiled", "Burn + Mlx, compiled"),
    ("ndarray", "Burn + NdArray"),
    ("flex", "Burn + Flex"),
    ("candle", "Burn + Candle"),
    ("mlx-rs", "raw mlx-rs"),
];

/// How many implementations a workload can have.
const N: usize = BACKENDS.len();

/// The median times of one workload, in seconds, in the order of [`BACKENDS`] (`None`: not run).
pub type Medians = [Option<f64>; N];

/// The Burn peers `Mlx` is compared against (raw mlx-rs is the overhead bound, not a peer).
pub const PEERS: [&str; 3] = ["ndarray", "flex", "candle"];

/// One benchmarked workload: its criterion group id and its human-readable name.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Criterion group id (also the directory name under the criterion output directory).
    pub id: String,
    /// Name shown in the report.
    pub label: String,
    /// Whether it is a training step (reported against the fastest peer).
    pub training: bool,
}

/// Why an implementation has no number for a workload (shown as "n/a" with this reason).
#[derive(Clone, Debug)]
pub struct NotApplicable {
    /// Criterion group id of the workload.
    pub workload: String,
    /// Criterion function id of the backend.
    pub backend: String,
    /// The reason, e.g. the panic message of the backend's first run.
    pub reason: String,
}

/// Facts about the run that the report states.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// Wall-clock seconds of the whole run.
    pub total_secs: f64,
    /// `/proc/loadavg`'s 1-minute load when the run started.
    pub load_at_start: String,
}

/// Median time in seconds of `backend` on `workload`, from criterion's `estimates.json`.
pub fn median_secs(criterion_dir: &Path, workload: &str, backend: &str) -> Option<f64> {
    let path = criterion_dir
        .join(workload)
        .join(backend)
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let median = &text[text.find("\"median\"")?..];
    let key = "\"point_estimate\":";
    let rest = &median[median.find(key)? + key.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse::<f64>().ok().map(|ns| ns * 1e-9)
}

/// Formats seconds with a unit that keeps 3–4 significant digits.
pub fn fmt_secs(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn ram_gib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / (1024.0 * 1024.0))
}

fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown date".into())
}

/// All medians: `times[w][b]` for workload `w` and backend `BACKENDS[b]`.
fn collect(criterion_dir: &Path, workloads: &[Workload]) -> Vec<Medians> {
    workloads
        .iter()
        .map(|w| {
            let mut row = [None; N];
            for (b, (id, _)) in BACKENDS.iter().enumerate() {
                row[b] = median_secs(criterion_dir, &w.id, id);
            }
            row
        })
        .collect()
}

/// Writes `<root>/BENCHMARKS.md` and `<root>/benches/plot.svg` from criterion's estimates.
/// Returns the two paths.
pub fn write_report(
    root: &Path,
    criterion_dir: &Path,
    workloads: &[Workload],
    not_applicable: &[NotApplicable],
    info: &RunInfo,
) -> std::io::Result<(PathBuf, PathBuf)> {
    let times = collect(criterion_dir, workloads);
    let na = |w: &str, b: &str| {
        not_applicable
            .iter()
            .find(|n| n.workload == w && n.backend == b)
    };
    let mut md = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let ram = ram_gib().map_or("unknown RAM".into(), |g| format!("{g:.0} GiB RAM"));
    writeln!(md, "# Benchmarks\n").unwrap();
    writeln!(
        md,
        "Written by `cargo bench` (the bench target `backends`, see `crates/burn-mlx-bench/benches/backends/main.rs`; \
         `cargo bench -- <filter>` runs only the benchmarks whose id `workload/backend` \
         matches, and does not rewrite this file). Each \
         number is criterion's median time per run. A run ends when the result is computed: \
         MLX evaluates its lazy graph, and every other backend reads its result back. A cell's \
         ratio is that implementation's time divided by Burn on `Mlx`'s, so above 1.00x means \
         `Mlx` is faster. For raw mlx-rs (the same MLX work written directly against mlx-rs, \
         without Burn) a ratio below 1.00x is Burn's overhead. \"Burn + Mlx, compiled\" is \
         the same Burn code passed through `burn_mlx::compile_float` (opt-in MLX compilation, \
         which fuses elementwise chains); below 1.00x means compiling pays. \"-\" means the workload has no \
         such implementation here; \"n/a\" means the backend cannot run it (reason below the \
         table).\n"
    )
    .unwrap();
    writeln!(
        md,
        "Machine: {}, {cores} cores, {ram}, Linux, MLX on its CPU backend. Load average at the \
         start of the run: {}. Date: {}. Total run time: {:.1} min.\n",
        cpu_model(),
        info.load_at_start,
        today(),
        info.total_secs / 60.0
    )
    .unwrap();
    writeln!(
        md,
        "Versions: burn 0.21.0 (burn-ndarray, burn-flex, burn-candle 0.21.0, all on CPU), \
         mlx-rs 0.33.0, MLX 0.32.4, criterion 0.5.\n"
    )
    .unwrap();
    md.push_str("| workload |");
    for (_, title) in BACKENDS {
        write!(md, " {title} |").unwrap();
    }
    md.push_str("\n|---|");
    for _ in BACKENDS {
        md.push_str("---:|");
    }
    md.push('\n');
    let mut notes = Vec::new();
    for (w, row) in workloads.iter().zip(&times) {
        write!(md, "| {} |", w.label).unwrap();
        for (b, (id, _)) in BACKENDS.iter().enumerate() {
            let cell = match (row[b], row[0]) {
                (Some(t), _) if b == 0 => fmt_secs(t),
                (Some(t), Some(m)) => format!("{} ({:.2}x)", fmt_secs(t), t / m),
                (Some(t), None) => fmt_secs(t),
                (None, _) => match na(&w.id, id) {
                    Some(n) => {
                        notes.push(format!("- {} on {}: {}", w.label, BACKENDS[b].1, n.reason));
                        format!("n/a [{}]", notes.len())
                    }
                    None => "-".into(),
                },
            };
            write!(md, " {cell} |").unwrap();
        }
        md.push('\n');
    }
    if !notes.is_empty() {
        md.push_str("\nn/a reasons (the backend's first run of the workload panicked):\n\n");
        for (i, n) in notes.iter().enumerate() {
            writeln!(md, "{}. {}", i + 1, n.trim_start_matches("- ")).unwrap();
        }
    }
    md.push_str("\n## Training steps against the fastest peer\n\n");
    for (w, row) in workloads.iter().zip(&times) {
        if !w.training {
            continue;
        }
        let Some(m) = row[0] else {
            writeln!(md, "- {}: no Mlx measurement.", w.label).unwrap();
            continue;
        };
        let fastest = PEERS
            .iter()
            .filter_map(|p| {
                let b = BACKENDS.iter().position(|(id, _)| id == p)?;
                row[b].map(|t| (BACKENDS[b].1, t))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match fastest {
            Some((name, t)) if t > m => writeln!(
                md,
                "- {}: Mlx ({}) **beats** the fastest peer, {name} ({}), by {:.2}x.",
                w.label,
                fmt_secs(m),
                fmt_secs(t),
                t / m
            ),
            Some((name, t)) => writeln!(
                md,
                "- {}: Mlx ({}) does **not** beat the fastest peer, {name} ({}): {:.2}x.",
                w.label,
                fmt_secs(m),
                fmt_secs(t),
                t / m
            ),
            None => writeln!(md, "- {}: no peer could run it.", w.label),
        }
        .unwrap();
    }
    md.push_str(
        "\n## Plot\n\nTime of each implementation divided by Burn + Mlx's, per workload, on a \
         log scale: a bar to the right of the 1x line means `Mlx` is faster.\n\n\
         ![Benchmark ratios](benches/plot.svg)\n",
    );
    md.push_str(
        "\n## Notes\n\n\
         - MLX is lazy: an op only records a graph node, and `eval` runs the graph. Each run \
         evaluates its result, so the numbers include the whole computation. The eager backends \
         compute in the op itself; reading one element of the result back makes sure they have \
         finished.\n\
         - A training step is forward, backward and an Adam update, ending with the loss read \
         back. Reading the loss evaluates this step's forward pass and, through the parameters, \
         the previous step's update, so in steady state each step is computed once.\n\
         - On this Linux machine MLX runs on its CPU backend; its Metal and CUDA backends are \
         where it is meant to be fast. Machines are noisy: compare ratios, not absolute times.\n\
         - MLX's own CPU kernels come from the `mlx-cpu` wheel, built for baseline x86-64 (no \
         AVX2, no FMA): its elementwise ops and reductions run on one thread, and its \
         transcendental functions are scalar code (`exp` calls libm's `fmaf` once per \
         polynomial term). burn-mlx runs float32 `exp`, `tanh`, `erf`, `sigmoid` and softmax on \
         the CPU through vectorized kernels of its own (`mlx-sys/fast_unary.cpp`, \
         docs/build.md), so in the elementwise-chain and softmax rows the raw mlx-rs \
         column, which calls MLX's kernels, times MLX's scalar code rather than Burn's \
         overhead. Burn's Flex backend runs ops vectorized on both cores. GEMMs go to OpenBLAS.\n",
    );
    md.push('\n');
    md.push_str(HAND_KEPT);
    md.push('\n');
    let md_path = root.join("BENCHMARKS.md");
    // The generated records below the marker survive the run unchanged; without them, the
    // report says how to add them.
    let kept = std::fs::read_to_string(&md_path)
        .ok()
        .and_then(|old| old.split_once(HAND_KEPT).map(|(_, kept)| kept.to_string()));
    match kept {
        Some(kept) => md.push_str(kept.strip_prefix('\n').unwrap_or(&kept)),
        None => md.push_str(
            "\nThe records of other commands are missing: run `python3 scripts/benchmarks_md.py`.\n",
        ),
    }
    std::fs::write(&md_path, md)?;
    let svg_path = root.join("benches").join("plot.svg");
    std::fs::write(&svg_path, super::plot::ratio_chart(workloads, &times)?)?;
    Ok((md_path, svg_path))
}
