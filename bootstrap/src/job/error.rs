//! The bootstrap's errors: typed, naming ranks and variables, bounded in length.

use std::fmt;

use super::env::EnvError;

/// Ranks an error message lists before "and N more".
const LISTED: usize = 16;

/// Why the root refused a connecting process. The refused process receives it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The process runs as another user (`SO_PEERCRED`).
    User {
        /// The root's effective uid.
        expected: u32,
        /// The peer's.
        found: u32,
    },
    /// The peer's proof of the job's token failed: it does not know the token (or answered
    /// another challenge).
    Token,
    /// The peer's `WORLD_SIZE` differs from the root's.
    World {
        /// The root's world.
        expected: u16,
        /// The peer's.
        found: u16,
    },
    /// The claimed rank is not below the world size.
    Rank {
        /// The claimed rank.
        rank: u16,
        /// The world size.
        world: u16,
    },
    /// Another process already holds the claimed rank (rank 0 is the root's).
    Duplicate {
        /// The claimed rank.
        rank: u16,
    },
    /// The hello is not a hello of this protocol version.
    Malformed,
    /// Too many connections were waiting to say hello at once.
    Busy,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::User { expected, found } => {
                write!(f, "runs as uid {found}, the job as uid {expected}")
            }
            Refusal::Token => write!(f, "authentication failed"),
            Refusal::World { expected, found } => {
                write!(f, "world size {found}, the job's is {expected}")
            }
            Refusal::Rank { rank, world } => write!(f, "rank {rank} in a world of {world}"),
            Refusal::Duplicate { rank } => write!(f, "rank {rank} is already taken"),
            Refusal::Malformed => write!(f, "malformed hello"),
            Refusal::Busy => write!(f, "too many connections waiting"),
        }
    }
}

/// Why a bootstrap call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BootstrapError {
    /// The job environment is unusable.
    Env(EnvError),
    /// A system call failed.
    Sys {
        /// The call.
        call: &'static str,
        /// The operating system's message.
        message: String,
    },
    /// The job's socket name is taken: another root with the same `SYMM_JOB` is running.
    NameTaken {
        /// The socket name (abstract namespace).
        name: String,
    },
    /// No root accepted a connection before the deadline.
    NoRoot {
        /// The socket name tried.
        name: String,
        /// Milliseconds spent trying.
        waited_ms: u64,
    },
    /// The process listening on the job's socket runs as another user: nothing was sent to it.
    UntrustedRoot {
        /// Its effective uid.
        uid: u32,
        /// This process's.
        ours: u32,
    },
    /// The process listening on the job's socket did not prove that it knows the job's token
    /// (a wrong or missing proof): it is not the job's root, and nothing derived from the token
    /// was sent to it.
    Unauthenticated {
        /// The socket name (abstract namespace).
        name: String,
    },
    /// The root refused this process.
    Refused(Refusal),
    /// The deadline passed before every rank arrived.
    Missing {
        /// The ranks that had not arrived, in order.
        ranks: Vec<u16>,
        /// What the root refused meanwhile (empty where not known).
        refused: Vec<Refusal>,
    },
    /// A collective passed its deadline.
    Timeout {
        /// The collective.
        op: &'static str,
        /// The ranks it was still waiting for.
        waiting_for: Vec<u16>,
    },
    /// A rank's process ended or its connection broke.
    PeerLost {
        /// The rank.
        rank: u16,
    },
    /// A peer sent something outside the protocol; the connection was dropped.
    Protocol {
        /// The peer.
        rank: u16,
        /// What was wrong.
        what: &'static str,
    },
    /// Ranks called different collectives, or different numbers of them.
    Mismatch {
        /// The rank that differed from the root.
        rank: u16,
        /// The root's collective.
        expected: &'static str,
        /// That rank's.
        found: &'static str,
    },
    /// An argument exceeds the protocol's bounds.
    TooLarge {
        /// What.
        what: &'static str,
        /// Its size.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// A rank recovers ([`super::SocketBootstrap::recover`]) while this one is in a collective:
    /// every rank must recover before the next collective.
    Recovering {
        /// The rank that recovers.
        rank: u16,
    },
    /// This rank left the job ([`super::SocketBootstrap::leave`]); its calls fail from then on.
    Left {
        /// This rank.
        rank: u16,
    },
    /// An earlier failure left the bootstrap unusable; it is kept here.
    Poisoned(Box<BootstrapError>),
}

impl BootstrapError {
    pub(crate) fn sys(call: &'static str, e: std::io::Error) -> BootstrapError {
        BootstrapError::Sys {
            call,
            message: e.to_string(),
        }
    }

    /// The lost rank, when this error (or the one it keeps) is a lost peer.
    pub fn lost_rank(&self) -> Option<u16> {
        match self {
            BootstrapError::PeerLost { rank } => Some(*rank),
            BootstrapError::Poisoned(e) => e.lost_rank(),
            _ => None,
        }
    }
}

/// Writes `ranks` as "1, 2, 5", at most [`LISTED`] of them.
pub(crate) struct Ranks<'a>(pub &'a [u16]);

impl fmt::Display for Ranks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().take(LISTED).enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{r}")?;
        }
        if self.0.len() > LISTED {
            write!(f, " and {} more", self.0.len() - LISTED)?;
        }
        Ok(())
    }
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootstrapError::Env(e) => write!(f, "job environment: {e}"),
            BootstrapError::Sys { call, message } => write!(f, "{call}: {message}"),
            BootstrapError::NameTaken { name } => write!(
                f,
                "socket @{name} is taken: another job of this name is running"
            ),
            BootstrapError::NoRoot { name, waited_ms } => {
                write!(f, "no root accepted at @{name} within {waited_ms} ms")
            }
            BootstrapError::UntrustedRoot { uid, ours } => write!(
                f,
                "the job's socket belongs to uid {uid}, not to this user (uid {ours})"
            ),
            BootstrapError::Unauthenticated { name } => write!(
                f,
                "authentication failed: the process on @{name} did not prove it knows the job's \
                 token; nothing was sent to it"
            ),
            BootstrapError::Refused(r) => write!(f, "refused by the root: {r}"),
            BootstrapError::Missing { ranks, refused } => {
                write!(f, "rank(s) {} did not arrive by the deadline", Ranks(ranks))?;
                for (i, r) in refused.iter().take(LISTED).enumerate() {
                    write!(f, "{} {r}", if i == 0 { "; refused:" } else { ";" })?;
                }
                Ok(())
            }
            BootstrapError::Timeout { op, waiting_for } => write!(
                f,
                "{op} passed its deadline waiting for rank(s) {}",
                Ranks(waiting_for)
            ),
            BootstrapError::PeerLost { rank } => write!(f, "rank {rank} was lost"),
            BootstrapError::Protocol { rank, what } => {
                write!(f, "rank {rank} broke the protocol: {what}")
            }
            BootstrapError::Mismatch {
                rank,
                expected,
                found,
            } => write!(
                f,
                "rank {rank} called {found} where the root called {expected}"
            ),
            BootstrapError::TooLarge { what, len, max } => {
                write!(f, "{what}: {len} exceeds the bound of {max}")
            }
            BootstrapError::Left { rank } => write!(f, "rank {rank} left the job"),
            BootstrapError::Recovering { rank } => write!(
                f,
                "rank {rank} recovers (reset) while this rank is in a collective: reset here too"
            ),
            BootstrapError::Poisoned(e) => write!(f, "bootstrap unusable after: {e}"),
        }
    }
}

impl std::error::Error for BootstrapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BootstrapError::Env(e) => Some(e),
            BootstrapError::Refused(r) => Some(r),
            BootstrapError::Poisoned(e) => Some(&**e),
            _ => None,
        }
    }
}

impl std::error::Error for Refusal {}

impl From<EnvError> for BootstrapError {
    fn from(e: EnvError) -> Self {
        BootstrapError::Env(e)
    }
}

/// The bootstrap's result.
pub type Result<T, E = BootstrapError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_rank_lists_are_cut() {
        let ranks: Vec<u16> = (1..1000).collect();
        let e = BootstrapError::Missing {
            ranks,
            refused: vec![Refusal::Token; 100],
        };
        let s = e.to_string();
        assert!(s.contains("16 and 983 more"), "{s}");
        assert!(s.len() < 500, "{s}");
        let e = BootstrapError::Poisoned(Box::new(BootstrapError::PeerLost { rank: 3 }));
        assert_eq!(e.lost_rank(), Some(3));
    }
}
