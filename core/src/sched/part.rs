//! Balanced partitions of element ranges.
//!
//! `n` elements split into `k` parts: part `i` starts at `i*(n/k) + min(i, n%k)` and holds
//! `n/k + (i < n%k)` elements. Parts differ by at most one element, every element is in exactly one
//! part, and the computation is O(1), which is what lets schedules stay lazy.

/// A contiguous range of elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Part {
    /// First element.
    pub start: u64,
    /// Element count.
    pub len: u64,
}

impl Part {
    /// Sub-part `i` of `k` of this part.
    pub fn sub(self, i: u64, k: u64) -> Part {
        let p = part(self.len, i, k);
        Part {
            start: self.start + p.start,
            len: p.len,
        }
    }

    /// The part covering sub-parts `[a, b)` of `k`.
    pub fn span(self, a: u64, b: u64, k: u64) -> Part {
        let s = part(self.len, a, k).start;
        let e = if b >= k {
            self.len
        } else {
            part(self.len, b, k).start
        };
        // `a` past `b` is the empty part at `a`.
        Part {
            start: self.start + s,
            len: e.saturating_sub(s),
        }
    }
}

/// Part `i` of `k` of `n` elements (`k > 0`; `i >= k` gives an empty part at the end).
pub fn part(n: u64, i: u64, k: u64) -> Part {
    if k == 0 || i >= k {
        return Part { start: n, len: 0 };
    }
    let base = n / k;
    let rem = n % k;
    Part {
        start: i * base + i.min(rem),
        len: base + u64::from(i < rem),
    }
}

/// Number of chunks of at most `chunk` elements that cover `n` elements (at least 1).
pub fn chunks(n: u64, chunk: u64) -> u64 {
    n.div_ceil(chunk.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_tile_the_range() {
        for n in 0..40u64 {
            for k in 1..9u64 {
                let mut next = 0;
                for i in 0..k {
                    let p = part(n, i, k);
                    assert_eq!(p.start, next);
                    next += p.len;
                }
                assert_eq!(next, n);
                let whole = Part { start: 3, len: n };
                assert_eq!(whole.span(0, k, k), whole);
            }
        }
    }
}
