//! What a launch may touch: a request's buffers as heap offsets, checked against what a plan
//! needs and the heap's buffer area before anything is enqueued, and the bounds every option
//! and deadline is held to. Shared by `Comm` (the runtime) and `World` (the one-process test
//! backend).
//!
//! `Buffers` are plain offsets a caller can build by hand, so every launch checks them against
//! what the plans were validated for (each plan's ops stay inside its `BufferSizes`) and against
//! the heap's buffer area (never the signal pad, never past the rank's heap): a safe call cannot
//! make the GPU write outside the caller's buffers.

use std::time::Duration;

use symm_core::heap::Heap;
use symm_core::sched::BufferSizes;

use super::error::{CudaError, Result};

/// A request's buffers in the heap (byte offsets, the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffers {
    /// Input offset.
    pub input: u64,
    /// Output offset.
    pub output: u64,
    /// Scratch offset.
    pub scratch: u64,
    /// Sizes.
    pub sizes: BufferSizes,
}

/// Checks buffers of the given sizes at the given offsets against what a plan needs and the
/// buffer area `[lo, hi)` of the heap.
pub fn check_buffers(b: &Buffers, need: &BufferSizes, lo: u64, hi: u64) -> Result<()> {
    check_buffers_on(b, need, (lo, hi), [false; 2])
}

/// [`check_buffers`], except that an input (`owned[0]`) or output (`owned[1]`) the caller
/// owns lies outside the heap: its offset is the address of a span of this rank's device memory
/// relative to the rank's heap base, which the caller checked (one device allocation of this
/// context, 16-byte aligned, exactly the sizes the plan needs), and which only this rank's own
/// ops name (`Request::owns`). Only its size is checked here.
pub(crate) fn check_buffers_on(
    b: &Buffers,
    need: &BufferSizes,
    (lo, hi): (u64, u64),
    owned: [bool; 2],
) -> Result<()> {
    for (name, off, have, need, owned) in [
        ("input", b.input, b.sizes.input, need.input, owned[0]),
        ("output", b.output, b.sizes.output, need.output, owned[1]),
        ("scratch", b.scratch, b.sizes.scratch, need.scratch, false),
    ] {
        if have < need {
            return Err(CudaError::TooSmall {
                what: name,
                have,
                need,
            });
        }
        if owned {
            continue;
        }
        if need > 0 && !off.is_multiple_of(16) {
            return Err(CudaError::Misaligned {
                what: name,
                offset: off,
                align: 16,
            });
        }
        if need > 0 && (off < lo || off.checked_add(need).is_none_or(|e| e > hi)) {
            return Err(CudaError::OutOfBounds {
                what: name,
                offset: off,
                len: need,
                lo,
                hi,
            });
        }
    }
    Ok(())
}

/// Places input, output and scratch of `sizes` with `heap` (offsets relative to the buffer area,
/// which starts at `data_off`): the same offsets on every rank that makes the same calls.
pub fn place(heap: &mut Heap, sizes: BufferSizes, data_off: u64) -> Result<Buffers> {
    let mut got = [0u64; 3];
    for (i, n) in [sizes.input, sizes.output, sizes.scratch]
        .into_iter()
        .enumerate()
    {
        match heap.alloc(n.max(16), 4096) {
            Ok(o) => got[i] = o,
            Err(e) => {
                // The heap gets back what this call took: a refused set leaves it as it was.
                for &o in &got[..i] {
                    heap.free(o).map_err(CudaError::Heap)?;
                }
                return Err(CudaError::Heap(e));
            }
        }
    }
    Ok(Buffers {
        input: got[0] + data_off,
        output: got[1] + data_off,
        scratch: got[2] + data_off,
        sizes,
    })
}

/// Returns `b` to `heap`, whose offset 0 is `base`: whole or not at all. Each of its three
/// offsets must start a live block of the heap, none may be one of `reserved` (regions the
/// heap holds for others), and no two may be the same block (a set the caller built by hand
/// could name one block twice; freeing it twice would free it once and then fail, leaving the
/// heap half changed and unlike the peers'). The first offset that breaks a rule is named.
pub fn unplace(heap: &mut Heap, b: &Buffers, base: u64, reserved: &[u64]) -> Result<()> {
    let named = [b.input, b.output, b.scratch];
    let mut offs = [0u64; 3];
    for (i, &o) in named.iter().enumerate() {
        let off = o.checked_sub(base);
        let ok = off.is_some_and(|x| heap.is_live(x))
            && !reserved.contains(&o)
            && !named[..i].contains(&o);
        match off {
            Some(x) if ok => offs[i] = x,
            _ => return Err(CudaError::NotLive { offset: o }),
        }
    }
    for off in offs {
        heap.free(off).map_err(CudaError::Heap)?;
    }
    Ok(())
}

/// The longest deadline any wait may have, on the device or on the host: a peer that is stuck
/// but alive ends every wait within it (`SYMM_WAIT_MAX_NS` in `symm/device.cuh`).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The most buffer bytes a heap may ask for per rank (256 TiB): sizes past it are refused before
/// any arithmetic on them (the pad is added and the sum rounded up to the granularity).
pub const MAX_HEAP_BYTES: u64 = 1 << 48;

/// Fails unless the heap size `what` is at most [`MAX_HEAP_BYTES`].
pub fn check_heap(what: &str, bytes: u64) -> Result<()> {
    if bytes > MAX_HEAP_BYTES {
        return Err(CudaError::BadOption(format!(
            "{what} is {bytes}; it must be at most {MAX_HEAP_BYTES}"
        )));
    }
    Ok(())
}

/// Fails unless the deadline `what` lies in `(0, MAX_WAIT]`.
pub fn check_wait(what: &str, d: Duration) -> Result<()> {
    if d.is_zero() || d > MAX_WAIT {
        return Err(CudaError::BadOption(format!(
            "{what} is {d:?}; it must be more than 0 and at most {MAX_WAIT:?}"
        )));
    }
    Ok(())
}

/// Fails unless bytes `off .. off + len` lie in the buffer area `[lo, hi)`.
pub fn check_range(off: u64, len: u64, lo: u64, hi: u64) -> Result<()> {
    if off < lo || off.checked_add(len).is_none_or(|e| e > hi) {
        return Err(CudaError::OutOfBounds {
            what: "range",
            offset: off,
            len,
            lo,
            hi,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_frees_whole_or_not_at_all() {
        let mut heap = Heap::new(64 << 10);
        let sizes = BufferSizes {
            input: 16,
            output: 16,
            scratch: 16,
        };
        let b = place(&mut heap, sizes, 4096).unwrap();
        let state = |h: &Heap| (h.used(), h.live());
        let before = state(&heap);
        // One block named twice, an offset before the base, one past every block, a reserved
        // region: each refused by its offset, the heap unchanged.
        let twice = Buffers {
            output: b.input,
            ..b
        };
        let cases = [
            (twice, b.input, &[][..]),
            (Buffers { scratch: 16, ..b }, 16, &[][..]),
            (
                Buffers {
                    input: b.input + 4096 * 10,
                    ..b
                },
                b.input + 4096 * 10,
                &[][..],
            ),
            (b, b.output, &[b.output][..]),
        ];
        for (set, named, reserved) in cases {
            let e = unplace(&mut heap, &set, 4096, reserved).unwrap_err();
            assert!(
                matches!(e, CudaError::NotLive { offset } if offset == named),
                "{e:?}"
            );
            assert_eq!(state(&heap), before);
        }
        unplace(&mut heap, &b, 4096, &[]).unwrap();
        assert_eq!(heap.live(), 0);
        let e = unplace(&mut heap, &b, 4096, &[]).unwrap_err();
        assert!(matches!(e, CudaError::NotLive { .. }), "{e:?}");
    }

    #[test]
    fn a_refused_placement_leaves_the_heap_as_it_was() {
        let mut heap = Heap::new(64 << 10);
        let sizes = |o: u64| BufferSizes {
            input: 16 << 10,
            output: o,
            scratch: 16,
        };
        let before = (heap.used(), heap.live());
        let e = place(&mut heap, sizes(1 << 20), 4096).unwrap_err();
        assert!(
            matches!(
                e,
                CudaError::Heap(symm_core::heap::HeapError::OutOfMemory { .. })
            ),
            "{e:?}"
        );
        assert_eq!((heap.used(), heap.live()), before);
        let b = place(&mut heap, sizes(16 << 10), 4096).unwrap();
        assert_eq!((b.input, heap.live()), (4096, 3));
    }

    fn bufs(input: u64, output: u64, scratch: u64, n: u64) -> Buffers {
        Buffers {
            input,
            output,
            scratch,
            sizes: BufferSizes {
                input: n,
                output: n,
                scratch: n,
            },
        }
    }

    #[test]
    fn buffers_are_checked_against_the_plan_and_the_heap() {
        let need = BufferSizes {
            input: 100,
            output: 100,
            scratch: 0,
        };
        let (lo, hi) = (4096, 1 << 20);
        assert!(check_buffers(&bufs(4096, 8192, 12288, 100), &need, lo, hi).is_ok());
        // Smaller than the plan needs.
        assert!(matches!(
            check_buffers(&bufs(4096, 8192, 12288, 99), &need, lo, hi),
            Err(CudaError::TooSmall {
                what: "input",
                have: 99,
                need: 100
            })
        ));
        // In the signal pad.
        assert!(matches!(
            check_buffers(&bufs(0, 8192, 12288, 100), &need, lo, hi),
            Err(CudaError::OutOfBounds {
                what: "input",
                offset: 0,
                ..
            })
        ));
        // Inside the heap but not 16-byte aligned (a misaligned vector access would fault).
        let r = check_buffers(&bufs(4096 + 8, 8192, 12288, 100), &need, lo, hi);
        assert!(
            matches!(
                &r,
                Err(CudaError::Misaligned {
                    what: "input",
                    offset: 4104,
                    align: 16
                })
            ),
            "{r:?}"
        );
        // Past the heap, or wrapping.
        for output in [hi - 48, u64::MAX - 15] {
            assert!(matches!(
                check_buffers(&bufs(4096, output, 0, 100), &need, lo, hi),
                Err(CudaError::OutOfBounds { what: "output", .. })
            ));
        }
        // A buffer the plan does not use may be anywhere (it is never touched).
        assert!(check_buffers(&bufs(4096, 8192, 0, 100), &need, lo, hi).is_ok());
    }

    #[test]
    fn every_deadline_is_bounded() {
        for bad in [
            Duration::ZERO,
            MAX_WAIT + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let r = check_wait("timeout", bad);
            assert!(matches!(r, Err(CudaError::BadOption(_))), "{bad:?}: {r:?}");
        }
        for good in [Duration::from_nanos(1), Duration::from_secs(10), MAX_WAIT] {
            assert!(check_wait("timeout", good).is_ok(), "{good:?}");
        }
        let comm = crate::cuda::CommOptions {
            timeout: Duration::MAX,
            ..Default::default()
        };
        assert!(matches!(comm.validate(), Err(CudaError::BadOption(m)) if m.contains("timeout")));
        let comm = crate::cuda::CommOptions {
            bootstrap_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert!(comm.validate().is_err());
        assert!(crate::cuda::CommOptions::default().validate().is_ok());
    }

    /// A heap size near `u64::MAX` is refused by validation (`World::open` added the pad to it
    /// unchecked, and overflowed).
    #[test]
    fn heap_sizes_are_bounded() {
        for bad in [MAX_HEAP_BYTES + 1, u64::MAX] {
            let comm = crate::cuda::CommOptions {
                heap_bytes: bad,
                ..Default::default()
            };
            let r = comm.validate();
            assert!(
                matches!(&r, Err(CudaError::BadOption(m)) if m.contains("heap_bytes")),
                "{r:?}"
            );
        }
        let comm = crate::cuda::CommOptions {
            heap_bytes: MAX_HEAP_BYTES,
            ..Default::default()
        };
        assert!(comm.validate().is_ok());
    }
}
