//! Starting `n` ranks of a program on this machine, the way `mlx.launch` does: for MLX's ring
//! backend, [`launch`] writes a hostfile with free loopback ports and starts each rank with
//! `MLX_RANK` and `MLX_HOSTFILE` set; for NCCL ([`LaunchOptions::nccl`]), one rank per GPU, it
//! sets `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP` (loopback), `NCCL_PORT` (a free port) and
//! `CUDA_VISIBLE_DEVICES` (rank r gets the r-th GPU: the r-th entry of the launcher's own
//! `CUDA_VISIBLE_DEVICES` when that is set, else GPU r). Either way it forwards each rank's
//! output with a `[rank r]` prefix, stops the other ranks when one fails, and bounds the whole
//! run in time. The `mlx_launch` program (crates/burn-mlx-distributed) is its
//! command line:
//!
//! ```text
//! cargo run --release -p burn-mlx-distributed --bin mlx_launch -- -n 2 target/release/train_distributed
//! cargo run --release -p burn-mlx-distributed --features cuda --bin mlx_launch -- -n 2 --backend nccl \
//!     target/release/train_distributed --backend nccl --device gpu
//! ```
//!
//! # Several machines
//!
//! The launcher starts local ranks only. On several machines, start one process per rank
//! yourself (ssh, a job scheduler) with the environment MLX reads:
//!
//! - **ring** (TCP, every MLX build): `MLX_RANK=r` and `MLX_HOSTFILE=path` on each machine,
//!   the same hostfile everywhere, listing for each rank the IPv4 addresses and ports it
//!   listens on ([`Hostfile::for_hosts`](super::Hostfile::for_hosts) writes one:
//!   `[["10.0.0.1:5000"], ["10.0.0.2:5000"]]`). Rank `r` connects to rank `r + 1`, so each
//!   rank's ports must be reachable from the previous rank. `MLX_RING_VERBOSE=1` logs the
//!   connections. Several addresses per rank (several network interfaces, or several ports)
//!   give parallel connections.
//! - **NCCL** (MLX's CUDA build, one GPU per rank): `MLX_RANK=r`, `MLX_WORLD_SIZE=n`,
//!   `NCCL_HOST_IP` (an IP address of rank 0 that every rank reaches), `NCCL_PORT` (a free port
//!   there), and `CUDA_VISIBLE_DEVICES` to give each rank of a machine its own GPU;
//!   `NCCL_DEBUG=INFO` logs NCCL's set-up. `mlx.launch --backend nccl` sets the same variables.
//! - **MPI**: start the program with `mpirun` (MLX loads `libmpi` at run time; `MLX_MPI_LIBNAME`
//!   names the library when it is not `libmpi.so`).

use super::{DistributedError, Hostfile};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to start and how (see [`launch`]).
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The number of ranks.
    pub ranks: usize,
    /// The program each rank runs.
    pub program: PathBuf,
    /// Its arguments (the same for every rank; each reads its rank from `MLX_RANK`).
    pub args: Vec<OsString>,
    /// Extra environment variables for every rank.
    pub env: Vec<(OsString, OsString)>,
    /// TCP connections between neighbouring ranks (loopback ports per rank).
    pub connections: usize,
    /// The longest the whole run may take; then every rank is killed.
    pub timeout: Option<Duration>,
    /// After a rank fails, how long the others get to end by themselves (and report their own
    /// errors) before they are killed.
    pub grace: Duration,
    /// Print each rank's output, prefixed with `[rank r]`, as it comes.
    pub forward_output: bool,
    /// Set `MLX_RING_VERBOSE=1` (MLX logs its connections) and print the hostfile; with
    /// [`nccl`](Self::nccl), set `NCCL_DEBUG=INFO` instead.
    pub verbose: bool,
    /// Set NCCL's variables (one GPU per rank, rendezvous on loopback) instead of writing a
    /// hostfile for the ring backend (see the [module docs](self)).
    pub nccl: bool,
}

impl LaunchOptions {
    /// `ranks` copies of `program` with `args`: one connection per neighbour, no overall
    /// timeout, 10 s of grace after a failure, output forwarded.
    pub fn new(
        ranks: usize,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        LaunchOptions {
            ranks,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            connections: 1,
            timeout: None,
            grace: Duration::from_secs(10),
            forward_output: true,
            verbose: false,
            nccl: false,
        }
    }
}

/// How one rank ended.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// Its exit status (`None` if it could not be read).
    pub status: Option<ExitStatus>,
    /// Whether the launcher killed it (after another rank failed, or at the timeout).
    pub killed: bool,
    /// Seconds from the start of the run to its end.
    pub seconds: f64,
    /// Its standard output, line by line.
    pub stdout: Vec<String>,
    /// Its standard error, line by line.
    pub stderr: Vec<String>,
}

impl RankOutcome {
    /// Whether the rank ended by itself with status 0.
    pub fn success(&self) -> bool {
        !self.killed && self.status.is_some_and(|s| s.success())
    }

    /// Its standard output and error, one text.
    pub fn output(&self) -> String {
        let mut text = self.stdout.join("\n");
        text.push('\n');
        text.push_str(&self.stderr.join("\n"));
        text
    }
}

/// How a launch ended.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// Every rank's outcome, in rank order.
    pub ranks: Vec<RankOutcome>,
    /// The rank whose failure the launcher noticed first, if any failed by itself (ranks that
    /// end within the same 20 ms poll are taken in rank order).
    pub first_failure: Option<usize>,
    /// Whether the overall timeout ended the run.
    pub timed_out: bool,
    /// Seconds the whole run took.
    pub seconds: f64,
}

impl LaunchReport {
    /// Whether every rank ended by itself with status 0.
    pub fn success(&self) -> bool {
        self.ranks.iter().all(RankOutcome::success)
    }

    /// A one-line summary per rank.
    pub fn summary(&self) -> String {
        self.ranks
            .iter()
            .map(|r| {
                let how = match (r.killed, r.status) {
                    (true, _) => "killed by the launcher".to_string(),
                    (false, Some(s)) => describe_status(s),
                    (false, None) => "status unknown".to_string(),
                };
                format!("rank {}: {how} after {:.1} s", r.rank, r.seconds)
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// "exit code 3" / "killed by signal 9".
fn describe_status(s: ExitStatus) -> String {
    if let Some(code) = s.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = s.signal() {
            return format!("killed by signal {signal}");
        }
    }
    format!("{s}")
}

/// The running ranks; dropping it kills those still running, so no rank outlives the launcher
/// (a panic included).
struct Ranks {
    children: Vec<Option<Child>>,
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            kill_tree(child);
            let _ = child.wait();
        }
    }
}

/// Kills a rank and, on Linux, the processes it started (a rank run through `sh -c` or a
/// wrapper script would otherwise leave its real program running). The ranks stay in the
/// launcher's process group, so that Ctrl-C in a terminal still reaches all of them.
fn kill_tree(child: &mut Child) {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn kill(pid: i32, signal: i32) -> i32;
        }
        /// The children of `pid`, then theirs, from /proc.
        fn descendants(pid: u32, out: &mut Vec<u32>) {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                return;
            };
            for task in tasks.flatten() {
                let children = std::fs::read_to_string(task.path().join("children"));
                for c in children.iter().flat_map(|t| t.split_whitespace()) {
                    if let Ok(c) = c.parse::<u32>() {
                        out.push(c);
                        descendants(c, out);
                    }
                }
            }
        }
        let mut tree = Vec::new();
        descendants(child.id(), &mut tree);
        let _ = child.kill();
        for pid in tree {
            // SAFETY: sends SIGKILL to a process this rank started; no memory is involved.
            unsafe {
                kill(pid as i32, 9);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = child.kill();
    }
}

/// Reads `stream` line by line into `lines`, printing each with `prefix` when `forward`.
fn pump(
    stream: impl Read + Send + 'static,
    prefix: String,
    to_stderr: bool,
    forward: bool,
    lines: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    if forward {
                        if to_stderr {
                            let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
                        } else {
                            let _ = writeln!(std::io::stdout().lock(), "{prefix}{line}");
                        }
                    }
                    lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            }
        }
    })
}

/// A loopback port that is free now (for NCCL's rendezvous, which rank 0 opens).
fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

/// The launcher's own `CUDA_VISIBLE_DEVICES`, split at commas, when it names any GPU.
fn visible_gpus() -> Option<Vec<String>> {
    let list = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let gpus: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_string)
        .collect();
    (!gpus.is_empty()).then_some(gpus)
}

/// A hostfile path in the temporary folder, unique to this launch.
fn hostfile_path() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!(
        "burn-mlx-hostfile-{}-{nanos}-{}.json",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Removes the hostfile when the launch ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Starts `options.ranks` ranks of the program on this machine and supervises them until all
/// have ended (see the [module docs](self)). Returns an error only when the ranks could not be
/// started; how they ended is in the report.
pub fn launch(options: &LaunchOptions) -> Result<LaunchReport, DistributedError> {
    let n = options.ranks;
    if n == 0 {
        return Err(DistributedError::Launch {
            message: "0 ranks asked for; give -n 1 or more".into(),
        });
    }
    let hostfile = TempFile(hostfile_path());
    let nccl_port = if options.nccl {
        Some(free_port().map_err(|e| DistributedError::Launch {
            message: format!("could not find a free loopback port for NCCL: {e}"),
        })?)
    } else {
        None
    };
    let gpus = visible_gpus();
    if n > 1 && !options.nccl {
        let hosts =
            Hostfile::local(n, options.connections).map_err(|e| DistributedError::Launch {
                message: format!("could not find free loopback ports: {e}"),
            })?;
        hosts
            .write(&hostfile.0)
            .map_err(|e| DistributedError::Launch {
                message: format!("could not write the hostfile {}: {e}", hostfile.0.display()),
            })?;
        if options.verbose {
            eprintln!(
                "[launch] hostfile {}:\n{}",
                hostfile.0.display(),
                hosts.to_json()
            );
        }
    }
    let start = Instant::now();
    let mut ranks = Ranks {
        children: Vec::with_capacity(n),
    };
    let mut pumps = Vec::new();
    let mut outputs = Vec::new();
    for rank in 0..n {
        let mut cmd = Command::new(&options.program);
        cmd.args(&options.args)
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(port) = nccl_port {
            let gpu = gpus
                .as_ref()
                .map_or_else(|| rank.to_string(), |g| g[rank % g.len()].clone());
            cmd.env("MLX_RANK", rank.to_string())
                .env("MLX_WORLD_SIZE", n.to_string())
                .env("NCCL_HOST_IP", "127.0.0.1")
                .env("NCCL_PORT", port.to_string())
                .env("CUDA_VISIBLE_DEVICES", gpu)
                .env_remove("MLX_HOSTFILE");
        } else if n > 1 {
            cmd.env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile.0);
        } else {
            cmd.env_remove("MLX_RANK").env_remove("MLX_HOSTFILE");
        }
        if options.verbose {
            cmd.env(
                if options.nccl {
                    "NCCL_DEBUG"
                } else {
                    "MLX_RING_VERBOSE"
                },
                if options.nccl { "INFO" } else { "1" },
            );
        }
        let mut child = cmd.spawn().map_err(|e| DistributedError::Launch {
            message: format!(
                "could not start rank {rank} ({}): {e}",
                display_command(&options.program, &options.args)
            ),
        })?;
        let (out, err) = (
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
        );
        let prefix = format!("[rank {rank}] ");
        if let Some(s) = child.stdout.take() {
            pumps.push(pump(
                s,
                prefix.clone(),
                false,
                options.forward_output,
                out.clone(),
            ));
        }
        if let Some(s) = child.stderr.take() {
            pumps.push(pump(s, prefix, true, options.forward_output, err.clone()));
        }
        outputs.push((out, err));
        ranks.children.push(Some(child));
    }

    let mut status: Vec<Option<ExitStatus>> = vec![None; n];
    let mut ended: Vec<Option<f64>> = vec![None; n];
    let mut killed = vec![false; n];
    let mut first_failure = None;
    let mut failed_at: Option<Instant> = None;
    let mut timed_out = false;
    while ended.iter().any(Option::is_none) {
        for rank in 0..n {
            if ended[rank].is_some() {
                continue;
            }
            let Some(child) = ranks.children[rank].as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(Some(s)) => {
                    status[rank] = Some(s);
                    ended[rank] = Some(start.elapsed().as_secs_f64());
                    ranks.children[rank] = None;
                    if !s.success() && first_failure.is_none() && !killed[rank] {
                        first_failure = Some(rank);
                        failed_at = Some(Instant::now());
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    ended[rank] = Some(start.elapsed().as_secs_f64());
                    ranks.children[rank] = None;
                }
            }
        }
        let overdue = options.timeout.is_some_and(|t| start.elapsed() > t);
        let grace_over = failed_at.is_some_and(|t| t.elapsed() > options.grace);
        if overdue || grace_over {
            timed_out |= overdue;
            for (rank, (slot, killed)) in ranks.children.iter_mut().zip(&mut killed).enumerate() {
                if *killed {
                    continue;
                }
                if let Some(child) = slot.as_mut() {
                    kill_tree(child);
                    *killed = true;
                    if let Some(culprit) = first_failure {
                        eprintln!(
                            "[launch] killed rank {rank}: rank {culprit} failed {:.1} s before",
                            options.grace.as_secs_f64()
                        );
                    } else {
                        eprintln!(
                            "[launch] killed rank {rank}: the run passed its timeout of {:.1} s",
                            options.timeout.unwrap_or_default().as_secs_f64()
                        );
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(ranks);
    for p in pumps {
        let _ = p.join();
    }
    let take = |lines: &Arc<Mutex<Vec<String>>>| {
        std::mem::take(&mut *lines.lock().unwrap_or_else(|p| p.into_inner()))
    };
    let ranks = (0..n)
        .map(|rank| RankOutcome {
            rank,
            status: status[rank],
            killed: killed[rank],
            seconds: ended[rank].unwrap_or_else(|| start.elapsed().as_secs_f64()),
            stdout: take(&outputs[rank].0),
            stderr: take(&outputs[rank].1),
        })
        .collect();
    Ok(LaunchReport {
        ranks,
        first_failure,
        timed_out,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// `program arg arg` for messages.
fn display_command(program: &Path, args: &[OsString]) -> String {
    std::iter::once(program.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}
