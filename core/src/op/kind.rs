//! The kinds of [`Op`] and their stable numbers.
//!
//! [`OpKind`]'s discriminants are the op tags of trace format version 4 ([`crate::trace`]): the
//! table is append-only. A new op takes the next free number; an existing number never changes
//! meaning and is never reused, so adding an op never renumbers the ones before it.

use super::Op;

/// The kind of an [`Op`], numbered by the stable tag table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum OpKind {
    /// [`Op::Copy`].
    Copy = 0,
    /// [`Op::Reduce`].
    Reduce = 1,
    /// [`Op::Signal`].
    Signal = 2,
    /// [`Op::Wait`].
    Wait = 3,
    /// [`Op::ReduceN`].
    ReduceN = 4,
    /// [`Op::LlPut`].
    LlPut = 5,
    /// [`Op::LlReduce`].
    LlReduce = 6,
    /// [`Op::McReduce`].
    McReduce = 7,
    /// [`Op::McStore`].
    McStore = 8,
}

impl OpKind {
    /// Every kind, in tag order (`ALL[t]` has tag `t`).
    pub const ALL: [OpKind; 9] = [
        OpKind::Copy,
        OpKind::Reduce,
        OpKind::Signal,
        OpKind::Wait,
        OpKind::ReduceN,
        OpKind::LlPut,
        OpKind::LlReduce,
        OpKind::McReduce,
        OpKind::McStore,
    ];

    /// The stable tag.
    pub const fn tag(self) -> u8 {
        self as u8
    }

    /// The kind with stable tag `tag`, if there is one.
    pub const fn from_tag(tag: u8) -> Option<OpKind> {
        let t = tag as usize;
        if t < OpKind::ALL.len() {
            Some(OpKind::ALL[t])
        } else {
            None
        }
    }

    /// The kind of `op`.
    pub const fn of(op: &Op) -> OpKind {
        match op {
            Op::Copy { .. } => OpKind::Copy,
            Op::Reduce { .. } => OpKind::Reduce,
            Op::Signal { .. } => OpKind::Signal,
            Op::Wait { .. } => OpKind::Wait,
            Op::ReduceN { .. } => OpKind::ReduceN,
            Op::LlPut { .. } => OpKind::LlPut,
            Op::LlReduce { .. } => OpKind::LlReduce,
            Op::McReduce { .. } => OpKind::McReduce,
            Op::McStore { .. } => OpKind::McStore,
        }
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Copy => "copy",
            OpKind::Reduce => "reduce",
            OpKind::Signal => "signal",
            OpKind::Wait => "wait",
            OpKind::ReduceN => "reduce_n",
            OpKind::LlPut => "ll_put",
            OpKind::LlReduce => "ll_reduce",
            OpKind::McReduce => "mc_reduce",
            OpKind::McStore => "mc_store",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is append-only: these numbers are part of the trace format.
    #[test]
    fn tags_are_pinned() {
        let pinned = [
            (OpKind::Copy, 0, "copy"),
            (OpKind::Reduce, 1, "reduce"),
            (OpKind::Signal, 2, "signal"),
            (OpKind::Wait, 3, "wait"),
            (OpKind::ReduceN, 4, "reduce_n"),
            (OpKind::LlPut, 5, "ll_put"),
            (OpKind::LlReduce, 6, "ll_reduce"),
            (OpKind::McReduce, 7, "mc_reduce"),
            (OpKind::McStore, 8, "mc_store"),
        ];
        for (k, tag, name) in pinned {
            assert_eq!(k.tag(), tag, "{k:?}");
            assert_eq!(k.name(), name);
            assert_eq!(OpKind::from_tag(tag), Some(k));
        }
        for (t, k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(k.tag() as usize, t);
        }
        assert_eq!(OpKind::from_tag(OpKind::ALL.len() as u8), None);
        assert_eq!(OpKind::from_tag(u8::MAX), None);
    }
}
