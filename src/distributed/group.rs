//! Setting a group up ([`init`], [`InitOptions`]) and the [`Group`] handle: rank, size, and the
//! watchdog that bounds every collective in time.
//!
//! # The watchdog
//!
//! MLX's ring backend fails a collective by itself when a peer's connection closes (the peer
//! exited, crashed or was killed): its socket threads see the closed connection and the
//! evaluation raises "[ring] connection to a peer was lost". A peer that is alive but stops
//! taking part (stopped, deadlocked, or calling a different number of collectives) is another
//! matter: MLX then waits forever, inside the evaluation, on the CPU stream that every other
//! evaluation of the process shares. So every collective is bounded by the group's timeout:
//!
//! - **ring** (the backend whose connections burn-mlx can find: the sockets of this process
//!   whose addresses are in the hostfile): the calling thread evaluates the collective itself,
//!   as MLX Python does, and a watchdog thread, started with the group, watches the collective
//!   in flight. It costs nothing per collective (the caller records the start in a mutex; the
//!   watchdog wakes every 250 ms, or at the deadline). When the timeout passes, the watchdog
//!   shuts this process's ring connections down: MLX's waiting evaluation then fails, lets go of
//!   the stream and the evaluation lock, and the collective fails with
//!   [`DistributedError::Timeout`]; the process can save its work or exit normally. Should MLX
//!   still not return 10 s later (never seen), the watchdog prints the error and ends the
//!   process (exit status 124), so that no rank hangs.
//! - **other backends** (NCCL, MPI, JACCL, or a ring whose sockets were not found): burn-mlx
//!   cannot close their connections, so each collective is evaluated on a helper thread and the
//!   caller waits at most the timeout; when it passes, the caller gets
//!   [`DistributedError::Timeout`] while MLX still waits, and should end the process.
//!
//! The group stays unusable ([`DistributedError::Broken`]) after any failure.
//!
//! Setting up the group is bounded the same way: a ring rank waits for its neighbour to
//! connect, and MLX would wait forever for a rank that was never started.

use super::hostfile::Hostfile;
use super::DistributedError;
use crate::device::MlxDevice;
use crate::native::distributed::{self as raw, RawGroup};
use mlx_rs::Array;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Environment variable: the default timeout of every collective, in seconds.
pub const TIMEOUT_ENV: &str = "BURN_MLX_DISTRIBUTED_TIMEOUT";
/// Environment variable: the default time [`init`] waits for the peers, in seconds.
pub const INIT_TIMEOUT_ENV: &str = "BURN_MLX_DISTRIBUTED_INIT_TIMEOUT";

/// The collective timeout when neither [`InitOptions::timeout`] nor [`TIMEOUT_ENV`] sets one.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The set-up timeout when neither [`InitOptions::init_timeout`] nor [`INIT_TIMEOUT_ENV`] sets one.
const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// MLX's communication backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommBackend {
    /// The first backend that the environment configures (NCCL on CUDA builds, then ring, MPI,
    /// JACCL), or a single-process group of size 1 when none is configured.
    Any,
    /// TCP sockets in a ring (`MLX_RANK`, `MLX_HOSTFILE`); in every MLX build.
    Ring,
    /// MPI (MLX loads `libmpi` at run time; start the ranks with `mpirun`).
    Mpi,
    /// NCCL, in MLX's CUDA build (`MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP`, `NCCL_PORT`).
    Nccl,
    /// JACCL: RDMA over Thunderbolt between Macs.
    Jaccl,
}

impl CommBackend {
    /// The name mlx-c takes (`any`, `ring`, `mpi`, `nccl`, `jaccl`).
    pub fn name(&self) -> &'static str {
        match self {
            CommBackend::Any => "any",
            CommBackend::Ring => "ring",
            CommBackend::Mpi => "mpi",
            CommBackend::Nccl => "nccl",
            CommBackend::Jaccl => "jaccl",
        }
    }

    /// Whether this MLX build contains the backend (MPI: whether MLX found `libmpi`).
    pub fn is_available(&self) -> bool {
        raw::is_available(self.name())
    }

    /// Why the backend may be missing, and what to do.
    fn missing_hint(&self) -> &'static str {
        match self {
            CommBackend::Any | CommBackend::Ring => {
                "this MLX library was built without distributed support; use the mlx-cpu or \
                 mlx-cuda wheel that burn-mlx's build fetches"
            }
            CommBackend::Mpi => {
                "MLX loads libmpi at run time: install Open MPI (libmpi.so on the library \
                 path, or MLX_MPI_LIBNAME) and start the ranks with mpirun; or use `ring`"
            }
            CommBackend::Nccl => {
                "NCCL is part of MLX's CUDA build: build burn-mlx with the `cuda` feature on a \
                 machine with NVIDIA GPUs; on the CPU use `ring`"
            }
            CommBackend::Jaccl => {
                "JACCL (RDMA over Thunderbolt) needs macOS with RDMA enabled; use `ring` \
                 elsewhere"
            }
        }
    }
}

impl FromStr for CommBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "any" => Ok(CommBackend::Any),
            "ring" => Ok(CommBackend::Ring),
            "mpi" => Ok(CommBackend::Mpi),
            "nccl" => Ok(CommBackend::Nccl),
            "jaccl" => Ok(CommBackend::Jaccl),
            other => Err(format!(
                "unknown distributed backend `{other}`: use any, ring, mpi, nccl or jaccl"
            )),
        }
    }
}

impl std::fmt::Display for CommBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to set a group up: the backend, the time allowed to connect, the timeout of each
/// collective, and whether ranks check that they agree before each collective.
///
/// ```no_run
/// use burn_mlx::distributed::{CommBackend, InitOptions};
/// use std::time::Duration;
///
/// let group = InitOptions::new(CommBackend::Ring)
///     .init_timeout(Duration::from_secs(30))
///     .timeout(Duration::from_secs(60))
///     .init()?;
/// println!("rank {} of {}", group.rank(), group.size());
/// # Ok::<(), burn_mlx::distributed::DistributedError>(())
/// ```
#[derive(Debug, Clone)]
pub struct InitOptions {
    backend: CommBackend,
    init_timeout: Duration,
    timeout: Duration,
    check: bool,
}

/// A duration in seconds from an environment variable, if it is set to a positive number.
fn env_seconds(name: &str) -> Option<Duration> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() => Some(Duration::from_secs_f64(s)),
        _ => {
            eprintln!(
                "burn-mlx: ignoring {name}={value:?} (expected a positive number of seconds)"
            );
            None
        }
    }
}

impl InitOptions {
    /// The defaults for `backend`: set-up within 120 s ([`INIT_TIMEOUT_ENV`] overrides), each
    /// collective within 300 s ([`TIMEOUT_ENV`] overrides), agreement checks on.
    pub fn new(backend: CommBackend) -> Self {
        InitOptions {
            backend,
            init_timeout: env_seconds(INIT_TIMEOUT_ENV).unwrap_or(DEFAULT_INIT_TIMEOUT),
            timeout: env_seconds(TIMEOUT_ENV).unwrap_or(DEFAULT_TIMEOUT),
            check: true,
        }
    }

    /// How long [`init`](Self::init) waits for the other ranks to connect.
    pub fn init_timeout(mut self, timeout: Duration) -> Self {
        self.init_timeout = timeout;
        self
    }

    /// How long one collective may take, waiting for the slowest rank included (see
    /// [`Group::set_timeout`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether ranks exchange a small description of each collective first (see
    /// [`Group::set_check`]).
    pub fn check(mut self, check: bool) -> Self {
        self.check = check;
        self
    }

    /// Sets the group up: checks the environment, then lets MLX connect the ranks.
    ///
    /// With [`CommBackend::Any`] and no backend configured, this is the single-process group
    /// (rank 0 of 1), on which the collectives return their input: the same program runs
    /// alone or under the launcher. A named backend that is not configured is an error.
    pub fn init(self) -> Result<Group, DistributedError> {
        let backend = self.backend;
        if backend != CommBackend::Any && !backend.is_available() {
            return Err(DistributedError::NotAvailable {
                backend: backend.name().into(),
                hint: backend.missing_hint().into(),
            });
        }
        let ring = check_environment(backend)?;
        let expected_rank = ring.as_ref().map(|r| r.rank);
        let rank_text = expected_rank.map_or_else(|| "?".to_string(), |r| r.to_string());

        let strict = backend != CommBackend::Any;
        let (tx, rx) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("burn-mlx-distributed-init".into())
            .spawn(move || {
                let _ = tx.send(raw::init(strict, backend.name()));
            });
        if let Err(e) = spawned {
            return Err(DistributedError::Init {
                backend: backend.name().into(),
                rank: rank_text,
                message: format!("could not start the set-up thread: {e}"),
                hint: "The system is out of threads or memory.".into(),
            });
        }
        let raw = match rx.recv_timeout(self.init_timeout) {
            Ok(Ok(raw)) => raw,
            Ok(Err(message)) => {
                return Err(DistributedError::Init {
                    backend: backend.name().into(),
                    rank: rank_text,
                    hint: init_hint(&message, ring.as_ref()),
                    message,
                })
            }
            Err(_) => {
                let waited = self.init_timeout.as_secs_f64();
                let (message, hint) = match &ring {
                    Some(r) => (
                        format!(
                            "rank {} of {} waited {waited:.1} s for its neighbours (rank {} to \
                             connect to {}, rank {} to accept at {})",
                            r.rank,
                            r.size,
                            r.left_rank,
                            fmt_addrs(&r.own),
                            r.right_rank,
                            fmt_addrs(&r.right)
                        ),
                        format!(
                            "Start all {} ranks with the same hostfile within the timeout \
                             (the launcher does); MLX_RING_VERBOSE=1 logs MLX's connection \
                             attempts; {INIT_TIMEOUT_ENV} or InitOptions::init_timeout gives \
                             slower starts more time",
                            r.size
                        ),
                    ),
                    None => (
                        format!("the backend did not connect within {waited:.1} s"),
                        format!(
                            "Start every rank within the timeout; {INIT_TIMEOUT_ENV} or \
                             InitOptions::init_timeout gives slower starts more time"
                        ),
                    ),
                };
                return Err(DistributedError::Init {
                    backend: backend.name().into(),
                    rank: rank_text,
                    message,
                    hint,
                });
            }
        };
        let (rank, size) = (raw.rank(), raw.size());
        if let Some(r) = &ring {
            if (rank, size) != (r.rank, r.size) {
                return Err(DistributedError::Init {
                    backend: backend.name().into(),
                    rank: rank_text,
                    message: format!(
                        "MLX set up rank {rank} of {size}, but MLX_RANK and the hostfile say rank \
                         {} of {}",
                        r.rank, r.size
                    ),
                    hint: "A group with another configuration was already set up in this \
                           process; initialise once per process"
                        .into(),
                });
            }
        }
        let backend = resolve(backend, size, ring.is_some());
        let ring = ring.filter(|_| size > 1);
        let watchdog = ring
            .as_ref()
            .and_then(|r| Watchdog::start(r.clone(), rank, size));
        Ok(Group {
            inner: Arc::new(Inner {
                raw,
                rank,
                size,
                backend,
                ring,
                watchdog,
                timeout_ms: AtomicU64::new(self.timeout.as_millis().max(1) as u64),
                check: AtomicBool::new(self.check),
                seq: AtomicU64::new(0),
                sent: (0..size).map(|_| AtomicU64::new(0)).collect(),
                received: (0..size).map(|_| AtomicU64::new(0)).collect(),
                broken: Mutex::new(None),
            }),
        })
    }
}

/// Sets up a group with the default [`InitOptions`] for `backend`.
///
/// ```no_run
/// use burn_mlx::distributed::{self, CommBackend};
///
/// // Alone: rank 0 of 1. Under `mlx_launch -n 2`: rank 0 or 1 of 2, over the ring backend.
/// let group = distributed::init(CommBackend::Any)?;
/// # Ok::<(), burn_mlx::distributed::DistributedError>(())
/// ```
pub fn init(backend: CommBackend) -> Result<Group, DistributedError> {
    InitOptions::new(backend).init()
}

/// Whether MLX has the backend (see [`CommBackend::is_available`]).
pub fn is_available(backend: CommBackend) -> bool {
    backend.is_available()
}

/// The backend MLX picked for `Any` (MLX does not say; its order is NCCL on CUDA builds when
/// NCCL's variables are set, then ring when its variables are set, then MPI).
fn resolve(asked: CommBackend, size: usize, ring_configured: bool) -> CommBackend {
    if asked != CommBackend::Any || size == 1 {
        return asked;
    }
    let nccl_configured = ["NCCL_HOST_IP", "NCCL_PORT", "MLX_WORLD_SIZE"]
        .iter()
        .all(|v| std::env::var_os(v).is_some());
    if cfg!(not(target_os = "macos"))
        && MlxDevice::gpu_available()
        && CommBackend::Nccl.is_available()
        && nccl_configured
    {
        CommBackend::Nccl
    } else if ring_configured {
        CommBackend::Ring
    } else {
        CommBackend::Mpi
    }
}

/// A ring rank's configuration, read from the environment before MLX sees it.
#[derive(Debug, Clone)]
pub(crate) struct RingConfig {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    left_rank: usize,
    right_rank: usize,
    /// The addresses this rank listens on (its left neighbour connects to them).
    own: Vec<SocketAddrV4>,
    /// The addresses of the right neighbour (this rank connects to them).
    right: Vec<SocketAddrV4>,
}

fn fmt_addrs(addrs: &[SocketAddrV4]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks the variables the backend will read and returns the ring configuration, if the ring
/// backend is the one that will be set up.
fn check_environment(backend: CommBackend) -> Result<Option<RingConfig>, DistributedError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let (hostfile, rank) = (var("MLX_HOSTFILE"), var("MLX_RANK"));
    let config = |problem: String, hint: &str| DistributedError::Config {
        backend: backend.name().into(),
        problem,
        hint: hint.into(),
    };
    let launcher_hint = "Start the ranks with the launcher (burn_mlx::distributed::launch, or \
                         `cargo run --release -p burn-mlx-distributed --bin mlx_launch -- -n 2 <program>`), which \
                         sets both; or use CommBackend::Any to run as a single process";
    match backend {
        CommBackend::Nccl => {
            let missing: Vec<&str> = ["MLX_RANK", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"]
                .into_iter()
                .filter(|n| var(n).is_none())
                .collect();
            if !missing.is_empty() {
                return Err(config(
                    format!("{} not set", missing.join(", ")),
                    "NCCL needs MLX_RANK (0..n), MLX_WORLD_SIZE (n), NCCL_HOST_IP and NCCL_PORT \
                     (an address and free port of rank 0 that every rank reaches), and one GPU \
                     per rank (CUDA_VISIBLE_DEVICES)",
                ));
            }
            Ok(None)
        }
        CommBackend::Mpi | CommBackend::Jaccl => Ok(None),
        CommBackend::Any | CommBackend::Ring => {
            let (hostfile, rank) = match (hostfile, rank) {
                (Some(h), Some(r)) => (PathBuf::from(h), r),
                (None, None) if backend == CommBackend::Any => return Ok(None),
                (h, r) => {
                    let missing: Vec<&str> = [("MLX_HOSTFILE", &h), ("MLX_RANK", &r)]
                        .into_iter()
                        .filter(|(_, v)| v.is_none())
                        .map(|(n, _)| n)
                        .collect();
                    return Err(config(
                        format!(
                            "the ring backend needs MLX_RANK and MLX_HOSTFILE, but {} {} not set",
                            missing.join(" and "),
                            if missing.len() == 1 { "is" } else { "are" }
                        ),
                        launcher_hint,
                    ));
                }
            };
            let rank_text = rank.to_string_lossy().into_owned();
            let rank: usize = rank_text.trim().parse().map_err(|_| {
                config(
                    format!("MLX_RANK={rank_text:?} is not a rank (0, 1, 2, ...)"),
                    launcher_hint,
                )
            })?;
            let hosts = Hostfile::read(&hostfile)?;
            let size = hosts.size();
            if rank >= size {
                return Err(config(
                    format!(
                        "MLX_RANK={rank} but the hostfile {} lists {size} ranks (0 to {})",
                        hostfile.display(),
                        size - 1
                    ),
                    "Give each process a rank below the number of ranks in the hostfile",
                ));
            }
            let left_rank = (rank + size - 1) % size;
            let right_rank = (rank + 1) % size;
            Ok(Some(RingConfig {
                rank,
                size,
                left_rank,
                right_rank,
                own: hosts.ranks[rank].clone(),
                right: hosts.ranks[right_rank].clone(),
            }))
        }
    }
}

/// What to do about an MLX set-up error.
fn init_hint(message: &str, ring: Option<&RingConfig>) -> String {
    match ring {
        Some(r) if message.contains("connect") => format!(
            "Rank {} did not accept connections at {}: is it running, with the same hostfile? \
             Start all {} ranks together (the launcher does); MLX_RING_VERBOSE=1 logs MLX's \
             attempts",
            r.right_rank,
            fmt_addrs(&r.right),
            r.size
        ),
        Some(r) if message.contains("bind") || message.contains("reuse") => format!(
            "This rank could not listen at {}: the port is in use or the address is not this \
             machine's; pick free ports (the launcher does)",
            fmt_addrs(&r.own)
        ),
        _ => "Check the backend's environment variables (see burn_mlx::distributed's docs)".into(),
    }
}

/// A group of processes that communicate: MLX's `Group`, with this process's rank, the group
/// size, and the settings of its collectives (timeout, agreement checks).
///
/// Cloning is cheap; clones share the group and its state. The collectives are methods (see the
/// [`distributed`](super) module).
#[derive(Clone)]
pub struct Group {
    pub(crate) inner: Arc<Inner>,
}

/// The state a group's clones share.
pub(crate) struct Inner {
    pub(crate) raw: RawGroup,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) backend: CommBackend,
    ring: Option<RingConfig>,
    /// The watchdog of a ring group whose connections were found; `None`: helper threads.
    watchdog: Option<Arc<Watchdog>>,
    timeout_ms: AtomicU64,
    check: AtomicBool,
    /// The number of collectives this rank has started (compared across ranks by the checks).
    pub(crate) seq: AtomicU64,
    /// Per peer: the messages this rank has sent to it, and received from it.
    pub(crate) sent: Vec<AtomicU64>,
    pub(crate) received: Vec<AtomicU64>,
    /// The first failure, after which the group refuses to communicate.
    broken: Mutex<Option<String>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("backend", &self.inner.backend)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("timeout", &self.timeout())
            .field("check", &self.check())
            .finish()
    }
}

impl Group {
    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of processes in the group.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The backend in use: the one asked for, or for [`CommBackend::Any`] the one MLX picked
    /// as the environment tells (NCCL when a CUDA build has NCCL's variables, else ring when
    /// `MLX_HOSTFILE` is set, else MPI); `Any` for the single-process group.
    pub fn backend(&self) -> CommBackend {
        self.inner.backend
    }

    /// The longest one collective may take, waiting for the slowest rank included.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    /// Sets the longest one collective may take, computing its inputs included (with the
    /// agreement checks on, a collective's inputs, such as a backward pass's gradients, are
    /// evaluated with its check). Set it above the longest time one rank can spend between two
    /// collectives beyond the others (an evaluation, a checkpoint, a validation pass on rank 0
    /// only): the others wait that long inside the collective.
    pub fn set_timeout(&self, timeout: Duration) {
        let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.inner.timeout_ms.store(ms, Ordering::Relaxed);
    }

    /// Whether the ranks check that they agree before each collective.
    pub fn check(&self) -> bool {
        self.inner.check.load(Ordering::Relaxed)
    }

    /// Turns the agreement checks on or off (the same on every rank).
    ///
    /// With checks on (the default), each collective is preceded by an all-gather of 96 bytes
    /// describing it (which collective, how many this rank has run, dtype and shape), and
    /// send/recv by a 96-byte header, so that ranks that call different collectives, or pass
    /// different shapes, fail with [`DistributedError::Mismatch`] naming what each rank passed,
    /// instead of waiting or exchanging garbage. Off saves one small message per collective.
    pub fn set_check(&self, check: bool) {
        self.inner.check.store(check, Ordering::Relaxed);
    }

    /// The failure that made the group unusable, if any.
    pub fn failure(&self) -> Option<String> {
        self.inner
            .broken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the first failure; later collectives are refused.
    pub(crate) fn mark_broken(&self, cause: &DistributedError) {
        let mut broken = self.inner.broken.lock().unwrap_or_else(|p| p.into_inner());
        if broken.is_none() {
            *broken = Some(cause.to_string());
        }
    }

    /// Refuses `op` when the group is unusable.
    pub(crate) fn ensure_usable(&self, op: &str) -> Result<(), DistributedError> {
        match self.failure() {
            None => Ok(()),
            Some(cause) => Err(DistributedError::Broken {
                op: op.into(),
                rank: self.rank(),
                size: self.size(),
                cause,
            }),
        }
    }

    /// The device whose stream runs this group's communication: the CPU for ring, MPI and
    /// JACCL, the GPU for NCCL, whatever device the tensors are on (NCCL communicates only from
    /// GPU streams; MLX's CPU evaluation of a collective would hand NCCL a CPU stream).
    pub(crate) fn comm_device(&self) -> MlxDevice {
        match self.inner.backend {
            CommBackend::Nccl => MlxDevice::Gpu,
            _ => MlxDevice::Cpu,
        }
    }

    /// Evaluates the collective `arrays`, bounded by the group's timeout (see the module docs):
    /// on this thread under the watchdog for a ring group, else on a helper thread. Whatever
    /// `arrays` still has to compute is timed too (the agreement check evaluates the
    /// collective's inputs with it).
    pub(crate) fn guarded_eval(
        &self,
        op: &str,
        shapes: &str,
        arrays: Vec<Array>,
        device: MlxDevice,
    ) -> Result<Vec<Array>, DistributedError> {
        self.ensure_usable(op)?;
        crate::trace::check_not_tracing(op).map_err(|e| self.failed(op, shapes, e.to_string()))?;
        match &self.inner.watchdog {
            Some(dog) => self.watched_eval(dog, op, shapes, arrays, device),
            None => self.helper_eval(op, shapes, arrays, device),
        }
    }

    /// Evaluates `arrays` on this thread while the watchdog watches.
    fn watched_eval(
        &self,
        dog: &Watchdog,
        op: &str,
        shapes: &str,
        arrays: Vec<Array>,
        device: MlxDevice,
    ) -> Result<Vec<Array>, DistributedError> {
        let timeout = self.timeout();
        let started = Instant::now();
        let id = dog.begin(started, timeout);
        let result = locked_eval(&arrays, device);
        let closed = dog.end(id);
        match (result, closed) {
            (Ok(()), None) => Ok(arrays),
            (_, Some(closed)) => Err(self.timed_out(op, shapes, started, released_hint(closed))),
            (Err(message), None) => Err(self.eval_failed(op, shapes, message)),
        }
    }

    /// Evaluates `arrays` on a helper thread, waiting at most the group's timeout.
    fn helper_eval(
        &self,
        op: &str,
        shapes: &str,
        arrays: Vec<Array>,
        device: MlxDevice,
    ) -> Result<Vec<Array>, DistributedError> {
        let timeout = self.timeout();
        let (tx, rx) = mpsc::channel::<(Result<(), String>, Vec<Array>)>();
        let spawned = std::thread::Builder::new()
            .name(format!("burn-mlx-{op}"))
            .spawn(move || {
                let result = locked_eval(&arrays, device);
                let _ = tx.send((result, arrays));
            });
        if let Err(e) = spawned {
            return Err(self.failed(op, shapes, format!("could not start a thread: {e}")));
        }
        let started = Instant::now();
        match rx.recv_timeout(timeout) {
            Ok((Ok(()), arrays)) => Ok(arrays),
            Ok((Err(message), _)) => Err(self.eval_failed(op, shapes, message)),
            Err(_) => {
                let closed = self.abort_connections();
                // Once the connections are closed, MLX's evaluation fails within milliseconds
                // and lets go of the stream; wait for that so the process can go on.
                let released = closed > 0 && rx.recv_timeout(RELEASE_WAIT).is_ok();
                let hint = if released {
                    released_hint(closed)
                } else {
                    format!(
                        "MLX is still waiting inside the collective and holds burn-mlx's \
                         evaluation lock, so end this process now (std::process::exit). If a rank \
                         is legitimately this slow, raise the timeout (Group::set_timeout, \
                         {TIMEOUT_ENV})"
                    )
                };
                Err(self.timed_out(op, shapes, started, hint))
            }
        }
    }

    /// The error of a collective that passed the group's timeout (started at `started`); the
    /// group is marked unusable.
    fn timed_out(
        &self,
        op: &str,
        shapes: &str,
        started: Instant,
        hint: String,
    ) -> DistributedError {
        let e = DistributedError::Timeout {
            op: op.into(),
            rank: self.rank(),
            size: self.size(),
            shapes: shapes.into(),
            seconds: started.elapsed().as_secs_f64(),
            hint,
        };
        self.mark_broken(&e);
        e
    }

    /// The error of a collective whose evaluation MLX failed (a lost peer, or another error);
    /// the group is marked unusable.
    fn eval_failed(&self, op: &str, shapes: &str, message: String) -> DistributedError {
        let e = if message.contains("connection to a peer was lost") {
            DistributedError::PeerLost {
                op: op.into(),
                rank: self.rank(),
                size: self.size(),
                shapes: shapes.into(),
                message,
            }
        } else {
            self.failed(op, shapes, message)
        };
        self.mark_broken(&e);
        e
    }

    /// A [`DistributedError::Collective`] for `op`.
    pub(crate) fn failed(&self, op: &str, shapes: &str, message: String) -> DistributedError {
        DistributedError::Collective {
            op: op.into(),
            rank: self.rank(),
            size: self.size(),
            shapes: shapes.into(),
            message,
        }
    }

    /// Shuts down this process's ring connections (the sockets whose local address is one of
    /// this rank's hostfile addresses, or whose peer is one of the right neighbour's), so that
    /// MLX's socket threads see them closed and fail their pending work. Returns how many.
    fn abort_connections(&self) -> usize {
        match &self.inner.ring {
            Some(ring) => ring_sockets(ring, true),
            None => 0,
        }
    }
}

/// How long a timed-out collective waits for MLX to fail once its connections are closed.
const RELEASE_WAIT: Duration = Duration::from_secs(10);
/// How often the watchdog looks at the collective in flight when no deadline is nearer.
const WATCH_PERIOD: Duration = Duration::from_millis(250);
/// The exit status of a process that the watchdog ends (MLX did not return after a timeout).
const WATCHDOG_EXIT: i32 = 124;

/// The hint of a timeout after which burn-mlx closed the ring connections and MLX returned.
fn released_hint(closed: usize) -> String {
    format!(
        "burn-mlx closed this rank's {closed} ring connection(s), so this process can save its \
         work and exit; the peers fail too. If a rank is legitimately this slow, raise the \
         timeout (Group::set_timeout, {TIMEOUT_ENV})"
    )
}

/// The ring connections of this process (the sockets whose local address is one of this rank's
/// hostfile addresses, or whose peer is one of the right neighbour's): shut down when `close`,
/// else only counted. Returns how many.
fn ring_sockets(ring: &RingConfig, close: bool) -> usize {
    let ours = |local: SocketAddrV4, peer: SocketAddrV4| {
        ring.own
            .iter()
            .any(|a| a.port() == local.port() && (a.ip() == local.ip() || a.ip().is_unspecified()))
            || ring.right.contains(&peer)
    };
    close_matching_sockets(ours, close)
}

/// The collective a watchdog is watching.
#[derive(Clone, Copy)]
struct Watched {
    id: u64,
    started: Instant,
    limit: Duration,
}

/// What the caller and the watchdog thread share.
#[derive(Default)]
struct WatchState {
    /// The number the next collective gets.
    next: u64,
    /// The collective in flight.
    active: Option<Watched>,
    /// The collective whose time ran out, and how many connections the watchdog closed.
    fired: Option<(u64, usize)>,
    /// Set when the group is dropped: the thread ends.
    stop: bool,
}

/// The watchdog of a ring group: a thread that closes the ring connections when the
/// collective in flight outlives its timeout (see the module docs).
pub(crate) struct Watchdog {
    state: Mutex<WatchState>,
    wake: Condvar,
}

impl Watchdog {
    /// Starts the watchdog of a ring group, if burn-mlx can find its connections (else the group
    /// uses helper threads).
    fn start(ring: RingConfig, rank: usize, size: usize) -> Option<Arc<Watchdog>> {
        if ring_sockets(&ring, false) == 0 {
            return None;
        }
        let dog = Arc::new(Watchdog {
            state: Mutex::new(WatchState::default()),
            wake: Condvar::new(),
        });
        let watched = Arc::clone(&dog);
        std::thread::Builder::new()
            .name("burn-mlx-watchdog".into())
            .spawn(move || watched.watch(&ring, rank, size))
            .ok()?;
        Some(dog)
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the start of a collective; returns its number.
    fn begin(&self, started: Instant, limit: Duration) -> u64 {
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        state.active = Some(Watched { id, started, limit });
        if limit < WATCH_PERIOD {
            self.wake.notify_one();
        }
        id
    }

    /// Records the end of collective `id`; returns how many connections the watchdog closed if
    /// its time ran out.
    fn end(&self, id: u64) -> Option<usize> {
        let mut state = self.lock();
        state.active = None;
        let fired = state.fired.filter(|f| f.0 == id).map(|f| f.1);
        if fired.is_some() {
            // The watchdog waits for this collective to return (see `watch`).
            self.wake.notify_one();
        }
        fired
    }

    /// The watchdog thread.
    fn watch(&self, ring: &RingConfig, rank: usize, size: usize) {
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            let pending = state
                .active
                .filter(|w| state.fired.is_none_or(|(id, _)| id != w.id));
            let wait = match pending {
                Some(w) if w.started.elapsed() >= w.limit => {
                    drop(state);
                    let closed = ring_sockets(ring, true);
                    state = self.lock();
                    state.fired = Some((w.id, closed));
                    // MLX's evaluation fails within milliseconds once the connections are
                    // closed. If it does not, the caller is stuck inside MLX: end the process
                    // rather than let it hang.
                    let deadline = Instant::now() + RELEASE_WAIT;
                    while !state.stop && state.active.is_some_and(|a| a.id == w.id) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            eprintln!(
                                "burn-mlx: a collective on rank {rank} of {size} did not finish \
                                 within {:.1} s; burn-mlx closed this rank's {closed} ring \
                                 connection(s), but MLX is still waiting inside the collective, \
                                 so the process ends (exit status {WATCHDOG_EXIT}). If a rank is \
                                 legitimately this slow, raise the timeout (Group::set_timeout, \
                                 {TIMEOUT_ENV})",
                                w.limit.as_secs_f64()
                            );
                            exit_now(WATCHDOG_EXIT);
                        }
                        state = self
                            .wake
                            .wait_timeout(state, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                    continue;
                }
                Some(w) => (w.limit - w.started.elapsed()).min(WATCH_PERIOD),
                None => WATCH_PERIOD,
            };
            state = self
                .wake
                .wait_timeout(state, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(dog) = &self.watchdog {
            dog.lock().stop = true;
            dog.wake.notify_one();
        }
    }
}

/// Ends the process at once, without running exit handlers or destructors (the thread that
/// would run them may be stuck inside MLX).
#[cfg(unix)]
fn exit_now(code: i32) -> ! {
    extern "C" {
        fn _exit(status: std::os::raw::c_int) -> !;
    }
    // SAFETY: `_exit` (POSIX) takes any status and does not return.
    unsafe { _exit(code) }
}

/// Ends the process at once (no watchdog runs off Unix; see `close_matching_sockets`).
#[cfg(not(unix))]
fn exit_now(code: i32) -> ! {
    std::process::exit(code)
}

/// Shuts down (without closing: MLX still owns them) the TCP sockets of this process for which
/// `matches(local, peer)` holds, or with `close` false only counts them. Returns how many.
#[cfg(unix)]
fn close_matching_sockets(
    matches: impl Fn(SocketAddrV4, SocketAddrV4) -> bool,
    close: bool,
) -> usize {
    use std::mem::ManuallyDrop;
    use std::net::{Shutdown, SocketAddr, TcpStream};
    use std::os::fd::FromRawFd;

    let fds: Vec<i32> = ["/proc/self/fd", "/dev/fd"]
        .iter()
        .find_map(|dir| std::fs::read_dir(dir).ok())
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut closed = 0;
    for fd in fds {
        // SAFETY: the stream is never dropped (so the descriptor is not closed); it is only
        // asked for its addresses, which fails harmlessly for descriptors that are not TCP
        // sockets, and shut down when it is one of the ring's connections.
        let stream = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        if let (Ok(SocketAddr::V4(local)), Ok(SocketAddr::V4(peer))) =
            (stream.local_addr(), stream.peer_addr())
        {
            if matches(local, peer) && (!close || stream.shutdown(Shutdown::Both).is_ok()) {
                closed += 1;
            }
        }
    }
    closed
}

/// No descriptor scan off Unix: the timeout error then asks to end the process.
#[cfg(not(unix))]
fn close_matching_sockets(
    _matches: impl Fn(SocketAddrV4, SocketAddrV4) -> bool,
    _close: bool,
) -> usize {
    0
}

/// Evaluates `arrays` under burn-mlx's evaluation lock, telling `device` when it succeeded.
fn locked_eval(arrays: &[Array], device: MlxDevice) -> Result<(), String> {
    let _guard = crate::tensor::eval_lock();
    let r = mlx_rs::transforms::eval(arrays.iter()).map_err(|e| e.what().to_string());
    if r.is_ok() {
        device.after_eval();
    }
    r
}
