//! Conversions between the C structs and symm-core's types; every code is checked.

use std::time::Duration;

use symm_core::cost::Link;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Fanin, FieldError, Op, OpFields, OpKind, RawLoc};
use symm_core::sched::{Algorithm, BufferSizes, Collective, Request};
use symm_core::trace::{Event, EventKind};
use symm_driver::cuda::{Buffers, CommOptions};

use crate::error::Error;
use crate::types::codes::{self, COLLECTIVES};
use crate::types::{
    symm_buffer_sizes, symm_buffers, symm_comm_options, symm_event, symm_link, symm_loc, symm_op,
    symm_request,
};

fn code<T: Copy>(table: &[T], field: &'static str, value: u32) -> Result<T, Error> {
    table.get(value as usize).copied().ok_or(Error::BadCode {
        field,
        value: value.into(),
    })
}

/// A one-byte code through the core type's own `from_u8`.
fn byte_code<T>(v: u32, field: &'static str, from: fn(u8) -> Option<T>) -> Result<T, Error> {
    u8::try_from(v).ok().and_then(from).ok_or(Error::BadCode {
        field,
        value: v.into(),
    })
}

fn dtype(v: u32) -> Result<DType, Error> {
    byte_code(v, "dtype", DType::from_u8)
}

fn redop(v: u32) -> Result<ReduceOp, Error> {
    byte_code(v, "redop", ReduceOp::from_u8)
}

impl symm_request {
    /// The core request (codes checked; not validated: see [`Request::validate`]), refused in
    /// deterministic mode (`SYMM_REQUEST_DETERMINISTIC`) where its algorithm cannot honour it.
    pub fn to_core(&self) -> Result<Request, Error> {
        let collective = match code(&COLLECTIVES, "collective", self.collective)? {
            Collective::Broadcast { .. } => Collective::Broadcast { root: self.root },
            Collective::Reduce { .. } => Collective::Reduce { root: self.root },
            Collective::Scatter { .. } => Collective::Scatter { root: self.root },
            Collective::Gather { .. } => Collective::Gather { root: self.root },
            Collective::SendRecv { .. } => Collective::SendRecv {
                src: self.src,
                dst: self.dst,
            },
            c => c,
        };
        if self.flags & !codes::REQUEST_DETERMINISTIC != 0 {
            return Err(Error::BadCode {
                field: "flags",
                value: self.flags.into(),
            });
        }
        let slots = u8::try_from(self.slots).map_err(|_| Error::Range {
            what: "slots",
            value: self.slots.into(),
            max: u8::MAX.into(),
        })?;
        let req = Request::new(
            collective,
            code(&Algorithm::ALL, "algorithm", self.algorithm)?,
            self.world,
            self.bytes,
            dtype(self.dtype)?,
            redop(self.redop)?,
        )
        .with_channels(self.channels)
        .with_pipeline(self.chunk_bytes, slots);
        if self.deterministic() {
            return Ok(req.deterministic()?);
        }
        Ok(req)
    }

    /// The core request, validated.
    pub fn validated(&self) -> Result<Request, Error> {
        let req = self.to_core()?;
        req.validate()?;
        Ok(req)
    }

    /// Whether `SYMM_REQUEST_DETERMINISTIC` is set.
    pub fn deterministic(&self) -> bool {
        self.flags & codes::REQUEST_DETERMINISTIC != 0
    }
}

impl symm_loc {
    fn of(l: RawLoc) -> symm_loc {
        symm_loc {
            rank: l.rank,
            reserved: 0,
            buf: l.buf.into(),
            offset: l.offset,
        }
    }

    fn raw(self) -> RawLoc {
        RawLoc {
            rank: self.rank,
            buf: narrow(self.buf),
            offset: self.offset,
        }
    }
}

/// A one-byte code of a C field: a wider value becomes 255, which no code uses, so it is refused
/// where the op reads the field and ignored where the op does not use it.
fn narrow(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

impl From<FieldError> for Error {
    fn from(e: FieldError) -> Error {
        let (field, value) = match e {
            FieldError::BadBuf(v) => ("buf", v.into()),
            FieldError::BadDType(v) => ("dtype", v.into()),
            FieldError::BadReduceOp(v) => ("redop", v.into()),
            FieldError::BadSignalOp(v) => ("sigop", v.into()),
            FieldError::BadFanin(n) => ("nsources", n.into()),
            FieldError::BadFormat(v) => ("format", v.into()),
            _ => ("op", 0),
        };
        Error::BadCode { field, value }
    }
}

impl symm_op {
    /// The C form of an op: its places ([`OpFields`]) in the struct's fields.
    pub fn of(op: &Op) -> symm_op {
        let w = op.to_fields();
        symm_op {
            kind: w.kind.code().into(),
            dtype: w.dtype.into(),
            redop: w.redop.into(),
            sigop: w.sigop.into(),
            a: symm_loc::of(w.a),
            b: symm_loc::of(w.b),
            dst: symm_loc::of(w.dst),
            count: w.count,
            slot: w.slot,
            div: w.div,
            peer: w.peer,
            nsources: w.fanin.n,
            format: w.format.into(),
            sources_lo: w.fanin.lo,
            sources_hi: w.fanin.hi,
        }
    }

    /// The core op (every code checked).
    pub fn to_core(&self) -> Result<Op, Error> {
        let kind = u8::try_from(self.kind)
            .ok()
            .and_then(OpKind::from_code)
            .ok_or(Error::BadCode {
                field: "kind",
                value: self.kind.into(),
            })?;
        let w = OpFields {
            kind,
            a: self.a.raw(),
            b: self.b.raw(),
            dst: self.dst.raw(),
            count: self.count,
            slot: self.slot,
            div: self.div,
            dtype: narrow(self.dtype),
            redop: narrow(self.redop),
            sigop: narrow(self.sigop),
            peer: self.peer,
            fanin: Fanin {
                n: self.nsources,
                lo: self.sources_lo,
                hi: self.sources_hi,
            },
            format: narrow(self.format),
        };
        Ok(Op::from_fields(&w)?)
    }
}

impl symm_link {
    /// The C form of a link.
    pub fn of(l: &Link) -> symm_link {
        symm_link {
            launch_us: l.launch_us,
            alpha_us: l.alpha_us,
            beta_bytes_per_us: l.beta_bytes_per_us,
            multicast_bytes_per_us: l.multicast_bytes_per_us,
        }
    }

    /// A named link (`SYMM_LINK_*`).
    pub fn preset(code: u32) -> Result<symm_link, Error> {
        match code {
            codes::LINK_NVLINK4 => Ok(symm_link::of(&Link::NVLINK4)),
            codes::LINK_HOST => Ok(symm_link::of(&Link::HOST)),
            v => Err(Error::BadCode {
                field: "link preset",
                value: v.into(),
            }),
        }
    }

    /// The core link: every field finite and non-negative, the bandwidth positive.
    pub fn to_core(&self) -> Result<Link, Error> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        for (field, v) in [
            ("launch_us", self.launch_us),
            ("alpha_us", self.alpha_us),
            ("multicast_bytes_per_us", self.multicast_bytes_per_us),
        ] {
            if !ok(v) {
                return Err(Error::Link { field });
            }
        }
        if !(ok(self.beta_bytes_per_us) && self.beta_bytes_per_us > 0.0) {
            return Err(Error::Link {
                field: "beta_bytes_per_us",
            });
        }
        Ok(Link {
            launch_us: self.launch_us,
            alpha_us: self.alpha_us,
            beta_bytes_per_us: self.beta_bytes_per_us,
            multicast_bytes_per_us: self.multicast_bytes_per_us,
        })
    }
}

impl symm_event {
    /// The core event (codes checked; the rank and channel are checked by the writer).
    pub fn to_core(&self) -> Result<Event, Error> {
        let kind = match self.kind {
            codes::EVENT_BEGIN => EventKind::Begin,
            codes::EVENT_END => EventKind::End,
            codes::EVENT_STALL => EventKind::Stall {
                target: self.stall_target,
                found: self.stall_found,
            },
            v => {
                return Err(Error::BadCode {
                    field: "event kind",
                    value: v.into(),
                })
            }
        };
        Ok(Event {
            time: self.time,
            rank: self.rank,
            channel: self.channel,
            index: self.index,
            kind,
            op: self.op.to_core()?,
            contents: (self.has_contents != 0).then_some(self.contents),
        })
    }
}

impl symm_comm_options {
    /// The runtime's options: zero fields take the defaults; the ranges are checked when the
    /// communicator opens; an unknown flag is refused.
    pub fn to_options(&self) -> Result<CommOptions, Error> {
        if self.flags & !codes::COMM_DETERMINISTIC != 0 {
            return Err(Error::BadCode {
                field: "flags",
                value: self.flags,
            });
        }
        let d = CommOptions::default();
        let ms = |v: u64, default: Duration| {
            if v == 0 {
                default
            } else {
                Duration::from_millis(v)
            }
        };
        Ok(CommOptions {
            heap_bytes: if self.heap_bytes == 0 {
                d.heap_bytes
            } else {
                self.heap_bytes
            },
            timeout: ms(self.timeout_ms, d.timeout),
            bootstrap_timeout: ms(self.bootstrap_timeout_ms, d.bootstrap_timeout),
            deterministic: self.flags & codes::COMM_DETERMINISTIC != 0,
            ..d
        })
    }
}

impl symm_buffers {
    /// The C struct of placed buffers.
    pub fn of(b: &Buffers) -> symm_buffers {
        symm_buffers {
            input: b.input,
            output: b.output,
            scratch: b.scratch,
            sizes: symm_buffer_sizes {
                input: b.sizes.input,
                output: b.sizes.output,
                scratch: b.sizes.scratch,
            },
        }
    }

    /// The runtime's buffers (offsets and sizes are checked by the runtime against its heap).
    pub fn to_buffers(&self) -> Buffers {
        Buffers {
            input: self.input,
            output: self.output,
            scratch: self.scratch,
            sizes: BufferSizes {
                input: self.sizes.input,
                output: self.sizes.output,
                scratch: self.sizes.scratch,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::op::{Buf, Loc, Ranks};
    use symm_core::sched::{collectives, pairs, Schedule};

    fn c_request(req: &Request) -> symm_request {
        let code = COLLECTIVES
            .iter()
            .position(|c| c.name() == req.collective.name())
            .unwrap() as u32;
        let (root, src, dst) = match req.collective {
            Collective::Broadcast { root }
            | Collective::Reduce { root }
            | Collective::Scatter { root }
            | Collective::Gather { root } => (root, 0, 0),
            Collective::SendRecv { src, dst } => (0, src, dst),
            _ => (0, 0, 0),
        };
        symm_request {
            collective: code,
            algorithm: Algorithm::ALL
                .iter()
                .position(|&a| a == req.algorithm)
                .unwrap() as u32,
            dtype: req.dtype as u32,
            redop: req.op as u32,
            world: req.world,
            channels: req.channels,
            root,
            src,
            dst,
            flags: 0,
            slots: req.slots.into(),
            bytes: req.bytes,
            chunk_bytes: req.chunk_bytes,
        }
    }

    /// Fused and low-latency ops from C: source counts of 0 or past 8, and ranks past the
    /// count, are typed errors; valid ones round-trip.
    #[test]
    fn hostile_k_way_and_ll_ops_are_refused() {
        let n = Op::ReduceN {
            buf: Buf::Input,
            offset: 16,
            ranks: Ranks::new(&[2, 0, 1]).unwrap(),
            dst: Loc::new(1, Buf::Output, 0),
            elems: 4,
            dtype: DType::Bf16,
            op: ReduceOp::Sum,
            div: 1,
        };
        let c = symm_op::of(&n);
        assert_eq!(c.to_core().unwrap(), n);
        for (nsources, lo, hi) in [
            (0u16, c.sources_lo, 0u64),
            (9, c.sources_lo, 0),
            (3, c.sources_lo, 5),
        ] {
            let bad = symm_op {
                nsources,
                sources_lo: lo,
                sources_hi: hi,
                ..c
            };
            assert!(
                matches!(
                    bad.to_core(),
                    Err(Error::BadCode {
                        field: "nsources",
                        ..
                    })
                ),
                "{nsources} {hi}"
            );
        }
        let ll = Op::LlReduce {
            format: symm_core::ll::Format::Ll128,
            src: Loc::new(0, Buf::Scratch, 0),
            stride: 4096,
            sources: 2,
            dst: Loc::new(0, Buf::Output, 0),
            elems: 8,
            dtype: DType::F32,
            op: ReduceOp::Max,
            div: 1,
            slot: 17,
            flip: 8192,
        };
        let c = symm_op::of(&ll);
        assert_eq!(c.to_core().unwrap(), ll);
        let none = symm_op { nsources: 0, ..c };
        assert!(matches!(none.to_core(), Err(Error::BadCode { .. })));
        let unknown = symm_op { format: 7, ..c };
        assert!(matches!(
            unknown.to_core(),
            Err(Error::BadCode {
                field: "format",
                value: 7
            })
        ));
    }

    #[test]
    fn every_collective_has_a_code() {
        for c in collectives(5) {
            assert!(COLLECTIVES.iter().any(|k| k.name() == c.name()), "{c:?}");
        }
        assert!(COLLECTIVES.contains(&Collective::AllToAllV));
    }

    #[test]
    fn requests_and_ops_round_trip() {
        for (c, a) in pairs(5) {
            let req = Request::new(c, a, 5, 4000, DType::F32, ReduceOp::Avg)
                .with_channels(2)
                .with_pipeline(512, 3);
            assert_eq!(c_request(&req).to_core().unwrap(), req);
            for op in Schedule::new(req, 3, 1).unwrap() {
                assert_eq!(symm_op::of(&op).to_core().unwrap(), op);
            }
        }
    }

    #[test]
    fn bad_codes_and_links_are_refused() {
        let mut r = c_request(&Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            4,
            1024,
            DType::F32,
            ReduceOp::Sum,
        ));
        r.dtype = 99;
        assert!(matches!(r.to_core(), Err(Error::BadCode { .. })));
        r.dtype = 0;
        r.slots = 256;
        assert!(matches!(r.to_core(), Err(Error::Range { .. })));
        let op = symm_op {
            kind: 6,
            ..Default::default()
        };
        assert!(op.to_core().is_err());
        let mut l = symm_link::preset(codes::LINK_NVLINK4).unwrap();
        assert_eq!(l.to_core().unwrap(), Link::NVLINK4);
        l.beta_bytes_per_us = 0.0;
        assert!(l.to_core().is_err());
        l.beta_bytes_per_us = f64::NAN;
        assert!(l.to_core().is_err());
    }
}
