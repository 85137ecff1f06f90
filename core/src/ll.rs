//! The low-latency (LL) protocol: data and flag travel together.
//!
//! A small message should cost one trip over the link, not a put, then a signal, then a wait.
//! LL makes the data its own signal. The sender writes every 8 bytes of data as one 16-byte
//! *line* `[d0 flag d1 flag]` (4-byte little-endian words) into the receiver's memory, each
//! 8-byte half `[data word, flag]` with one single-copy-atomic store. The receiver polls its own
//! memory until both halves of every line it needs carry this call's flag, and then holds the
//! data: no signal, no fence, no barrier. A line costs twice its data, so LL is for small
//! messages; [`MAX_BYTES`] bounds the data of one LL call on one channel.
//!
//! **The flag of a call.** Every LL call first advances the rank's own `Epoch` slot of its
//! (team, channel): a signal to itself and a wait for it, both local. The executor's counter
//! for that slot, `e`, then counts the LL calls of the (team, channel) on every rank alike, and
//! the call's flag is [`flag`]`(e)`: `e mod (2^32 - 1) + 1`, never zero (so memory that was
//! never written cannot match) and different from the flags of the calls before it. Data left
//! in the region by anything else matches both flags of a line with chance 2^-64.
//!
//! **Reuse without a barrier.** Call `e` writes into half `e & 1` of the receiver's region
//! ([`half`]). A sender reaches call `e + 2` only after finishing call `e + 1`, which needed the
//! receiver's lines of call `e + 1`, which the receiver wrote after it finished reading call
//! `e`; so a half is never overwritten while it is read. The region belongs to LL alone and to one
//! request: a collective of another algorithm, or an LL request of another size or channel count
//! (whose regions lie elsewhere), must not share the scratch buffer of an LL collective.
//!
//! Executors take the epoch from their counters and pass it to [`crate::exec::Fabric::ll`];
//! [`lines`], [`pack`] and [`unpack`] are the one definition of the line format, which the host
//! memory, the simulator's shadow and the GPU interpreter follow.
//!
//! **128-byte lines** ([`Format::Ll128`], the `format` of [`crate::op::Op::LlPut`] and
//! [`crate::op::Op::LlReduce`]). An 8-byte line wastes half of what it moves; a 128-byte line
//! carries 120 data bytes in its first 15 words and the call's flag in its last word, so it
//! wastes a sixteenth. The data words no longer carry the flag, so one store no longer covers
//! both: the writer stores the 15 data words, then stores the flag word with *release*
//! ([`crate::signal::order::LL128_PUBLISH`]), and the reader loads the flag word with *acquire*
//! ([`crate::signal::order::LL128_OBSERVE`]) and only then the data words. A reader that sees
//! the call's flag therefore sees the line's data of that call, whatever the hardware does with
//! a 128-byte store (the protocol does not lean on a line arriving whole). The epoch, the flag
//! values, the halves and the reuse argument are the 16-byte lines' own; regions of the two
//! formats are never the same bytes ([`crate::sched`] gives each algorithm its own), because
//! a 128-byte line's data word could hold any bit pattern, a 16-byte line's flag included.
//! [`pack128`] and [`unpack128`] are the one definition of that line.

/// Bytes of data one LL line carries.
pub const LINE_DATA: u64 = 8;
/// Bytes of one LL line in memory.
pub const LINE_BYTES: u64 = 16;
/// The most data bytes one LL call moves per rank on one channel (the region of a source is
/// twice this, per half).
pub const MAX_BYTES: u64 = 64 << 10;

/// The most channels an LL call splits its message over (each with regions of its own).
pub const MAX_CHANNELS: u16 = 16;

/// The alignment, in bytes, of every region of lines (of either format) and of the distances
/// between them (a stride, a half offset): what the GPU's 16-byte line stores need.
pub const ALIGN: u64 = 16;

/// A line format of the low-latency protocol: a field of the low-latency ops
/// ([`crate::op::Op::LlPut`], [`crate::op::Op::LlReduce`]), so both formats share one op, one
/// implementation in every executor, and one kernel family on the GPU (templated on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum Format {
    /// 16-byte lines of 8 data bytes, the flag in each 8-byte half ([`pack`]).
    Ll = 0,
    /// 128-byte lines of 120 data bytes and a flag word stored last, with release
    /// ([`pack128`]).
    Ll128 = 1,
}

impl Format {
    /// Every format, by wire value.
    pub const ALL: [Format; 2] = [Format::Ll, Format::Ll128];

    /// Decodes a wire value (the plan's and the C ABI's `format`).
    pub const fn from_u8(v: u8) -> Option<Format> {
        match v {
            0 => Some(Format::Ll),
            1 => Some(Format::Ll128),
            _ => None,
        }
    }

    /// Short name.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Ll => "ll",
            Format::Ll128 => "ll128",
        }
    }

    /// Data bytes one line carries.
    pub const fn data(self) -> u64 {
        match self {
            Format::Ll => LINE_DATA,
            Format::Ll128 => LINE128_DATA,
        }
    }

    /// Bytes of one line in memory.
    pub const fn line(self) -> u64 {
        match self {
            Format::Ll => LINE_BYTES,
            Format::Ll128 => LINE128_BYTES,
        }
    }

    /// The most data bytes one call of this format moves per rank on one channel.
    pub const fn max_bytes(self) -> u64 {
        match self {
            Format::Ll => MAX_BYTES,
            Format::Ll128 => MAX_BYTES_128,
        }
    }

    /// Lines needed for `bytes` of data.
    pub const fn lines(self, bytes: u64) -> u64 {
        bytes.div_ceil(self.data())
    }

    /// Bytes of memory the lines of `bytes` of data take (saturating).
    pub const fn line_bytes(self, bytes: u64) -> u64 {
        self.lines(bytes).saturating_mul(self.line())
    }

    /// The most bytes of one source's region in one half: the lines of [`Format::max_bytes`]
    /// (a request's regions hold the lines of its own largest channel part, see
    /// [`crate::sched`]'s low-latency programs).
    pub const fn region(self) -> u64 {
        self.line_bytes(self.max_bytes())
    }
}

/// Data bytes of a 128-byte line: 15 words.
pub const LINE128_DATA: u64 = 120;
/// Bytes of a 128-byte line: 15 data words and the flag word.
pub const LINE128_BYTES: u64 = 128;
/// Data words of a 128-byte line (words 0 to 14); the flag is the last word.
pub const LINE128_DATA_WORDS: usize = 15;
/// Words of a 128-byte line.
pub const LINE128_WORDS: usize = 16;
/// The most data bytes one 128-byte-line call moves per rank on one channel (1024 lines: a
/// region of 128 KiB per source and half).
pub const MAX_BYTES_128: u64 = 1024 * LINE128_DATA;

/// The channels an LL call of `channels` channels uses: at least one, at most [`MAX_CHANNELS`].
pub const fn channels(channels: u16) -> u16 {
    if channels == 0 {
        1
    } else if channels > MAX_CHANNELS {
        MAX_CHANNELS
    } else {
        channels
    }
}

/// The flag of the call whose epoch counter is `e`: never zero, distinct for consecutive calls.
pub const fn flag(e: u64) -> u32 {
    (e % 0xFFFF_FFFF) as u32 + 1
}

/// Which half of a region call `e` uses (0 or 1).
pub const fn half(e: u64) -> u64 {
    e & 1
}

/// Lines needed for `bytes` of data.
pub const fn lines(bytes: u64) -> u64 {
    bytes.div_ceil(LINE_DATA)
}

/// Bytes of memory the lines of `bytes` of data take.
pub const fn line_bytes(bytes: u64) -> u64 {
    lines(bytes).saturating_mul(LINE_BYTES)
}

/// Where half `half(epoch)` of the lines that start at `l` (half 0) lies, `flip` bytes on for
/// odd epochs; `None` when the offset overflows.
pub fn at(l: crate::op::Loc, flip: u64, epoch: u64) -> Option<crate::op::Loc> {
    let offset = half(epoch).checked_mul(flip)?.checked_add(l.offset)?;
    Some(crate::op::Loc { offset, ..l })
}

/// Region `s` of an `LlReduce` whose regions start at `src`, `stride` bytes apart, in the half
/// of `epoch`; `None` when the offset overflows.
pub fn region(
    src: crate::op::Loc,
    stride: u64,
    s: u64,
    flip: u64,
    epoch: u64,
) -> Option<crate::op::Loc> {
    let first = s.checked_mul(stride)?.checked_add(src.offset)?;
    at(
        crate::op::Loc {
            offset: first,
            ..src
        },
        flip,
        epoch,
    )
}

/// Bytes from `src` that an `LlReduce` of `sources` regions, `stride` apart, of the lines of
/// `bytes` of data may touch over both halves (saturating: an absurd op gets a span no buffer
/// holds).
pub fn reduce_span(sources: u16, stride: u64, flip: u64, bytes: u64) -> u64 {
    reduce_span_of(Format::Ll, sources, stride, flip, bytes)
}

/// [`reduce_span`] for lines of `format`.
pub fn reduce_span_of(format: Format, sources: u16, stride: u64, flip: u64, bytes: u64) -> u64 {
    (sources.saturating_sub(1) as u64)
        .saturating_mul(stride)
        .saturating_add(flip)
        .saturating_add(format.line_bytes(bytes))
}

/// Bytes from `dst` that an `LlPut` of `bytes` of data may touch over both halves.
pub fn put_span(flip: u64, bytes: u64) -> u64 {
    put_span_of(Format::Ll, flip, bytes)
}

/// [`put_span`] for lines of `format`.
pub fn put_span_of(format: Format, flip: u64, bytes: u64) -> u64 {
    format.line_bytes(bytes).saturating_add(flip)
}

/// One line from up to 8 data bytes (shorter data is padded with zeros) and a flag: the two
/// 8-byte halves, each stored with one atomic store.
pub fn pack(data: &[u8], flag: u32) -> [u64; 2] {
    let mut d = [0u8; 8];
    let n = data.len().min(8);
    d[..n].copy_from_slice(&data[..n]);
    let w0 = u32::from_le_bytes([d[0], d[1], d[2], d[3]]) as u64;
    let w1 = u32::from_le_bytes([d[4], d[5], d[6], d[7]]) as u64;
    let f = (flag as u64) << 32;
    [w0 | f, w1 | f]
}

/// The 8 data bytes of a line whose halves both carry `flag`, else `None`.
pub fn unpack(halves: [u64; 2], flag: u32) -> Option<[u8; 8]> {
    if (halves[0] >> 32) as u32 != flag || (halves[1] >> 32) as u32 != flag {
        return None;
    }
    let mut d = [0u8; 8];
    d[..4].copy_from_slice(&(halves[0] as u32).to_le_bytes());
    d[4..].copy_from_slice(&(halves[1] as u32).to_le_bytes());
    Some(d)
}

/// The 15 data words of a 128-byte line from up to 120 data bytes (shorter data is padded with
/// zeros); the flag word, `flag` as a `u64`, is stored after them with release.
pub fn pack128(data: &[u8]) -> [u64; LINE128_DATA_WORDS] {
    let mut words = [0u64; LINE128_DATA_WORDS];
    for (w, chunk) in words.iter_mut().zip(data.chunks(8)) {
        let mut d = [0u8; 8];
        d[..chunk.len()].copy_from_slice(chunk);
        *w = u64::from_le_bytes(d);
    }
    words
}

/// The flag word of a 128-byte line of the call whose flag is `flag`.
pub const fn flag128(flag: u32) -> u64 {
    flag as u64
}

/// The 120 data bytes of a 128-byte line whose flag word (loaded with acquire, before the
/// data words) is `flag128(flag)`, else `None`.
pub fn unpack128(flag_word: u64, data: &[u64; LINE128_DATA_WORDS], flag: u32) -> Option<[u8; 120]> {
    if flag_word != flag128(flag) {
        return None;
    }
    let mut d = [0u8; 120];
    for (chunk, w) in d.chunks_exact_mut(8).zip(data) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_never_zero_and_change_every_call() {
        // Within the 64-bit counter (2^64 calls never happen), across the 32-bit flag's wrap.
        for e in [
            0u64,
            1,
            2,
            0xFFFF_FFFD,
            0xFFFF_FFFE,
            0xFFFF_FFFF,
            u64::MAX - 2,
        ] {
            assert_ne!(flag(e), 0, "{e}");
            assert_ne!(flag(e), flag(e + 1), "{e}");
            assert_ne!(flag(e), flag(e + 2), "{e}");
        }
        assert_eq!((half(6), half(7)), (0, 1));
    }

    #[test]
    fn lines_round_trip_and_refuse_other_flags() {
        let l = pack(&[1, 2, 3, 4, 5, 6, 7, 8], 9);
        assert_eq!(unpack(l, 9), Some([1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(unpack(l, 8), None);
        assert_eq!(unpack([l[0], 0], 9), None);
        assert_eq!(unpack(pack(&[7], 3), 3), Some([7, 0, 0, 0, 0, 0, 0, 0]));
        assert_eq!((lines(0), lines(1), lines(8), lines(9)), (0, 1, 1, 2));
        assert_eq!(line_bytes(9), 32);
    }

    #[test]
    fn long_lines_round_trip_and_refuse_other_flags() {
        let data: [u8; 120] = core::array::from_fn(|i| i as u8 + 1);
        let w = pack128(&data);
        assert_eq!(unpack128(flag128(5), &w, 5), Some(data));
        assert_eq!(unpack128(flag128(4), &w, 5), None);
        assert_eq!(unpack128(0, &w, 5), None);
        let short = pack128(&[9, 8, 7]);
        let mut want = [0u8; 120];
        want[..3].copy_from_slice(&[9, 8, 7]);
        assert_eq!(unpack128(flag128(1), &short, 1), Some(want));
        let f = Format::Ll128;
        assert_eq!(
            (f.lines(0), f.lines(1), f.lines(120), f.lines(121)),
            (0, 1, 1, 2)
        );
        assert_eq!(f.line_bytes(121), 256);
        assert_eq!(f.region(), 128 << 10);
        assert_eq!(Format::Ll.region(), line_bytes(MAX_BYTES));
        assert_eq!(put_span_of(f, 1 << 20, 121), (1 << 20) + 256);
        assert_eq!(reduce_span_of(f, 2, 1000, 0, 1), 1000 + 128);
        // Every element size divides a line's data and a word.
        for size in [1u64, 2, 4, 8] {
            assert_eq!(LINE128_DATA % size, 0);
        }
    }

    #[test]
    fn regions_and_spans() {
        use crate::op::{Buf, Loc};
        let src = Loc::new(1, Buf::Scratch, 32);
        assert_eq!(
            region(src, 100, 2, 1000, 4),
            Some(Loc { offset: 232, ..src })
        );
        assert_eq!(
            region(src, 100, 2, 1000, 5),
            Some(Loc {
                offset: 1232,
                ..src
            })
        );
        assert_eq!(region(src, u64::MAX, 2, 0, 0), None);
        assert_eq!(at(src, u64::MAX, 1), None);
        assert_eq!(reduce_span(3, 100, 1000, 9), 200 + 1000 + 32);
        assert_eq!(reduce_span(u16::MAX, u64::MAX, 1, 1), u64::MAX);
        assert_eq!(put_span(16, 8), 32);
    }
}
