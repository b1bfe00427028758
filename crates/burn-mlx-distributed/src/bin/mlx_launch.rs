//! `mlx_launch`: starts `n` ranks of a program on this machine for MLX's ring backend or for
//! NCCL (one GPU per rank), like MLX's `mlx.launch` (see `burn_mlx::distributed::launch`).
//!
//! ```text
//! cargo build --release -p burn-mlx-distributed --bin train_distributed
//! cargo run --release -p burn-mlx-distributed --bin mlx_launch -- -n 2 target/release/train_distributed
//! cargo run --release -p burn-mlx-distributed --features cuda --bin mlx_launch -- -n 2 --backend nccl \
//!     target/release/train_distributed --backend nccl --device gpu
//! ```
//!
//! For the ring backend it writes a hostfile with free loopback ports and starts each rank with
//! `MLX_RANK` and `MLX_HOSTFILE` set; for NCCL it sets `MLX_RANK`, `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP`, `NCCL_PORT` and `CUDA_VISIBLE_DEVICES` (rank r on GPU r). It prefixes each output line with `[rank r]`, and when a rank fails, gives
//! the others `--grace` seconds to end by themselves and then kills them. It exits with the
//! failed rank's status (1 if it was killed by a signal).
//!
//! For several machines, `--hosts 10.0.0.1,10.0.0.2` prints the hostfile and the command to
//! start on each machine, instead of launching (see the module docs of
//! `burn_mlx::distributed::launch` for NCCL and MPI).

use burn_mlx::distributed::launch::{launch, LaunchOptions};
use burn_mlx::distributed::Hostfile;
use clap::Parser;
use std::net::Ipv4Addr;
use std::time::Duration;

/// Start N local ranks of a program for MLX's ring backend or NCCL.
#[derive(Parser, Debug)]
#[command(name = "mlx_launch", trailing_var_arg = true)]
struct Args {
    /// Number of ranks.
    #[arg(short = 'n', long, default_value_t = 2)]
    ranks: usize,
    /// TCP connections between neighbouring ranks.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Kill every rank after this many seconds (0: no limit).
    #[arg(long, default_value_t = 0.0)]
    timeout: f64,
    /// Seconds the other ranks get to end by themselves after one fails.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// Extra environment variable for every rank, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Print the hostfile and let MLX log its connections (MLX_RING_VERBOSE=1); with
    /// `--backend nccl`, NCCL_DEBUG=INFO.
    #[arg(short, long)]
    verbose: bool,
    /// The variables to set: `ring` (a hostfile) or `nccl` (one GPU per rank).
    #[arg(long, default_value = "ring", value_parser = ["ring", "nccl"])]
    backend: String,
    /// Instead of launching: print a hostfile for one rank per IPv4 address (comma-separated)
    /// and the command to start on each machine.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<Ipv4Addr>,
    /// First port of each rank in the printed hostfile (with --hosts).
    #[arg(long, default_value_t = 5000)]
    port: u16,
    /// The program and its arguments.
    #[arg(required_unless_present = "hosts")]
    command: Vec<String>,
}

fn main() {
    let args = Args::parse();
    if !args.hosts.is_empty() {
        print_multi_host(&args);
        return;
    }
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut options = LaunchOptions::new(args.ranks, program, rest);
    options.connections = args.connections;
    options.timeout = (args.timeout > 0.0).then(|| Duration::from_secs_f64(args.timeout));
    options.grace = Duration::from_secs_f64(args.grace.max(0.0));
    options.verbose = args.verbose;
    options.nccl = args.backend == "nccl";
    for kv in &args.env {
        let Some((k, v)) = kv.split_once('=') else {
            eprintln!("mlx_launch: --env {kv:?} is not KEY=VALUE");
            std::process::exit(2);
        };
        options.env.push((k.into(), v.into()));
    }
    let report = match launch(&options) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("mlx_launch: {e}");
            std::process::exit(1);
        }
    };
    if report.success() {
        eprintln!(
            "[launch] all {} ranks succeeded in {:.1} s",
            args.ranks, report.seconds
        );
        return;
    }
    eprintln!("[launch] failed:\n{}", report.summary());
    let code = report
        .first_failure
        .or_else(|| report.ranks.iter().position(|r| !r.success()))
        .and_then(|r| report.ranks[r].status)
        .and_then(|s| s.code())
        .filter(|&c| c != 0)
        .unwrap_or(1);
    std::process::exit(code);
}

/// Prints the hostfile for several machines and what to run on each.
fn print_multi_host(args: &Args) {
    let hostfile = Hostfile::for_hosts(&args.hosts, args.port, args.connections);
    let program = if args.command.is_empty() {
        "<program>".to_string()
    } else {
        args.command.join(" ")
    };
    println!("# Save as hostfile.json on every machine (the same file everywhere):");
    print!("{}", hostfile.to_json());
    println!("\n# Then start, on each machine:");
    for (rank, ip) in args.hosts.iter().enumerate() {
        println!("#   on {ip}:  MLX_RANK={rank} MLX_HOSTFILE=hostfile.json {program}");
    }
    println!(
        "# Rank r connects to rank r + 1 (mod {}), so each rank's ports ({}..) must be open to the \
         previous rank. MLX_RING_VERBOSE=1 logs the connections.",
        args.hosts.len(),
        args.port
    );
}
