//! The fused all-reduce, residual add and RMSNorm, bit for bit: what `kernels/symm/norm.cu`
//! computes, and the host reference every check compares it with.
//!
//! A call takes `rows` rows of `hidden` bf16 elements: every rank's input `x_r`, this rank's
//! residual `res` and the norm's weight `w` (`hidden` elements). For each element, in this
//! order, every operation rounded to f32 (no fused multiply-add):
//!
//! 1. `s = x_0 + x_1 + ... + x_{W-1}`, summed in f32 in rank order (the all-reduce; every
//!    rank gets the same bits whatever its rank);
//! 2. `h = bf16(s + res)`: the new residual, rounded once;
//! 3. per row, `ss`, the sum of `h * h` in the order [`sum_squares`] fixes (the kernel's
//!    [`THREADS`] threads' partial sums, then a halving tree);
//! 4. `rstd = 1 / sqrt(ss / hidden + eps)` (a correctly rounded square root, [`sqrt_f32`]);
//! 5. `out = bf16(bf16(h * rstd) * w)`: normalised, rounded, then scaled by the weight (as
//!    the usual PyTorch RMSNorm rounds before the weight).
//!
//! `bf16(v)` rounds to nearest even, and a NaN (from a NaN or infinite input, or an all-zero
//! row with `eps` 0) becomes [`NAN`]: processors make NaNs of different signs and payloads,
//! so the rule names one.
//!
//! The kernel's thread t handles the 8-element vectors t, t + THREADS, t + 2 THREADS, ... of a
//! row, so its partial sums are the ones [`sum_squares`] forms.

use crate::dtype::{bf16_to_f32, f32_to_bf16};

/// Threads of the kernel's block: the partial sums of a row's squares.
pub const THREADS: usize = 256;
/// Elements per vector (16 bytes of bf16): `hidden` is a multiple of it.
pub const VEC: usize = 8;
/// The one NaN the op writes (bf16 bits: positive, quiet, no payload).
pub const NAN: u16 = 0x7fc0;

/// `v` rounded to bf16 as the op rounds (see the module doc): nearest even, NaN as [`NAN`].
pub fn round(v: f32) -> u16 {
    if v.is_nan() {
        NAN
    } else {
        f32_to_bf16(v)
    }
}

/// Most rows of a call: the rows travel in the low 20 bits of the kernel's flag words (the
/// call's epoch above them), so a peer whose call has other rows is named, not waited for.
pub const MAX_ROWS: u32 = (1 << 20) - 1;

/// Why a fused all-reduce + RMSNorm was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NormError {
    /// `hidden` is not a positive multiple of [`VEC`].
    BadHidden {
        /// The width given.
        hidden: usize,
    },
    /// A buffer does not hold what the call needs.
    BadLength {
        /// Which buffer.
        what: &'static str,
        /// Its elements.
        have: usize,
        /// The elements it must hold.
        want: usize,
    },
    /// No rank's input was given.
    NoRanks,
    /// The epsilon is not finite, or negative.
    BadEps,
}

impl core::fmt::Display for NormError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            NormError::BadHidden { hidden } => write!(
                f,
                "the hidden size must be a positive multiple of {VEC}, got {hidden}"
            ),
            NormError::BadLength { what, have, want } => {
                write!(f, "{what} holds {have} elements, the call needs {want}")
            }
            NormError::NoRanks => write!(f, "no rank's input"),
            NormError::BadEps => write!(f, "epsilon must be finite and not negative"),
        }
    }
}

impl core::error::Error for NormError {}

/// Checks that `hidden` is a positive multiple of [`VEC`].
pub fn check_hidden(hidden: usize) -> Result<(), NormError> {
    if hidden == 0 || !hidden.is_multiple_of(VEC) {
        return Err(NormError::BadHidden { hidden });
    }
    Ok(())
}

/// The sum of the squares of `h` (one row, a multiple of [`VEC`] long) in the kernel's order:
/// thread t's partial sum runs over the vectors t, t + [`THREADS`], ... and their elements in
/// order; then partial t += partial t + s for s = THREADS / 2, ..., 1.
pub fn sum_squares(h: &[f32]) -> f32 {
    let mut part = [0f32; THREADS];
    for (v, chunk) in h.chunks(VEC).enumerate() {
        let p = &mut part[v % THREADS];
        for &e in chunk {
            *p += e * e;
        }
    }
    let mut s = THREADS / 2;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    part[0]
}

/// The square root of `x`, correctly rounded to nearest even (what CUDA's `__fsqrt_rn` and
/// IEEE 754 give), without the standard library.
pub fn sqrt_f32(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 || x.is_infinite() {
        return x;
    }
    let bits = x.to_bits();
    let (mut m, mut e) = if bits >> 23 == 0 {
        (u64::from(bits), -149i32)
    } else {
        (
            u64::from((bits & 0x7f_ffff) | 0x80_0000),
            (bits >> 23) as i32 - 150,
        )
    };
    // x = m * 2^e; make e even, then shift m up (by an even amount) to 61 or 62 bits.
    if e & 1 != 0 {
        m <<= 1;
        e -= 1;
    }
    let t = (62 - (64 - m.leading_zeros() as i32)) & !1;
    m <<= t;
    e -= t;
    // sqrt(x) = sqrt(m) * 2^(e / 2); r has 31 bits, of which the top 24 are kept.
    let r = m.isqrt();
    let exact = r * r == m;
    let low = r & 0x7f;
    let mut q = r >> 7;
    if low > 0x40 || (low == 0x40 && (!exact || q & 1 == 1)) {
        q += 1;
    }
    let mut exp = e / 2 + 7;
    if q == 1 << 24 {
        q >>= 1;
        exp += 1;
    }
    // q in [2^23, 2^24): the value is q * 2^exp, a normal f32 for every positive finite x.
    let field = (exp + 23 + 127) as u32;
    f32::from_bits((field << 23) | (q as u32 & 0x7f_ffff))
}

/// The reference of one call (see the module doc): `inputs` holds every rank's `x` in rank
/// order (each `rows * hidden` elements, bf16 bits), `residual` this rank's residual; writes
/// the new residual into `residual_out` and the normalised rows into `out`.
pub fn all_reduce_rmsnorm(
    inputs: &[&[u16]],
    residual: &[u16],
    weight: &[u16],
    eps: f32,
    residual_out: &mut [u16],
    out: &mut [u16],
) -> Result<(), NormError> {
    let hidden = weight.len();
    check_hidden(hidden)?;
    if inputs.is_empty() {
        return Err(NormError::NoRanks);
    }
    let n = residual.len();
    let rows = n / hidden;
    for (what, have) in [
        (
            "an input",
            inputs
                .iter()
                .map(|x| x.len())
                .find(|&l| l != n)
                .unwrap_or(n),
        ),
        ("the residual", rows * hidden),
        ("the residual output", residual_out.len()),
        ("the output", out.len()),
    ] {
        if have != n {
            return Err(NormError::BadLength {
                what,
                have,
                want: n,
            });
        }
    }
    let mut row_h = Row::new();
    for r in 0..rows {
        let at = r * hidden;
        row_h.clear();
        for i in 0..hidden {
            let mut s = bf16_to_f32(inputs[0][at + i]);
            for x in &inputs[1..] {
                s += bf16_to_f32(x[at + i]);
            }
            let v = round(s + bf16_to_f32(residual[at + i]));
            residual_out[at + i] = v;
            row_h.push(bf16_to_f32(v));
        }
        let ss = row_h.sum_squares();
        let rstd = 1.0 / sqrt_f32(ss / hidden as f32 + eps);
        for i in 0..hidden {
            let n = round(bf16_to_f32(residual_out[at + i]) * rstd);
            out[at + i] = round(bf16_to_f32(n) * bf16_to_f32(weight[i]));
        }
    }
    Ok(())
}

/// One row's `h` without allocating: the squares' partial sums are formed as the row is
/// pushed, in the order of [`sum_squares`].
struct Row {
    part: [f32; THREADS],
    len: usize,
}

impl Row {
    fn new() -> Row {
        Row {
            part: [0.0; THREADS],
            len: 0,
        }
    }

    fn clear(&mut self) {
        self.part.iter_mut().for_each(|p| *p = 0.0);
        self.len = 0;
    }

    fn push(&mut self, e: f32) {
        let t = (self.len / VEC) % THREADS;
        self.part[t] += e * e;
        self.len += 1;
    }

    fn sum_squares(&mut self) -> f32 {
        let mut s = THREADS / 2;
        while s > 0 {
            for t in 0..s {
                self.part[t] += self.part[t + s];
            }
            s /= 2;
        }
        self.part[0]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn the_square_root_is_correctly_rounded() {
        let mut x: u32 = 0x1234_5678;
        let mut specials: Vec<f32> = [
            1.0,
            2.0,
            4.0,
            0.25,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x7f_ffff),
            f32::MAX,
            1e-30,
            3.0,
            1e-6,
        ]
        .to_vec();
        for _ in 0..200_000 {
            // xorshift over every finite positive pattern
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            specials.push(f32::from_bits(x & 0x7f7f_ffff));
        }
        for v in specials {
            assert_eq!(sqrt_f32(v).to_bits(), v.sqrt().to_bits(), "sqrt({v:e})");
        }
        assert!(sqrt_f32(-1.0).is_nan() && sqrt_f32(f32::NAN).is_nan());
        assert_eq!(sqrt_f32(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(sqrt_f32(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn a_row_is_summed_in_the_kernels_order() {
        let h: Vec<f32> = (0..8192)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut row = Row::new();
        h.iter().for_each(|&e| row.push(e));
        assert_eq!(row.sum_squares().to_bits(), sum_squares(&h).to_bits());
        // Another order gives other bits for this row: the order is part of the result.
        let seq = h.iter().fold(0f32, |a, &e| a + e * e);
        assert_ne!(seq.to_bits(), sum_squares(&h).to_bits());
    }

    #[test]
    fn the_reference_sums_adds_and_normalises() {
        let hidden = 16;
        let bf = |v: f32| f32_to_bf16(v);
        let x0: Vec<u16> = (0..hidden).map(|i| bf(i as f32)).collect();
        let x1: Vec<u16> = (0..hidden).map(|_| bf(1.0)).collect();
        let res: Vec<u16> = (0..hidden).map(|_| bf(0.5)).collect();
        let w: Vec<u16> = (0..hidden).map(|_| bf(2.0)).collect();
        let (mut ro, mut out) = (std::vec![0u16; hidden], std::vec![0u16; hidden]);
        all_reduce_rmsnorm(&[&x0, &x1], &res, &w, 1e-6, &mut ro, &mut out).unwrap();
        let h: Vec<f32> = (0..hidden).map(|i| i as f32 + 1.5).collect();
        for i in 0..hidden {
            assert_eq!(bf16_to_f32(ro[i]), h[i]);
        }
        let ms = h.iter().map(|v| v * v).sum::<f32>() / hidden as f32;
        for i in 0..hidden {
            let want = 2.0 * h[i] / (ms + 1e-6).sqrt();
            assert!(
                (bf16_to_f32(out[i]) - want).abs() <= want.abs() / 64.0,
                "{i}"
            );
        }
    }

    #[test]
    fn every_nan_the_op_writes_is_the_one_nan() {
        let hidden = 8;
        let bf = |v: f32| f32_to_bf16(v);
        let zero = std::vec![0u16; hidden];
        let w = std::vec![bf(1.0); hidden];
        let (mut ro, mut out) = (std::vec![0u16; hidden], std::vec![0u16; hidden]);
        // An all-zero row with eps 0: 0 * (1 / sqrt(0)) is 0 * inf.
        all_reduce_rmsnorm(&[&zero, &zero], &zero, &w, 0.0, &mut ro, &mut out).unwrap();
        assert_eq!(ro, zero);
        assert!(out.iter().all(|&o| o == NAN), "{out:x?}");
        // A negative NaN with a payload and an infinity in the input.
        let mut x = zero.clone();
        x[0] = 0xffc1;
        x[1] = bf(f32::INFINITY);
        all_reduce_rmsnorm(&[&x, &zero], &zero, &w, 1e-6, &mut ro, &mut out).unwrap();
        assert_eq!(ro[0], NAN);
        assert!(out.iter().all(|&o| o == NAN), "{out:x?}");
        assert_eq!(round(-f32::NAN), NAN);
        assert_eq!(round(1.0), bf(1.0));
    }

    #[test]
    fn bad_shapes_are_refused() {
        let z = [0u16; 16];
        let mut o = [0u16; 16];
        let mut r = [0u16; 16];
        assert_eq!(
            all_reduce_rmsnorm(&[&z], &z, &z[..12], 1e-6, &mut r, &mut o),
            Err(NormError::BadHidden { hidden: 12 })
        );
        assert_eq!(
            all_reduce_rmsnorm(&[], &z, &z[..8], 1e-6, &mut r, &mut o),
            Err(NormError::NoRanks)
        );
        assert!(matches!(
            all_reduce_rmsnorm(&[&z[..8]], &z, &z[..8], 1e-6, &mut r, &mut o),
            Err(NormError::BadLength {
                what: "an input",
                ..
            })
        ));
        assert!(matches!(
            all_reduce_rmsnorm(&[&z], &z[..12], &z[..8], 1e-6, &mut r, &mut o),
            Err(NormError::BadLength { .. })
        ));
    }
}
