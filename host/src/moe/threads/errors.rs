//! The errors of the threaded protocol: which rank failed, in which phase, waiting for whom.

use symm_core::moe::MoeError;

/// The half of a call a wait belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MoePhase {
    /// Dispatch: tokens to the experts' ranks.
    Dispatch,
    /// Combine: weighted expert outputs back to the tokens' ranks.
    Combine,
}

/// What went wrong in a rank's call.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MoeThreadError {
    /// The shape or the rank's input is malformed.
    Shape {
        /// The rank.
        rank: u16,
        /// What core found.
        error: MoeError,
    },
    /// A header word did not carry the call's epoch before the deadline (or a peer failed).
    Timeout {
        /// The rank that waited.
        rank: u16,
        /// Dispatch or combine.
        phase: MoePhase,
        /// The epoch it waited for.
        epoch: u32,
        /// The sender of the missing word.
        sender: u16,
        /// The word of that sender's header.
        word: u32,
        /// The word found.
        found: u64,
    },
    /// A header announces more rows than a sender's staging block holds.
    BadCount {
        /// The receiver.
        rank: u16,
        /// Dispatch or combine.
        phase: MoePhase,
        /// The sender.
        sender: u16,
        /// The count announced.
        count: u32,
    },
    /// A staging row names a local expert the receiver does not have.
    BadEntry {
        /// The receiver.
        rank: u16,
        /// The sender.
        sender: u16,
        /// The row's slot in the sender's block.
        slot: u32,
        /// The entry of the row.
        k: u16,
        /// The local expert named.
        expert: i32,
    },
    /// A peer returned a number of partials other than the tokens this rank sent it.
    CountMismatch {
        /// The rank combining.
        rank: u16,
        /// The peer whose count differs.
        sender: u16,
        /// Tokens this rank sent it.
        expected: u32,
        /// Partials it announced.
        found: u32,
    },
    /// A combine came before any dispatch.
    NoDispatch {
        /// The rank.
        rank: u16,
    },
    /// A rank thread panicked.
    ThreadPanicked,
    /// An earlier run on this world failed: its areas hold the words of a call that did not
    /// finish on every rank, so no later call could tell them from its own. Make a new
    /// [`MoeWorld`](super::MoeWorld).
    WorldFailed,
}

impl std::fmt::Display for MoeThreadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MoeThreadError::Shape { rank, error } => write!(f, "rank {rank}: {error}"),
            MoeThreadError::Timeout { rank, phase, epoch, sender, word, found } => write!(
                f,
                "rank {rank} {phase:?} epoch {epoch}: header word {word} from rank {sender} never came (found {found:#x})"
            ),
            MoeThreadError::BadCount { rank, phase, sender, count } => write!(
                f,
                "rank {rank} {phase:?}: rank {sender} announces {count} rows, past its staging block"
            ),
            MoeThreadError::BadEntry { rank, sender, slot, k, expert } => write!(
                f,
                "rank {rank}: row {slot} from rank {sender} entry {k} names local expert {expert}"
            ),
            MoeThreadError::CountMismatch { rank, sender, expected, found } => write!(
                f,
                "rank {rank}: rank {sender} returned {found} partials for the {expected} tokens sent"
            ),
            MoeThreadError::NoDispatch { rank } => {
                write!(f, "rank {rank}: combine without a dispatch before it")
            }
            MoeThreadError::ThreadPanicked => write!(f, "a rank thread panicked"),
            MoeThreadError::WorldFailed => write!(
                f,
                "an earlier run on this MoE world failed and left a call half done: make a new MoeWorld"
            ),
        }
    }
}

impl std::error::Error for MoeThreadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MoeThreadError::Shape { error, .. } => Some(error),
            _ => None,
        }
    }
}
