//! The check's errors: which rank, token and entry break which rule.

use crate::moe::MoeError;
use core::fmt;

/// One entry of a routing: `topk_idx[token * topk + k]` of `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// The sending rank.
    pub rank: u16,
    /// Its token.
    pub token: u32,
    /// The entry of the token.
    pub k: u16,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} token {} entry {}",
            self.rank, self.token, self.k
        )
    }
}

/// How a layout breaks the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MoeCheckError {
    /// The shape or a routing is malformed (lengths, token bound).
    Config(MoeError),
    /// A token has a slot for a rank it does not go to, or none for one it goes to.
    Slot {
        /// Sender.
        rank: u16,
        /// Token.
        token: u32,
        /// Destination.
        dest: u16,
    },
    /// A sender's header count is not the number of its tokens for the destination.
    Count {
        /// Sender.
        rank: u16,
        /// Destination.
        dest: u16,
        /// The count routed.
        count: u32,
        /// Tokens that go there.
        want: u32,
    },
    /// A staging row lies past the half.
    StageOutOfRange {
        /// The staging area's rank.
        dest: u16,
        /// Sender.
        rank: u16,
        /// Token.
        token: u32,
        /// The row.
        row: u64,
        /// Rows of a half.
        rows: u64,
    },
    /// Two tokens (or two partials in combine) land in the same staging row.
    StageCollision {
        /// The staging area's rank.
        dest: u16,
        /// The row.
        row: u64,
        /// The first writer (rank, token).
        first: (u16, u32),
        /// The second writer (rank, token).
        second: (u16, u32),
    },
    /// The rows a receiver reads from the counts are not the rows written to it.
    StageUnread {
        /// The receiver.
        dest: u16,
        /// Sender.
        rank: u16,
        /// The row written but not read, or read but not written.
        row: u64,
    },
    /// An entry's expert row lies outside its expert's span.
    OutsideSpan {
        /// The entry.
        entry: Entry,
        /// The receiving rank.
        dest: u16,
        /// The row.
        row: u32,
        /// The span (first row, count).
        span: (u32, u32),
    },
    /// Two entries share an expert row.
    ExpertCollision {
        /// The receiving rank.
        dest: u16,
        /// The row.
        row: u32,
        /// The entry placed first.
        first: Entry,
        /// The entry placed second.
        second: Entry,
    },
    /// Expert spans overlap, leave a gap, or do not end at `min(entries, rows_max)`.
    Spans {
        /// The receiving rank.
        dest: u16,
        /// Local expert whose span is misplaced (`L` for the end).
        expert: u32,
        /// Where it starts (or where the spans end).
        start: u32,
        /// Where it should.
        want: u32,
    },
    /// Kept rows and entries with a row differ in number (a row without an entry).
    RowCount {
        /// The receiving rank.
        dest: u16,
        /// Entries placed.
        placed: u32,
        /// Rows the spans cover.
        covered: u32,
    },
    /// A sender's sum reads, for one of its tokens, a partial made for another token.
    CombineRow {
        /// The sender.
        rank: u16,
        /// Its token.
        token: u32,
        /// The rank whose partial was read.
        dest: u16,
    },
    /// A token's combined sum has an entry the wrong number of times.
    Combine {
        /// The entry.
        entry: Entry,
        /// Times its contribution was summed.
        found: u32,
        /// Times it should be (1 with a row, 0 without).
        want: u32,
    },
}

impl fmt::Display for MoeCheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MoeCheckError::Config(e) => write!(f, "{e}"),
            MoeCheckError::Slot { rank, token, dest } => write!(
                f,
                "rank {rank} token {token}: slot for rank {dest} disagrees with its destinations"
            ),
            MoeCheckError::Count {
                rank,
                dest,
                count,
                want,
            } => write!(
                f,
                "rank {rank} counts {count} tokens for rank {dest}, {want} go there"
            ),
            MoeCheckError::StageOutOfRange {
                dest,
                rank,
                token,
                row,
                rows,
            } => write!(
                f,
                "rank {rank} token {token} lands in staging row {row} of rank {dest}, past {rows}"
            ),
            MoeCheckError::StageCollision {
                dest,
                row,
                first,
                second,
            } => write!(
                f,
                "staging row {row} of rank {dest} written by rank {} token {} and rank {} token {}",
                first.0, first.1, second.0, second.1
            ),
            MoeCheckError::StageUnread { dest, rank, row } => write!(
                f,
                "staging row {row} of rank {dest} from rank {rank}: written and read disagree"
            ),
            MoeCheckError::OutsideSpan {
                entry,
                dest,
                row,
                span,
            } => write!(
                f,
                "{entry} lands in row {row} of rank {dest}, outside its expert's rows {}..{}",
                span.0,
                u64::from(span.0) + u64::from(span.1)
            ),
            MoeCheckError::ExpertCollision {
                dest,
                row,
                first,
                second,
            } => {
                write!(
                    f,
                    "expert row {row} of rank {dest} holds {first} and {second}"
                )
            }
            MoeCheckError::Spans {
                dest,
                expert,
                start,
                want,
            } => write!(
                f,
                "rank {dest}: local expert {expert}'s rows start at {start}, expected {want}"
            ),
            MoeCheckError::RowCount {
                dest,
                placed,
                covered,
            } => write!(
                f,
                "rank {dest}: {placed} entries placed in {covered} expert rows"
            ),
            MoeCheckError::CombineRow { rank, token, dest } => write!(
                f,
                "rank {rank} token {token} sums a partial rank {dest} made for another token"
            ),
            MoeCheckError::Combine { entry, found, want } => write!(
                f,
                "{entry} summed {found} times in combine, expected {want}"
            ),
        }
    }
}

impl core::error::Error for MoeCheckError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            MoeCheckError::Config(e) => Some(e),
            _ => None,
        }
    }
}

impl From<MoeError> for MoeCheckError {
    fn from(e: MoeError) -> Self {
        MoeCheckError::Config(e)
    }
}
