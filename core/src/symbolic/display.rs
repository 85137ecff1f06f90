//! The text of [`SymError`] and the errors it wraps.

use super::SymError;

impl core::fmt::Display for SymError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SymError::Sched(e) => write!(f, "the request does not schedule: {e}"),
            SymError::WorldTooLarge => write!(f, "the symbolic checker handles worlds up to 64"),
            SymError::TooManyCells { cells } => write!(
                f,
                "the request's buffers hold {cells} elements over every rank; the symbolic checker models at most {}",
                super::MAX_CELLS
            ),
            SymError::Deadlock {
                rank,
                channel,
                index,
                slot,
            } => write!(
                f,
                "deadlock: rank {rank} channel {channel} op {index} waits on slot {slot} forever"
            ),
            SymError::ReadUnwritten { rank, loc } => {
                write!(f, "rank {rank} reads {loc:?}, which nobody wrote")
            }
            SymError::Mixed { rank, dst } => write!(
                f,
                "rank {rank} reduces elements of different indices into {dst:?}"
            ),
            SymError::OutOfBounds { rank, loc } => {
                write!(
                    f,
                    "rank {rank} reaches {loc:?}, outside its buffer or world"
                )
            }
            SymError::BadSlot { rank, slot } => {
                write!(f, "rank {rank} names slot {slot}, outside the pad")
            }
            SymError::Wrong {
                rank,
                elem,
                found,
                want,
            } => write!(
                f,
                "rank {rank} output element {elem} is {found:?}, not {want:?}"
            ),
            SymError::Team(e) => write!(f, "team: {e}"),
            SymError::NotRankOrder { rank, elem, fold } => {
                if fold.ordered {
                    write!(
                        f,
                        "rank {rank} output element {elem} folds ranks {}..{} in order with {} \
                         roundings, not every rank with one",
                        fold.first, fold.next, fold.steps
                    )
                } else {
                    write!(
                        f,
                        "rank {rank} output element {elem} combines its contributions out of \
                         rank order"
                    )
                }
            }
            SymError::Unbalanced {
                rank,
                slot,
                pad,
                expected,
            } => write!(
                f,
                "rank {rank} slot {slot} holds {pad} after the run, its counter expects {expected}"
            ),
        }
    }
}

impl core::error::Error for SymError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            SymError::Sched(e) => Some(e),
            SymError::Team(e) => Some(e),
            _ => None,
        }
    }
}
