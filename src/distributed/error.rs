//! [`DistributedError`]: what can go wrong when ranks set up a group or communicate.
//!
//! Every message names the operation, this process's rank and the group size where they are
//! known, and says what to do.

use crate::error::MlxError;

/// An error of [`burn_mlx::distributed`](crate::distributed): setting up a group, a collective
/// operation, or launching ranks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistributedError {
    /// The requested communication backend is not part of this MLX build.
    #[error("distributed backend `{backend}` is not available in this MLX build: {hint}")]
    NotAvailable {
        /// The backend asked for (`ring`, `mpi`, `nccl`, `jaccl`).
        backend: String,
        /// What to do instead.
        hint: String,
    },
    /// The environment or the hostfile that configures the group is missing or malformed.
    #[error("distributed init ({backend}): {problem}. {hint}")]
    Config {
        /// The backend being set up.
        backend: String,
        /// What is wrong, naming the variable or file.
        problem: String,
        /// What to do.
        hint: String,
    },
    /// MLX could not set the group up (a peer that never answered, a port in use, ...).
    #[error("distributed init ({backend}, rank {rank}): {message}. {hint}")]
    Init {
        /// The backend being set up.
        backend: String,
        /// This process's rank, as configured (`?` when unknown).
        rank: String,
        /// MLX's message, or what the watchdog saw.
        message: String,
        /// What to do.
        hint: String,
    },
    /// A collective did not finish within the group's timeout.
    #[error(
        "`{op}` on rank {rank} of {size} did not finish within {seconds:.1} s ({shapes}): a peer \
         stopped responding or did not call the same collective. {hint}"
    )]
    Timeout {
        /// The collective.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// The shapes and dtypes it was given.
        shapes: String,
        /// The timeout that passed.
        seconds: f64,
        /// What happened to the group and what to do.
        hint: String,
    },
    /// A peer closed its connection (it exited, crashed or was killed).
    #[error(
        "`{op}` on rank {rank} of {size} failed ({shapes}): the connection to a peer was lost \
         ({message}). Another rank exited or crashed: look at its output; this group cannot be \
         used any more, so end this process too (the launcher stops the others)."
    )]
    PeerLost {
        /// The collective.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// The shapes and dtypes it was given.
        shapes: String,
        /// MLX's message.
        message: String,
    },
    /// The ranks called different collectives, or the same one with different shapes or dtypes.
    #[error("`{op}` on rank {rank} of {size}: the ranks disagree: {detail}. {hint}")]
    Mismatch {
        /// The collective.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// What each rank passed.
        detail: String,
        /// What to do.
        hint: String,
    },
    /// MLX rejected or failed a collective for another reason.
    #[error("`{op}` on rank {rank} of {size} failed ({shapes}): {message}")]
    Collective {
        /// The collective.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// The shapes and dtypes it was given.
        shapes: String,
        /// MLX's message, and what to do.
        message: String,
    },
    /// An argument is invalid (a rank outside the group, a quantized tensor, ...).
    #[error("`{op}` on rank {rank} of {size}: {message}")]
    Invalid {
        /// The operation.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// What is wrong and what to do.
        message: String,
    },
    /// An earlier failure left the group unusable.
    #[error(
        "`{op}` on rank {rank} of {size}: the group is unusable after an earlier failure ({cause}); \
         end this process and start all ranks again"
    )]
    Broken {
        /// The collective that was refused.
        op: String,
        /// This process's rank.
        rank: usize,
        /// The group size.
        size: usize,
        /// The first failure.
        cause: String,
    },
    /// Starting or supervising local ranks failed (see [`launch`](super::launch)).
    #[error("launch: {message}")]
    Launch {
        /// What failed, which rank, and what to do.
        message: String,
    },
}

/// Lets code that returns [`MlxError`] use `?` on distributed calls.
impl From<DistributedError> for MlxError {
    fn from(e: DistributedError) -> Self {
        let op = match &e {
            DistributedError::Timeout { op, .. }
            | DistributedError::PeerLost { op, .. }
            | DistributedError::Mismatch { op, .. }
            | DistributedError::Collective { op, .. }
            | DistributedError::Invalid { op, .. }
            | DistributedError::Broken { op, .. } => op.clone(),
            DistributedError::NotAvailable { .. }
            | DistributedError::Config { .. }
            | DistributedError::Init { .. } => "distributed::init".into(),
            DistributedError::Launch { .. } => "distributed::launch".into(),
        };
        MlxError::Mlx {
            op,
            message: e.to_string(),
        }
    }
}
