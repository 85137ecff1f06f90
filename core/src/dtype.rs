//! Element types and reduction operators.
//!
//! Every executor (host threads, the loom model, the GPU interpreter) combines elements with the
//! functions here, so their results agree bit for bit for integers. Half-precision types are
//! combined in `f32` and rounded back to nearest-even after every binary step, which is what a GPU
//! does when it loads two halves, adds them in registers and stores the result.
//!
//! Integer arithmetic wraps (sum and product are then associative, so every algorithm gives the
//! same bits as the sequential reference). `Avg` is a sum whose final step divides by a divisor
//! carried by the op ([`crate::op::Op::Reduce`]'s `div`).

use serde::{Deserialize, Serialize};

/// An element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary16.
    F16 = 1,
    /// bfloat16 (the top 16 bits of a binary32).
    Bf16 = 2,
    /// IEEE 754 binary64.
    F64 = 3,
    /// Signed 32-bit integer.
    I32 = 4,
    /// Unsigned 32-bit integer.
    U32 = 5,
    /// Signed 64-bit integer.
    I64 = 6,
    /// Unsigned 64-bit integer.
    U64 = 7,
    /// Unsigned 8-bit integer.
    U8 = 8,
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum = 0,
    /// Product (wrapping for integers).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the number of contributions at the last step.
    Avg = 4,
}

impl DType {
    /// Every element type.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::F64,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::U8,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> u64 {
        match self {
            DType::U8 => 1,
            DType::F16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16 | DType::F64)
    }

    /// Decodes the wire value of a dtype.
    pub const fn from_u8(v: u8) -> Option<DType> {
        Some(match v {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Bf16,
            3 => DType::F64,
            4 => DType::I32,
            5 => DType::U32,
            6 => DType::I64,
            7 => DType::U64,
            8 => DType::U8,
            _ => return None,
        })
    }

    /// Short lower-case name ("f32", "bf16", ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::U8 => "u8",
        }
    }
}

impl ReduceOp {
    /// Every reduction operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Decodes the wire value of an operator.
    pub const fn from_u8(v: u8) -> Option<ReduceOp> {
        Some(match v {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Min,
            3 => ReduceOp::Max,
            4 => ReduceOp::Avg,
            _ => return None,
        })
    }

    /// Short lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

/// Converts binary16 bits to `f32` exactly.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// Converts `f32` to binary16 bits, rounding to nearest even.
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        let nan = if man != 0 { 0x200 } else { 0 };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

/// Converts bfloat16 bits to `f32` exactly.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Converts `f32` to bfloat16 bits, rounding to nearest even.
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(round) >> 16) as u16
}

macro_rules! int_op {
    ($a:expr, $b:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $a.wrapping_add($b),
            ReduceOp::Prod => $a.wrapping_mul($b),
            ReduceOp::Min => {
                if $b < $a {
                    $b
                } else {
                    $a
                }
            }
            ReduceOp::Max => {
                if $b > $a {
                    $b
                } else {
                    $a
                }
            }
        }
    };
}

macro_rules! float_op {
    ($a:expr, $b:expr, $op:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $a + $b,
            ReduceOp::Prod => $a * $b,
            ReduceOp::Min => {
                if $b < $a {
                    $b
                } else {
                    $a
                }
            }
            ReduceOp::Max => {
                if $b > $a {
                    $b
                } else {
                    $a
                }
            }
        }
    };
}

/// Combines one element of `a` with one element of `b` (little-endian bytes, `dtype.size()` long
/// each) into `out`, then divides by `div` when `div > 1` (the last step of an average).
///
/// Slices shorter than the element size leave `out` untouched; executors pass exact slices.
pub fn combine(dtype: DType, op: ReduceOp, div: u32, a: &[u8], b: &[u8], out: &mut [u8]) {
    let n = dtype.size() as usize;
    if a.len() < n || b.len() < n || out.len() < n {
        return;
    }
    let d = div.max(1);
    macro_rules! arr {
        ($s:expr, $k:literal) => {{
            let mut t = [0u8; $k];
            t.copy_from_slice(&$s[..$k]);
            t
        }};
    }
    match dtype {
        DType::U8 => {
            let r = int_op!(a[0], b[0], op);
            out[0] = r;
        }
        DType::I32 => {
            let r = int_op!(
                i32::from_le_bytes(arr!(a, 4)),
                i32::from_le_bytes(arr!(b, 4)),
                op
            );
            out[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::U32 => {
            let r = int_op!(
                u32::from_le_bytes(arr!(a, 4)),
                u32::from_le_bytes(arr!(b, 4)),
                op
            );
            out[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::I64 => {
            let r = int_op!(
                i64::from_le_bytes(arr!(a, 8)),
                i64::from_le_bytes(arr!(b, 8)),
                op
            );
            out[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::U64 => {
            let r = int_op!(
                u64::from_le_bytes(arr!(a, 8)),
                u64::from_le_bytes(arr!(b, 8)),
                op
            );
            out[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::F32 => {
            let r = float_op!(
                f32::from_le_bytes(arr!(a, 4)),
                f32::from_le_bytes(arr!(b, 4)),
                op
            );
            out[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::F64 => {
            let r = float_op!(
                f64::from_le_bytes(arr!(a, 8)),
                f64::from_le_bytes(arr!(b, 8)),
                op
            );
            out[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::F16 | DType::Bf16 => {
            let (to, from) = half_conv(dtype);
            let x = to(u16::from_le_bytes(arr!(a, 2)));
            let y = to(u16::from_le_bytes(arr!(b, 2)));
            let r = float_op!(x, y, op);
            let r = if d > 1 { r / d as f32 } else { r };
            out[..2].copy_from_slice(&from(r).to_le_bytes());
        }
    }
    // The last step of an average (16-bit floats divided above, before their rounding).
    if d > 1 {
        divide(dtype, d, &mut out[..n]);
    }
}

/// Combines one element from each of `srcs` (in order) into `out`: the fused k-way reduce of
/// [`crate::op::Op::ReduceN`].
///
/// Integers and `f32`/`f64` fold exactly as a chain of [`combine`] calls would (the division by
/// `div` at the end); `f16` and `bf16` are widened to `f32`, folded there with one accumulator,
/// divided, and rounded to nearest-even once, which is what a kernel that loads k halves and
/// adds them in registers computes. One source with no division is the source's bits (what
/// every operator makes of one value, a NaN's payload included), so a fold of one source is a
/// copy. With no sources, or slices shorter than an element, `out` is untouched.
pub fn fold(dtype: DType, op: ReduceOp, div: u32, srcs: &[&[u8]], out: &mut [u8]) {
    let n = dtype.size() as usize;
    let Some((first, rest)) = srcs.split_first() else {
        return;
    };
    if out.len() < n || srcs.iter().any(|s| s.len() < n) {
        return;
    }
    if rest.is_empty() && div <= 1 {
        out[..n].copy_from_slice(&first[..n]);
        return;
    }
    match dtype {
        DType::F16 | DType::Bf16 => {
            let (to, from) = half_conv(dtype);
            let half = |s: &[u8]| to(u16::from_le_bytes([s[0], s[1]]));
            let mut acc = half(first);
            for s in rest {
                acc = float_op!(acc, half(s), op);
            }
            if div > 1 {
                acc /= div as f32;
            }
            out[..2].copy_from_slice(&from(acc).to_le_bytes());
        }
        _ => {
            let mut acc = [0u8; 8];
            acc[..n].copy_from_slice(&first[..n]);
            for src in rest {
                let prev = acc;
                combine(dtype, op, 1, &prev[..n], src, &mut acc[..n]);
            }
            if div > 1 {
                divide(dtype, div, &mut acc[..n]);
            }
            out[..n].copy_from_slice(&acc[..n]);
        }
    }
}

/// Widening and rounding conversions of a 16-bit float type.
type HalfConv = (fn(u16) -> f32, fn(f32) -> u16);

/// The widening and rounding conversions of a 16-bit float type (bf16's for any other type).
fn half_conv(dtype: DType) -> HalfConv {
    if dtype == DType::F16 {
        (f16_to_f32, f32_to_f16)
    } else {
        (bf16_to_f32, f32_to_bf16)
    }
}

/// Divides one element of a type other than the 16-bit floats in place (the last step of an
/// average); 16-bit floats divide in `f32` before their rounding, in [`combine`] and [`fold`].
fn divide(dtype: DType, d: u32, x: &mut [u8]) {
    macro_rules! arr {
        ($k:literal) => {{
            let mut t = [0u8; $k];
            t.copy_from_slice(&x[..$k]);
            t
        }};
    }
    match dtype {
        DType::U8 => x[0] = (x[0] as u32 / d) as u8,
        DType::I32 => {
            let r = i32::from_le_bytes(arr!(4)).wrapping_div(d as i32);
            x[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::U32 => {
            let r = u32::from_le_bytes(arr!(4)) / d;
            x[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::I64 => {
            let r = i64::from_le_bytes(arr!(8)).wrapping_div(d as i64);
            x[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::U64 => {
            let r = u64::from_le_bytes(arr!(8)) / d as u64;
            x[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::F32 => {
            let r = f32::from_le_bytes(arr!(4)) / d as f32;
            x[..4].copy_from_slice(&r.to_le_bytes());
        }
        DType::F64 => {
            let r = f64::from_le_bytes(arr!(8)) / d as f64;
            x[..8].copy_from_slice(&r.to_le_bytes());
        }
        DType::F16 | DType::Bf16 => {}
    }
}

/// Writes the value `v` (an integer, small enough for every dtype) as one element of `dtype`.
pub fn encode_int(dtype: DType, v: i64, out: &mut [u8]) {
    let n = dtype.size() as usize;
    if out.len() < n {
        return;
    }
    match dtype {
        DType::U8 => out[0] = v as u8,
        DType::I32 => out[..4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::U32 => out[..4].copy_from_slice(&(v as u32).to_le_bytes()),
        DType::I64 => out[..8].copy_from_slice(&v.to_le_bytes()),
        DType::U64 => out[..8].copy_from_slice(&(v as u64).to_le_bytes()),
        DType::F32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => out[..8].copy_from_slice(&(v as f64).to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f32_to_f16(v as f32).to_le_bytes()),
        DType::Bf16 => out[..2].copy_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
    }
}

/// Reads one element as `f64` (for tolerance comparisons and display).
pub fn decode_f64(dtype: DType, a: &[u8]) -> f64 {
    let n = dtype.size() as usize;
    if a.len() < n {
        return f64::NAN;
    }
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(&a[..n]);
    match dtype {
        DType::U8 => a[0] as f64,
        DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::I64 => i64::from_le_bytes(b) as f64,
        DType::U64 => u64::from_le_bytes(b) as f64,
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        DType::F64 => f64::from_le_bytes(b),
        DType::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DType::Bf16 => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trip_of_every_finite_value() {
        for h in 0u16..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "f16 {h:#x}");
            assert_eq!(f32_to_bf16(bf16_to_f32(h)), h, "bf16 {h:#x}");
        }
    }

    #[test]
    fn half_rounds_to_nearest_even() {
        // 2049 is between 2048 and 2050 in f16: ties go to even (2048).
        assert_eq!(f16_to_f32(f32_to_f16(2049.0)), 2048.0);
        assert_eq!(f16_to_f32(f32_to_f16(2051.0)), 2052.0);
        assert_eq!(bf16_to_f32(f32_to_bf16(257.0)), 256.0);
        assert_eq!(bf16_to_f32(f32_to_bf16(259.0)), 260.0);
    }

    #[test]
    fn combine_every_dtype_and_op() {
        for dt in DType::ALL {
            for op in ReduceOp::ALL {
                let (mut a, mut b, mut o) = ([0u8; 8], [0u8; 8], [0u8; 8]);
                encode_int(dt, 6, &mut a);
                encode_int(dt, 3, &mut b);
                let div = if op == ReduceOp::Avg { 3 } else { 1 };
                combine(dt, op, div, &a, &b, &mut o);
                let want = match op {
                    ReduceOp::Sum => 9.0,
                    ReduceOp::Prod => 18.0,
                    ReduceOp::Min => 3.0,
                    ReduceOp::Max => 6.0,
                    ReduceOp::Avg => 3.0,
                };
                assert_eq!(decode_f64(dt, &o), want, "{dt:?} {op:?}");
            }
        }
    }

    #[test]
    fn fold_matches_a_chain_except_for_halves_which_round_once() {
        for dt in DType::ALL {
            for op in ReduceOp::ALL {
                let vals: [i64; 4] = [6, 3, 5, 2];
                let mut e = [[0u8; 8]; 4];
                for (x, &v) in e.iter_mut().zip(&vals) {
                    encode_int(dt, v, x);
                }
                let srcs: [&[u8]; 4] = [&e[0], &e[1], &e[2], &e[3]];
                let div = if op == ReduceOp::Avg { 4 } else { 1 };
                let mut folded = [0u8; 8];
                fold(dt, op, div, &srcs, &mut folded);
                let mut chain = e[0];
                for (i, x) in e.iter().enumerate().skip(1) {
                    let prev = chain;
                    combine(dt, op, if i == 3 { div } else { 1 }, &prev, x, &mut chain);
                }
                // Small integers are exact in every type, so both agree here.
                let n = dt.size() as usize;
                assert_eq!(folded[..n], chain[..n], "{dt:?} {op:?}");
            }
        }
        // bf16: 256 + 1 + 1 is 258 with one rounding; a chain rounds 257 to 256 twice.
        let enc = |v: f32| f32_to_bf16(v).to_le_bytes();
        let (a, b) = (enc(256.0), enc(1.0));
        let mut o = [0u8; 2];
        fold(DType::Bf16, ReduceOp::Sum, 1, &[&a, &b, &b], &mut o);
        assert_eq!(bf16_to_f32(u16::from_le_bytes(o)), 258.0);
        let mut c = [0u8; 2];
        combine(DType::Bf16, ReduceOp::Sum, 1, &a, &b, &mut c);
        let c0 = c;
        combine(DType::Bf16, ReduceOp::Sum, 1, &c0, &b, &mut c);
        assert_eq!(bf16_to_f32(u16::from_le_bytes(c)), 256.0);
        // One source is the source, divided; no source or short slices leave `out` alone.
        let mut one = [0u8; 4];
        fold(
            DType::F32,
            ReduceOp::Avg,
            2,
            &[&(-0.0f32).to_le_bytes()],
            &mut one,
        );
        assert_eq!(f32::from_le_bytes(one).to_bits(), (-0.0f32).to_bits());
        let mut keep = [7u8; 4];
        fold(DType::F32, ReduceOp::Sum, 1, &[], &mut keep);
        fold(DType::F32, ReduceOp::Sum, 1, &[&[1, 2]], &mut keep);
        assert_eq!(keep, [7; 4]);
    }
}
