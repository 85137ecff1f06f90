//! What a checker found wrong, as a typed value that says itself in words.
//!
//! Every check ends in a [`Problem`] or a pass. A problem names ranks, ops and slots the way the
//! lab READMEs do ("rank 2's op 5", "slot data from rank 1"), and [`Problem::hint`] adds a
//! general hint; each lab adds its own, more specific one.

use std::fmt;
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::{Collective, Request};
use symm_core::signal::SlotLayout;
use symm_core::symbolic::Sym;
use symm_driver::host::{HostError, Mismatch};

/// One stream blocked at a wait when nothing could run any more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The waiting rank.
    pub rank: u16,
    /// Its op index.
    pub index: usize,
    /// The slot it waits on.
    pub slot: u32,
    /// The count the slot must reach.
    pub target: u64,
    /// The count it holds.
    pub found: u64,
    /// How many signals the slot's writer sends to it in its whole schedule.
    pub sent_in_all: u64,
}

/// What went wrong, in the student's terms.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Problem {
    /// The schedule function panicked while building a rank's ops.
    Panicked {
        /// The rank being built.
        rank: u16,
        /// The panic message and where it happened.
        message: String,
    },
    /// An op names a rank outside the world.
    RankOutside {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
        /// The rank it names.
        named: u16,
    },
    /// An op reaches past the end of a buffer or is not element aligned.
    OutsideBuffer {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
        /// The location.
        loc: Loc,
        /// Bytes it touches there.
        bytes: u64,
        /// Bytes the buffer has.
        size: u64,
    },
    /// A signal or wait names a slot that is not in the pad, or not this channel's.
    NoSuchSlot {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The slot.
        slot: u32,
    },
    /// A rank touches a peer's buffers before it waited for that peer's `Ready`
    /// ([`crate::rules::ready_before_touch`]).
    TouchBeforeReady {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
        /// The peer whose buffers it touches.
        peer: u16,
    },
    /// A rank touches a peer's buffers after every stream of that peer finished: the peer may
    /// already have returned, and its caller reuse the buffers.
    TouchAfterDone {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
        /// The finished peer.
        peer: u16,
    },
    /// A rank signals a slot that names another rank as its writer.
    ForeignSlot {
        /// The signalling rank.
        rank: u16,
        /// Op index.
        index: usize,
        /// The rank whose pad is signalled.
        peer: u16,
        /// The slot.
        slot: u32,
    },
    /// A reduction uses another element type or operator than the request.
    WrongType {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
    },
    /// Every unfinished rank waits for a signal that can no longer come.
    Deadlock {
        /// The blocked streams, following who waits for whom from the first.
        chain: Vec<Blocked>,
    },
    /// An op read data no one had written there yet.
    ReadUnwritten {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
        /// Where it read.
        loc: Loc,
    },
    /// A reduction combined different elements (operands at different data offsets).
    Mixed {
        /// The rank running the op.
        rank: u16,
        /// Op index.
        index: usize,
        /// The op.
        op: Op,
    },
    /// An output element holds the wrong contributions.
    Wrong {
        /// The rank.
        rank: u16,
        /// Element index in its output.
        elem: u64,
        /// What it holds.
        found: Sym,
        /// What the collective defines.
        want: Sym,
    },
    /// A slot received more signals than its owner waited for.
    Unbalanced {
        /// The owner.
        rank: u16,
        /// The slot.
        slot: u32,
        /// Signals received.
        pad: u64,
        /// Signals waited for.
        expected: u64,
    },
    /// A host backend computed other numbers than the reference.
    Numbers {
        /// Which backend.
        backend: &'static str,
        /// The first difference.
        mismatch: Mismatch,
        /// Whether the element found still holds the poison every output starts with.
        unwritten: bool,
    },
    /// A host backend refused or failed the run.
    Host {
        /// Which backend.
        backend: &'static str,
        /// Its error.
        error: HostError,
    },
    /// A finding of the lab's own checks, in words.
    Lab(String),
}

/// The words of a problem: the request gives slot and buffer names.
pub struct Words<'a> {
    /// The problem.
    pub problem: &'a Problem,
    /// The request it happened in.
    pub req: &'a Request,
}

fn buf_name(b: Buf) -> &'static str {
    match b {
        Buf::Input => "input",
        Buf::Output => "output",
        Buf::Scratch => "scratch",
    }
}

/// "data from rank 1", or the raw index when it is not a slot of the layout.
pub fn slot_words(layout: &SlotLayout, slot: u32) -> String {
    match layout.key(slot) {
        Some(k) if layout.channels > 1 => {
            format!(
                "'{} from rank {}' of channel {}",
                k.kind.name(),
                k.peer,
                k.channel
            )
        }
        Some(k) => format!("'{} from rank {}'", k.kind.name(), k.peer),
        None => format!("{slot} (outside the pad of {} slots)", layout.slots()),
    }
}

/// An element range of a location, in elements.
fn range_words(req: &Request, l: Loc, elems: u64) -> String {
    let es = req.dtype.size();
    let e = l.offset / es;
    format!(
        "rank {}'s {} [{e}..{})",
        l.rank,
        buf_name(l.buf),
        e.saturating_add(elems)
    )
}

/// `n` and its noun, singular for one: "1 element", "3 elements".
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// An op in words, in elements.
pub fn op_words(req: &Request, op: &Op) -> String {
    let es = req.dtype.size().max(1);
    let layout = req.layout();
    match *op {
        Op::Copy { src, dst, bytes } => format!(
            "copy of {} from {} to {}",
            count(bytes / es, "element"),
            range_words(req, src, bytes / es),
            range_words(req, dst, bytes / es)
        ),
        Op::Reduce {
            a, b, dst, elems, ..
        } => format!(
            "reduce of {} + {} into {}",
            range_words(req, a, elems),
            range_words(req, b, elems),
            range_words(req, dst, elems)
        ),
        Op::Signal { peer, slot, .. } => {
            format!("signal to rank {peer}'s slot {}", slot_words(&layout, slot))
        }
        Op::Wait { slot, count } => {
            format!("wait for {count} on slot {}", slot_words(&layout, slot))
        }
        Op::ReduceN {
            buf,
            offset,
            ranks,
            dst,
            elems,
            ..
        } => format!(
            "k-way reduce of ranks {:?}'s {} [{}..{}) into {}",
            ranks.as_slice(),
            buf_name(buf),
            offset / es,
            (offset / es).saturating_add(elems),
            range_words(req, dst, elems)
        ),
        Op::LlPut {
            src, dst, bytes, ..
        } => format!(
            "low-latency put of {} as lines into rank {}'s {} at byte {}",
            range_words(req, src, bytes / es),
            dst.rank,
            buf_name(dst.buf),
            dst.offset
        ),
        Op::LlReduce {
            src,
            sources,
            dst,
            elems,
            ..
        } => format!(
            "low-latency reduce of {sources} regions of rank {}'s {} from byte {} into {}",
            src.rank,
            buf_name(src.buf),
            src.offset,
            range_words(req, dst, elems)
        ),
        Op::McReduce {
            src, dst, elems, ..
        } => format!(
            "multicast reduce of every rank's {} [{}..{}) into {}",
            buf_name(src.buf),
            src.offset / es,
            (src.offset / es).saturating_add(elems),
            range_words(req, dst, elems)
        ),
        Op::McStore { src, dst, bytes } => format!(
            "multicast store of {} into every rank's {} [{}..{})",
            range_words(req, src, bytes / es),
            buf_name(dst.buf),
            dst.offset / es,
            dst.offset.saturating_add(bytes) / es
        ),
    }
}

/// Whether the collective's input (`true`) or output holds `world` blocks of `elems`.
fn blocks(req: &Request, input: bool) -> bool {
    match req.collective {
        Collective::ReduceScatter | Collective::Scatter { .. } => input,
        Collective::AllGather | Collective::Gather { .. } => !input,
        Collective::AllToAll => true,
        _ => false,
    }
}

/// A position in a buffer of the collective, with its block when the buffer has blocks.
fn position(req: &Request, input: bool, elem: u64) -> String {
    let n = req.elems().max(1);
    if blocks(req, input) {
        format!("element {elem} (block {}, element {})", elem / n, elem % n)
    } else {
        format!("element {elem}")
    }
}

/// A symbolic element in words.
pub fn sym_words(req: &Request, s: Sym) -> String {
    if s.count == 0 {
        return "nothing (it was never written)".into();
    }
    let ranks: Vec<u16> = (0..64u16).filter(|r| s.mask >> r & 1 == 1).collect();
    let at = position(req, true, s.index);
    if s.count == 1 && ranks.len() == 1 {
        return format!("rank {}'s input {at}", ranks[0]);
    }
    let list = ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut w = format!("the sum of input {at} over ranks {{{list}}}");
    if s.count as usize != ranks.len() {
        w += &format!(
            " with {} contributions from {} ranks (some rank counted more than once)",
            s.count,
            ranks.len()
        );
    }
    w
}

impl fmt::Display for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let req = self.req;
        let layout = req.layout();
        let op = |o: &Op| op_words(req, o);
        match self.problem {
            Problem::Panicked { rank, message } => {
                write!(
                    f,
                    "your schedule panicked building rank {rank}'s ops: {message}"
                )
            }
            Problem::RankOutside {
                rank,
                index,
                op: o,
                named,
            } => write!(
                f,
                "rank {rank}'s op {index} ({}) names rank {named}, but the world is ranks 0..={}",
                op(o),
                req.world - 1
            ),
            Problem::TouchBeforeReady {
                rank,
                index,
                op: o,
                peer,
            } => write!(
                f,
                "rank {rank}'s op {index} ({}) touches rank {peer}'s buffers before rank {rank} \
                 waited for rank {peer}'s Ready (or for it in a barrier): the rule 'Ready before \
                 touch' (rank {peer} may not have entered the collective yet)",
                op(o)
            ),
            Problem::TouchAfterDone {
                rank,
                index,
                op: o,
                peer,
            } => write!(
                f,
                "rank {rank}'s op {index} ({}) touches rank {peer}'s buffers after rank {peer}                  finished: rank {peer} may already have returned its output to its caller, who                  may read or reuse it (the rule 'nothing touches a rank after it finished')",
                op(o)
            ),
            Problem::OutsideBuffer {
                rank,
                index,
                op: o,
                loc,
                bytes,
                size,
            } => write!(
                f,
                "rank {rank}'s op {index} ({}) reaches bytes {}..{} of rank {}'s {}, which has \
                 {size} bytes{}",
                op(o),
                loc.offset,
                loc.offset.saturating_add(*bytes),
                loc.rank,
                buf_name(loc.buf),
                if loc.offset % req.dtype.size() != 0 {
                    " (and the offset is not a whole element)"
                } else {
                    ""
                }
            ),
            Problem::NoSuchSlot { rank, index, slot } => write!(
                f,
                "rank {rank}'s op {index} names slot {}",
                slot_words(&layout, *slot)
            ),
            Problem::ForeignSlot {
                rank,
                index,
                peer,
                slot,
            } => write!(
                f,
                "rank {rank}'s op {index} signals rank {peer}'s slot {}: a slot is written only \
                 by the rank it names",
                slot_words(&layout, *slot)
            ),
            Problem::WrongType { rank, index } => write!(
                f,
                "rank {rank}'s op {index} reduces with another element type or operator than \
                 the request ({:?}, {:?})",
                req.dtype, req.op
            ),
            Problem::Deadlock { chain } => {
                writeln!(
                    f,
                    "deadlock: every unfinished rank waits, and no signal can come"
                )?;
                for b in chain {
                    let from = layout.key(b.slot).map(|k| k.peer);
                    write!(
                        f,
                        "  rank {} (op {}) waits on slot {} for signal #{}; it has {}",
                        b.rank,
                        b.index,
                        slot_words(&layout, b.slot),
                        b.target,
                        b.found
                    )?;
                    match from {
                        Some(p) if b.sent_in_all < b.target => writeln!(
                            f,
                            ", and rank {p} sends only {} such signal(s) in its whole schedule",
                            b.sent_in_all
                        )?,
                        Some(p) => writeln!(f, ": rank {p} has not sent it yet")?,
                        None => writeln!(f)?,
                    }
                }
                Ok(())
            }
            Problem::ReadUnwritten {
                rank,
                index,
                op: o,
                loc,
            } => write!(
                f,
                "rank {rank}'s op {index} ({}) reads rank {}'s {} at element {} before anything \
                 was written there",
                op(o),
                loc.rank,
                buf_name(loc.buf),
                loc.offset / req.dtype.size()
            ),
            Problem::Mixed { rank, index, op: o } => write!(
                f,
                "rank {rank}'s op {index} ({}) adds up different elements: its operands hold \
                 data of different positions",
                op(o)
            ),
            Problem::Wrong {
                rank,
                elem,
                found,
                want,
            } => write!(
                f,
                "rank {rank}'s output {} holds {}; it should hold {}",
                position(req, false, *elem),
                sym_words(req, *found),
                sym_words(req, *want)
            ),
            Problem::Unbalanced {
                rank,
                slot,
                pad,
                expected,
            } => write!(
                f,
                "rank {rank}'s slot {} received {} but rank {rank} waited for only \
                 {expected}: every signal must be waited for in the same collective",
                slot_words(&layout, *slot),
                count(*pad, "signal")
            ),
            Problem::Numbers {
                backend,
                mismatch: m,
                unwritten,
            } => {
                let at = position(req, false, m.elem as u64);
                if *unwritten {
                    write!(
                        f,
                        "on the {backend}, rank {}'s output {at} was never written; the \
                         reference has {}",
                        m.rank, m.want
                    )
                } else {
                    write!(
                        f,
                        "on the {backend}, rank {}'s output {at} is {}; the reference has {}",
                        m.rank, m.found, m.want
                    )
                }
            }
            Problem::Host { backend, error } => write!(f, "the {backend} failed: {error}"),
            Problem::Lab(s) => f.write_str(s),
        }
    }
}

impl Problem {
    /// The problem in words.
    pub fn words<'a>(&'a self, req: &'a Request) -> Words<'a> {
        Words { problem: self, req }
    }

    /// A general hint for this kind of problem.
    pub fn hint(&self) -> Option<&'static str> {
        Some(match self {
            Problem::Panicked { message, .. } if message.contains("overflow") => {
                "rank arithmetic wraps around the world: the rank before 0 is world - 1, so \
                 write (rank + world - 1) % world rather than rank - 1 (k.prev() and k.next() do it)"
            }
            Problem::Panicked { .. } => "the message above says where; the checker ran nothing",
            Problem::RankOutside { .. } => {
                "ranks are 0..world-1: wrap around with % world (k.next(), k.prev())"
            }
            Problem::TouchBeforeReady { .. } => {
                "wait for the peer's Ready (k.wait(peer, Ready, 1)), or pass a barrier, before the \
                 first op that reads or writes its buffers; the peer signals when it enters"
            }
            Problem::TouchAfterDone { .. } => {
                "a rank may finish only once nothing will touch its buffers: before it returns it \
                 waits for the signal each peer sends after its last touch (a Done handshake), \
                 and every write into it comes before the signal that announces it"
            }
            Problem::OutsideBuffer { .. } => {
                "offsets are in elements through k.at(rank, buf, elem); check the block or \
                 segment arithmetic against the buffer sizes in the README"
            }
            Problem::NoSuchSlot { .. } => "build slots with k.signal / k.wait / k.slot",
            Problem::ForeignSlot { .. } => {
                "k.signal(peer, kind) names you as the writer; the peer waits with \
                 k.wait(you, kind, 1)"
            }
            Problem::WrongType { .. } => "build reductions with k.reduce",
            Problem::Deadlock { .. } => {
                "for each wait, find the signal that satisfies it: which rank sends it, and is \
                 that rank itself waiting for you first?"
            }
            Problem::ReadUnwritten { .. } => {
                "data written by another rank may be read only after waiting for the signal \
                 its writer sends once the data is in place"
            }
            Problem::Mixed { .. } => {
                "both operands and the destination of a reduce must be the same elements of the \
                 data (same block or segment, same offset inside it)"
            }
            Problem::Wrong { .. } => {
                "follow that output element back: which op wrote it last, and what did it read?"
            }
            Problem::Unbalanced { .. } => {
                "a signal no one waits for leaves the counter ahead, and the next collective \
                 then passes a wait early: wait once for each signal sent to you"
            }
            Problem::Numbers {
                unwritten: true, ..
            } => "no op wrote there: which rank's data belongs at that place?",
            Problem::Numbers { .. } => {
                "the contribution check passed but the numbers differ: two ranks probably write \
                 the same bytes at once (a missing wait), which only real threads show"
            }
            Problem::Host { .. } | Problem::Lab(_) => return None,
        })
    }
}
