//! Peak memory of decode -> viewer model -> Perfetto export, measured with a counting global
//! allocator: for crafted traces it stays within the same small multiple of the input's size as
//! for real ones. (One test in this binary, so that nothing else allocates while it measures.)

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use symm_core::perfetto;
use symm_tests::hostile;
use symm_viz::model::Trace;

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Relaxed) + n;
    PEAK.fetch_max(now, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and only
// counts sizes on the side, so `System`'s guarantees carry over.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract for `layout`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a block this allocator (that is, `System`) returned, with
        // its layout.
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller passes a block `System` returned, its layout and a valid new size.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Count the new block before the old one is released: the copy may hold both.
            grew(new_size);
            CURRENT.fetch_sub(layout.size(), Relaxed);
        }
        p
    }
}

/// A `fmt::Write` that only counts bytes.
struct Count(usize);

impl std::fmt::Write for Count {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Peak bytes allocated while `f` runs, above what was live when it started.
fn peak<T>(f: impl FnOnce() -> T) -> usize {
    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    drop(f());
    PEAK.load(Relaxed) - base
}

/// (command-line export, viewer open + export) peaks as multiples of the input's size.
fn ratios(bytes: &[u8]) -> (f64, f64) {
    // `cargo xtask trace export`: fold, then stream the JSON (here into a sink that counts).
    let export = peak(|| {
        perfetto::fold(bytes).map(|f| {
            let mut n = Count(0);
            f.write_json(&mut n).map(|_| n.0)
        })
    });
    // The viewer: open (a copy of the bytes, decode, index), then export.
    let viewer = peak(|| Trace::decode("t.trace", bytes.to_vec()).map(|t| t.to_json().len()));
    let n = bytes.len() as f64;
    (export as f64 / n, viewer as f64 / n)
}

/// Most bytes allocated per byte of input, on any path.
const BOUND: f64 = 64.0;

#[test]
fn peak_memory_is_a_small_multiple_of_the_input() {
    let real = [
        ("simulated ring all-reduce", hostile::sample()),
        (
            "GPU ring all-reduce (v1)",
            std::fs::read(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../docs/gpu-traces/gpu-w4-all_reduce-ring.trace"),
            )
            .unwrap(),
        ),
    ];
    let crafted = [
        ("slot layout overflow", hostile::slots_overflow(500)),
        ("header world 65535 x 65535", hostile::world_mismatch(500)),
        ("world 1024 x 64 channels", hostile::huge_world(500)),
        ("op indices 65536 apart", hostile::span_fanout(500)),
        ("op indices 65536 apart, 60 KB", hostile::span_fanout(5500)),
        ("multicast over 64 ranks", hostile::multicast_fanout(300)),
    ];
    let mut worst: f64 = 0.0;
    for (name, bytes) in real.iter().chain(crafted.iter()) {
        let (export, viewer) = ratios(bytes);
        println!(
            "{name}: {} bytes, peak {export:.1}x (export), {viewer:.1}x (viewer and export)",
            bytes.len()
        );
        assert!(
            export <= BOUND && viewer <= BOUND,
            "{name}: peak {export:.1}x / {viewer:.1}x the input"
        );
        worst = worst.max(export).max(viewer);
    }
    println!("worst peak: {worst:.1}x the input");
}
