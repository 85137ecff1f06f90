//! The ops table: every op described once.
//!
//! The one table (the `ops!` invocation in `op.rs`) gives each op one row: its variant and
//! documentation, its stable trace tag ([`OpKind`](super::OpKind), append-only), its plan code
//! and the code's name (`SYMM_OP_<NAME>` in the generated headers), its short name, whether it
//! is a multicast op, and its fields, each with its type and its place in the flat form
//! ([`OpFields`](super::OpFields)). From the rows the macro here writes:
//!
//! * the [`Op`](super::Op) enum and the [`OpKind`](super::OpKind) enum with its tags, names and
//!   plan codes (`plan::KINDS`, from which `plan.cuh` and `symm.h` list the codes);
//! * [`Op::map_locs`](super::Op::map_locs) (every field of type [`Loc`](super::Loc), unless the
//!   row names its own function) and [`Op::map_slots`](super::Op::map_slots) (the fields at the
//!   `peer` and `slot` places);
//! * the flat form both ways ([`Op::to_fields`](super::Op::to_fields),
//!   [`Op::from_fields`](super::Op::from_fields)), through which the plan encoding and the C ABI
//!   convert every op;
//! * the trace record's fields (each field in declaration order, postcard), both ways;
//! * [`Op::example`](super::Op::example), an op of each kind with distinct nonzero fields, which
//!   the table's tests round-trip through every encoding;
//! * the columns: [`OpKind::reduces`](super::OpKind::reduces) (a row marked `reduces`),
//!   [`Op::line_format`](super::Op::line_format) (the field at the `format` place, which a trace
//!   carries in the tag: a row's second tag names its 128-byte line form,
//!   [`Op::trace_tag`](super::Op::trace_tag)).
//!
//! Every match it writes is exhaustive. What an op *does* (in host memory, on the GPU, in the
//! symbolic model, in the cost model) stays in exhaustive matches at those places, so the
//! compiler lists each one a new row needs.

use super::{Buf, Loc, McLoc, Ranks, SignalOp, MAX_FANIN};
use crate::dtype::{DType, ReduceOp};
use crate::ll::Format;

/// What the table needs of every field type.
pub(crate) trait OpField: Sized {
    /// The field with every rank-addressed location passed through `f` (none, but for a
    /// [`Loc`]).
    fn map_loc<E>(self, _f: &mut impl FnMut(Loc) -> Result<Loc, E>) -> Result<Self, E> {
        Ok(self)
    }

    /// A value for field number `i` (from 1) of an example op: nonzero, and distinct from the
    /// values of the other fields of the same type.
    fn example(i: u8) -> Self;
}

impl OpField for Loc {
    fn map_loc<E>(self, f: &mut impl FnMut(Loc) -> Result<Loc, E>) -> Result<Loc, E> {
        f(self)
    }
    fn example(i: u8) -> Loc {
        Loc::new(
            u16::from(i),
            Buf::ALL[1 + usize::from(i) % 2],
            64 * u64::from(i),
        )
    }
}

impl OpField for McLoc {
    fn example(i: u8) -> McLoc {
        McLoc {
            buf: Buf::ALL[1 + usize::from(i) % 2],
            offset: 128 * u64::from(i),
        }
    }
}

impl OpField for Buf {
    fn example(i: u8) -> Buf {
        Buf::ALL[1 + usize::from(i) % 2]
    }
}

impl OpField for DType {
    fn example(i: u8) -> DType {
        DType::ALL[1 + usize::from(i) % (DType::ALL.len() - 1)]
    }
}

impl OpField for ReduceOp {
    fn example(i: u8) -> ReduceOp {
        ReduceOp::ALL[1 + usize::from(i) % (ReduceOp::ALL.len() - 1)]
    }
}

impl OpField for Format {
    fn example(_: u8) -> Format {
        Format::Ll128
    }
}

impl OpField for SignalOp {
    fn example(_: u8) -> SignalOp {
        SignalOp::Add
    }
}

impl OpField for Ranks {
    fn example(i: u8) -> Ranks {
        let mut ranks = [0u16; MAX_FANIN];
        for (j, r) in ranks.iter_mut().enumerate() {
            *r = u16::from(i) * 16 + j as u16 + 1;
        }
        Ranks {
            len: MAX_FANIN as u8,
            ranks,
        }
    }
}

impl OpField for u16 {
    fn example(i: u8) -> u16 {
        3 * u16::from(i)
    }
}

impl OpField for u32 {
    fn example(i: u8) -> u32 {
        0x101 * u32::from(i)
    }
}

impl OpField for u64 {
    fn example(i: u8) -> u64 {
        0x1_0000_0010 * u64::from(i)
    }
}

/// Where a trace record's op fields go.
pub(crate) trait FieldSink {
    /// Why a field could not be written.
    type Error;
    /// Writes one field.
    fn field<T: serde::Serialize>(&mut self, v: &T) -> Result<(), Self::Error>;
}

/// Where a trace record's op fields come from.
pub(crate) trait FieldSource {
    /// Why a field could not be read.
    type Error;
    /// Reads one field.
    fn field<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, Self::Error>;
}

/// Sorts `(name, code)` pairs by code (`plan::KINDS` lists the table in code order).
pub(crate) const fn by_code<const N: usize>(
    mut k: [(&'static str, u8); N],
) -> [(&'static str, u8); N] {
    let mut i = 1;
    while i < N {
        let mut j = i;
        while j > 0 && k[j - 1].1 > k[j].1 {
            let t = k[j];
            k[j] = k[j - 1];
            k[j - 1] = t;
            j -= 1;
        }
        i += 1;
    }
    k
}

/// Whether the codes are distinct.
pub(crate) const fn distinct<const N: usize>(k: &[(&'static str, u8); N]) -> bool {
    let mut i = 1;
    while i < N {
        if k[i - 1].1 == k[i].1 {
            return false;
        }
        i += 1;
    }
    true
}

/// Writes the ops table's items from its rows (see the module documentation).
macro_rules! ops {
    (@locs [$locs:path] $g:ident, $v:ident { $($f:ident)* }) => {
        $locs(Op::$v { $($f),* }, &mut $g)?
    };
    (@locs [] $g:ident, $v:ident { $($f:ident)* }) => {
        Op::$v { $( $f: $crate::op::table::OpField::map_loc($f, &mut $g)?, )* }
    };
    (@slot [slot] $x:ident, $p:ident, $s:ident) => { $s($x)? };
    (@slot [peer] $x:ident, $p:ident, $s:ident) => { $p($x)? };
    (@slot [$($other:tt)*] $x:ident, $p:ident, $s:ident) => { $x };
    (@cast multicast) => { true };
    (@cast unicast) => { false };
    (@reduces reduces) => { true };
    (@reduces) => { false };
    (@format [format] $x:ident, $r:ident) => { $r = Some(*$x) };
    (@format [$($other:tt)*] $x:ident, $r:ident) => { let _ = $x; };
    (@write [format] $x:ident, $s:ident) => { let _ = $x; };
    (@write [$($other:tt)*] $x:ident, $s:ident) => { $s.field($x)? };
    (@read [format] $t:ty, $s:ident, $fmt:ident) => { $fmt };
    (@read [$($other:tt)*] $t:ty, $s:ident, $fmt:ident) => { $s.field::<$t>()? };
    (@wide $op:ident, $tag:literal) => { $tag };
    (@wide $op:ident, $tag:literal, $wide:literal) => {
        if matches!($op.line_format(), Some(Format::Ll128)) { $wide } else { $tag }
    };
    ($(
        $(#[$doc:meta])*
        $v:ident = $tag:literal $(| $wide:literal)?, $cname:ident = $code:literal,
            $name:literal $(| $wname:literal)?,
            $cast:ident $($red:ident)? $(, locs = $locs:path)? {
            $( $(#[$fdoc:meta])* $f:ident : $t:ty => $($place:ident).+ $([$check:path])? ),* $(,)?
        }
    )*) => {
        /// One instruction.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum Op {
            $( $(#[$doc])* $v { $( $(#[$fdoc])* $f: $t, )* }, )*
        }

        /// The kind of an [`Op`], numbered by the stable tag table: the op tags of trace format
        /// version 4 ([`crate::trace`]). The table is append-only: a new op takes the next
        /// free number; an existing number never changes meaning and is never reused.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        #[non_exhaustive]
        pub enum OpKind {
            $( #[doc = concat!("[`Op::", stringify!($v), "`].")] $v = $tag, )*
        }

        /// The op kinds' codes in the plan encoding (`SYMM_OP_*` in `plan.cuh` and `symm.h`).
        pub mod code {
            $(
                #[doc = concat!("Plan code of [`Op::", stringify!($v), "`](super::Op::",
                    stringify!($v), ").")]
                pub const $cname: u8 = $code;
            )*
        }

        impl OpKind {
            /// How many kinds.
            pub const COUNT: usize = [$( OpKind::$v, )*].len();

            /// Every kind, in tag order (`ALL[t]` has tag `t`).
            pub const ALL: [OpKind; OpKind::COUNT] = [$( OpKind::$v, )*];

            /// Every kind's code name and plan code, in code order.
            pub const CODES: [(&'static str, u8); OpKind::COUNT] =
                table::by_code([$( (stringify!($cname), $code), )*]);

            /// The stable tag.
            pub const fn tag(self) -> u8 {
                self as u8
            }

            /// The kind with stable tag `tag`, if there is one.
            pub const fn from_tag(tag: u8) -> Option<OpKind> {
                let t = tag as usize;
                if t < OpKind::COUNT {
                    Some(OpKind::ALL[t])
                } else {
                    None
                }
            }

            /// The plan code ([`crate::plan`]; also the C ABI's `SYMM_OP_*`).
            pub const fn code(self) -> u8 {
                match self {
                    $( OpKind::$v => $code, )*
                }
            }

            /// The kind with plan code `code`, if there is one.
            pub const fn from_code(code: u8) -> Option<OpKind> {
                match code {
                    $( $code => Some(OpKind::$v), )*
                    _ => None,
                }
            }

            /// The name of the plan code (`SYMM_OP_<name>`).
            pub const fn code_name(self) -> &'static str {
                match self {
                    $( OpKind::$v => stringify!($cname), )*
                }
            }

            /// Short name.
            pub const fn name(self) -> &'static str {
                match self {
                    $( OpKind::$v => $name, )*
                }
            }

            /// Whether the kind is a multicast op (it addresses every rank's copy at once).
            pub const fn is_multicast(self) -> bool {
                match self {
                    $( OpKind::$v => ops!(@cast $cast), )*
                }
            }

            /// Whether the kind combines elements (a reduction of any form): its row's
            /// `reduces` column.
            pub const fn reduces(self) -> bool {
                match self {
                    $( OpKind::$v => ops!(@reduces $($red)?), )*
                }
            }

            /// The kind and line format that trace tag `tag` names: a kind's own tag names
            /// its 16-byte line form (or the kind, when it has no line format), the second tag
            /// of a row its 128-byte line form.
            pub const fn from_trace_tag(tag: u8) -> Option<(OpKind, Format)> {
                match tag {
                    $(
                        $tag => Some((OpKind::$v, Format::Ll)),
                        $( $wide => Some((OpKind::$v, Format::Ll128)), )?
                    )*
                    _ => None,
                }
            }

            /// The kind of `op`.
            pub const fn of(op: &Op) -> OpKind {
                match op {
                    $( Op::$v { .. } => OpKind::$v, )*
                }
            }
        }

        // Tags are dense and in table order; plan codes are distinct.
        const _: () = {
            let mut i = 0;
            while i < OpKind::COUNT {
                assert!(OpKind::ALL[i] as usize == i, "ops table rows go in tag order");
                i += 1;
            }
            assert!(table::distinct(&OpKind::CODES), "plan codes are distinct");
            assert!(
                table::distinct(&table::by_code([
                    $( ("", $tag), $( ("", $wide), )? )*
                ])),
                "trace tags are distinct"
            );
        };

        impl Op {
            /// The op with every rank-addressed location passed through `f`: each field of type
            /// [`Loc`] (the operands and destination of copies and reductions, the source of a
            /// multicast store, the destination of a multicast load-reduce, the regions of the
            /// low-latency ops) and each source of a k-way reduce (`f` must map the offset of a
            /// symmetric buffer the same on every rank: the first source's mapped buffer and
            /// offset are kept). Signals, waits and multicast locations are unchanged.
            pub fn map_locs<E>(self, mut f: impl FnMut(Loc) -> Result<Loc, E>) -> Result<Op, E> {
                Ok(match self {
                    $( Op::$v { $($f),* } => ops!(@locs [$($locs)?] f, $v { $($f)* }), )*
                })
            }

            /// The op with its signal-pad addressing passed through: the rank whose pad a
            /// signal updates through `peer`, every slot (of a signal, a wait, the epoch of a
            /// low-latency op) through `slot`.
            pub fn map_slots<E>(
                self,
                mut peer: impl FnMut(u16) -> Result<u16, E>,
                mut slot: impl FnMut(u32) -> Result<u32, E>,
            ) -> Result<Op, E> {
                Ok(match self {
                    $( Op::$v { $($f),* } => Op::$v {
                        $( $f: ops!(@slot [$($place).+] $f, peer, slot), )*
                    }, )*
                })
            }

            /// The op's places ([`OpFields`]); every place it does not use is zero.
            pub fn to_fields(&self) -> OpFields {
                let mut w = OpFields::new(self.kind());
                match *self {
                    $( Op::$v { $($f),* } => {
                        $( fields::Place::<$t>::put(&mut w.$($place).+, $f); )*
                    } )*
                }
                w
            }

            /// The op at `w`'s places, every field checked (places it does not use are
            /// ignored).
            pub fn from_fields(w: &OpFields) -> Result<Op, FieldError> {
                Ok(match w.kind {
                    $( OpKind::$v => {
                        $(
                            let $f: $t = fields::Place::<$t>::get(&w.$($place).+)?;
                            $( let $f = $check($f)?; )?
                        )*
                        Op::$v { $($f),* }
                    } )*
                })
            }

            /// An op of `kind` whose fields hold nonzero values, distinct among the fields of
            /// one type: what the table's tests send through every encoding.
            #[allow(unused_mut)]
            pub fn example(kind: OpKind) -> Op {
                let mut i = 0u8;
                match kind {
                    $( OpKind::$v => {
                        $( let $f = <$t as table::OpField>::example({ i += 1; i }); )*
                        Op::$v { $($f),* }
                    } )*
                }
            }

            /// The line format of a low-latency op (the field at its row's `format` place).
            #[allow(unused_mut, unused_assignments)]
            pub fn line_format(&self) -> Option<Format> {
                match self {
                    $( Op::$v { $($f),* } => {
                        let mut r: Option<Format> = None;
                        $( ops!(@format [$($place).+] $f, r); )*
                        r
                    } )*
                }
            }

            /// Short name of the op: its kind's, or its row's 128-byte line form's
            /// (`ll128_put`).
            pub fn kind_name(&self) -> &'static str {
                match self {
                    $( Op::$v { .. } => ops!(@wide self, $name $(, $wname)?), )*
                }
            }

            /// The op's tag in a trace: its kind's tag, or the tag of its row's 128-byte line
            /// form ([`OpKind::from_trace_tag`]).
            pub fn trace_tag(&self) -> u8 {
                match self {
                    $( Op::$v { .. } => ops!(@wide self, $tag $(, $wide)?), )*
                }
            }

            /// Writes the fields of a trace record, in declaration order (the line format is
            /// in the tag: [`Op::trace_tag`]).
            pub(crate) fn write_fields<S: table::FieldSink>(&self, s: &mut S) -> Result<(), S::Error> {
                match self {
                    $( Op::$v { $($f),* } => { $( ops!(@write [$($place).+] $f, s); )* } )*
                }
                Ok(())
            }

            /// Reads the fields of a trace record of `kind` whose tag named `format`.
            pub(crate) fn read_fields<S: table::FieldSource>(
                kind: OpKind,
                format: Format,
                s: &mut S,
            ) -> Result<Op, S::Error> {
                let _ = format;
                Ok(match kind {
                    $( OpKind::$v => {
                        $( let $f: $t = ops!(@read [$($place).+] $t, s, format); )*
                        Op::$v { $($f),* }
                    } )*
                })
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::super::{Loc, Op, OpKind};
    use crate::plan::{PlanError, PlanOp};

    /// The tag table is append-only and the plan codes are what the GPU kernels read: these
    /// numbers are part of the trace format and of `plan.cuh`.
    #[test]
    fn tags_and_codes_are_pinned() {
        let pinned = [
            (OpKind::Copy, 0, "copy", 0, "COPY"),
            (OpKind::Reduce, 1, "reduce", 1, "REDUCE"),
            (OpKind::Signal, 2, "signal", 2, "SIGNAL"),
            (OpKind::Wait, 3, "wait", 3, "WAIT"),
            (OpKind::ReduceN, 4, "reduce_n", 6, "REDUCE_N"),
            (OpKind::LlPut, 5, "ll_put", 7, "LL_PUT"),
            (OpKind::LlReduce, 6, "ll_reduce", 8, "LL_REDUCE"),
            (OpKind::McReduce, 7, "mc_reduce", 4, "MC_REDUCE"),
            (OpKind::McStore, 8, "mc_store", 5, "MC_STORE"),
        ];
        for (k, tag, name, code, code_name) in pinned {
            assert_eq!(k.tag(), tag, "{k:?}");
            assert_eq!(k.name(), name);
            assert_eq!(OpKind::from_tag(tag), Some(k));
            assert_eq!((k.code(), k.code_name()), (code, code_name), "{k:?}");
            assert_eq!(OpKind::from_code(code), Some(k));
        }
        for (t, k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(k.tag() as usize, t);
        }
        // The 128-byte line forms keep the trace tags of the ops they were before the line
        // format became a field; the reducing column.
        use crate::ll::Format;
        for (tag, want) in [
            (5, Some((OpKind::LlPut, Format::Ll))),
            (9, Some((OpKind::LlPut, Format::Ll128))),
            (10, Some((OpKind::LlReduce, Format::Ll128))),
            (11, None),
        ] {
            assert_eq!(OpKind::from_trace_tag(tag), want, "{tag}");
        }
        assert_eq!(OpKind::trace_tag_name(9), Some("ll128_put"));
        assert_eq!(OpKind::trace_tag_name(6), Some("ll_reduce"));
        assert_eq!(OpKind::trace_tag_name(11), None);
        let reducing: [OpKind; 4] = [
            OpKind::Reduce,
            OpKind::ReduceN,
            OpKind::LlReduce,
            OpKind::McReduce,
        ];
        for k in OpKind::ALL {
            assert_eq!(k.reduces(), reducing.contains(&k), "{k:?}");
        }
        assert_eq!(OpKind::from_tag(OpKind::ALL.len() as u8), None);
        assert_eq!(OpKind::from_tag(u8::MAX), None);
        assert_eq!(OpKind::from_code(u8::MAX), None);
        for w in OpKind::CODES.windows(2) {
            assert!(w[0].1 < w[1].1, "{:?}", OpKind::CODES);
        }
    }

    /// Every row's example is of its kind, round-trips through the flat form and the plan's
    /// bytes, and keeps its value under identity mappings of locations and slots.
    #[test]
    fn every_row_round_trips_through_the_plan() {
        for k in OpKind::ALL {
            let op = Op::example(k);
            assert_eq!(op.kind(), k);
            assert_eq!(Op::from_fields(&op.to_fields()), Ok(op), "{k:?}");
            let bytes = PlanOp::encode(&op).to_bytes();
            assert_eq!(bytes[0], k.code());
            let back = PlanOp::from_bytes(&bytes).and_then(|p| p.decode());
            assert_eq!(back, Ok(op), "{k:?}");
            assert_eq!(op.map_locs(Ok::<Loc, ()>), Ok(op));
            assert_eq!(op.map_slots(Ok::<u16, ()>, Ok::<u32, ()>), Ok(op));
        }
        let unknown = PlanOp {
            kind: 200,
            ..PlanOp::default()
        };
        assert_eq!(unknown.decode(), Err(PlanError::BadKind(200)));
    }

    /// `map_slots` moves the slot of every op that has one and the peer of a signal, nothing
    /// else; `map_locs` moves every location but multicast ones.
    #[test]
    fn mappings_touch_what_they_name() {
        for k in OpKind::ALL {
            let op = Op::example(k);
            let moved = op
                .map_slots(|p| Ok::<_, ()>(p + 1000), |s| Ok(s + 1000))
                .unwrap_or(op);
            let (f0, f1) = (op.to_fields(), moved.to_fields());
            let slot_moved = f1.slot != f0.slot;
            assert_eq!(slot_moved, f0.slot != 0, "{k:?}");
            assert_eq!(f1.peer != f0.peer, f0.peer != 0, "{k:?}");
            assert_eq!(
                (f1.a, f1.b, f1.dst, f1.count),
                (f0.a, f0.b, f0.dst, f0.count)
            );
            let shifted = op
                .map_locs(|l| Ok::<_, ()>(Loc::new(l.rank + 1, l.buf, l.offset)))
                .unwrap_or(op)
                .to_fields();
            for (was, now) in [(f0.a, shifted.a), (f0.b, shifted.b), (f0.dst, shifted.dst)] {
                // Every `Loc` example has a nonzero rank; multicast places have rank 0.
                let want = if was.rank == 0 { 0 } else { was.rank + 1 };
                assert_eq!((now.rank, now.buf, now.offset), (want, was.buf, was.offset));
            }
            assert_eq!((shifted.slot, shifted.peer), (f0.slot, f0.peer), "{k:?}");
        }
    }
}
