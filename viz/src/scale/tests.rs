use super::*;

const MS: f64 = 1e6;

#[test]
fn times_saturate_instead_of_overflowing() {
    // A trace from time 0 to about 1.8e19 units: the right edge of any window is past it.
    let far = 1.8e19;
    assert_eq!(time_at_ns(0, 1, far), 18_000_000_000_000_000_000);
    assert_eq!(time_at_ns(0, 1, far * 1.05), u64::MAX);
    assert_eq!(time_at_ns(u64::MAX - 5, 1, 100.0), u64::MAX);
    assert_eq!(time_at_ns(7, u32::MAX, f64::INFINITY), u64::MAX);
    assert_eq!(time_at_ns(7, u32::MAX, f64::MAX), u64::MAX);
    // Before the start, or not a number: the start.
    assert_eq!(time_at_ns(7, 1, -1e30), 7);
    assert_eq!(time_at_ns(7, 1, f64::NEG_INFINITY), 7);
    assert_eq!(time_at_ns(7, 1, f64::NAN), 7);
    // An ordinary trace: 250 ns at 10 ns a unit is 25 units.
    assert_eq!(time_at_ns(100, 10, 250.0), 125);
    assert_eq!(time_at_ns(100, 0, 250.0), 350);
    assert_eq!(ns_since(100, 10, 125), 250.0);
    assert_eq!(ns_since(100, 10, 50), 0.0);
    let widest = ns_since(0, u32::MAX, u64::MAX);
    assert!(widest.is_finite() && widest > 7e28, "{widest}");
}

#[test]
fn zoom_out_stops_at_a_multiple_of_the_longest_trace() {
    let d = MS;
    let mut w = fit(d);
    for _ in 0..10_000 {
        w = zoom(w, 1.25, w.t1, d);
    }
    let span = w.t1 - w.t0;
    assert!((span - d * MAX_ZOOM_OUT).abs() < 1e-6 * d, "{w:?}");
    assert!(w.t0 <= 0.0 && w.t1 >= d, "the whole trace in view: {w:?}");
    // Every edge converts to a time without overflow.
    for unit in [1, 1000, u32::MAX] {
        assert!(time_at_ns(u64::MAX / 2, unit, w.t1) >= u64::MAX / 2);
    }
    // The widest trace there is: still finite after as many notches.
    let d = ns_since(0, u32::MAX, u64::MAX);
    let mut w = fit(d);
    for _ in 0..10_000 {
        w = zoom(w, 1.25, w.t0, d);
    }
    assert!(w.t0.is_finite() && w.t1.is_finite() && w.t1 - w.t0 <= d * MAX_ZOOM_OUT * 1.0001);
}

#[test]
fn zoom_in_stops_at_a_distinct_nanosecond() {
    let d = MS;
    let mut w = fit(d);
    for _ in 0..10_000 {
        w = zoom(w, 0.8, (w.t0 + w.t1) / 2.0, d);
    }
    assert!((w.t1 - w.t0 - MIN_SPAN_NS).abs() < 1e-9, "{w:?}");
    // Far from zero the window stays wide enough for its edges (and axis ticks) to differ.
    let d = 1.8e19;
    let mut w = fit(d);
    for _ in 0..10_000 {
        w = zoom(w, 0.8, w.t1, d);
    }
    let span = w.t1 - w.t0;
    assert!(span >= w.t1.abs() * 1e-10, "{w:?}");
    assert!(w.t0 + span / 8.0 > w.t0);
}

#[test]
fn ordinary_zoom_and_pan_are_unchanged() {
    let d = MS;
    let w = Window {
        t0: 100_000.0,
        t1: 300_000.0,
    };
    // Zooming in around a point keeps the point where it was on screen.
    let z = zoom(w, 0.8, 150_000.0, d);
    assert!(
        (z.t0 - 110_000.0).abs() < 1e-6 && (z.t1 - 270_000.0).abs() < 1e-6,
        "{z:?}"
    );
    let back = zoom(z, 1.25, 150_000.0, d);
    assert!(
        (back.t0 - w.t0).abs() < 1e-6 && (back.t1 - w.t1).abs() < 1e-6,
        "{back:?}"
    );
    let p = pan(w, -50_000.0, d);
    assert_eq!(
        p,
        Window {
            t0: 50_000.0,
            t1: 250_000.0
        }
    );
    assert_eq!(bound(fit(d), d), fit(d));
}

#[test]
fn pans_keep_part_of_the_trace_in_view() {
    let d = MS;
    let w = Window {
        t0: 0.0,
        t1: 1000.0,
    };
    let mut right = w;
    let mut left = w;
    for _ in 0..100_000 {
        right = pan(right, 1e12, d);
        left = pan(left, -1e12, d);
    }
    // The trace's edge stops in the middle of the view; the zoom is kept.
    assert!(
        right.t0 <= d && (right.t1 - right.t0 - 1000.0).abs() < 0.01,
        "{right:?}"
    );
    assert!(
        left.t1 >= 0.0 && (left.t1 - left.t0 - 1000.0).abs() < 0.01,
        "{left:?}"
    );
    // Not a number anywhere: back to the whole trace.
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(bound(Window { t0: bad, t1: 1.0 }, d), fit(d));
        assert_eq!(pan(w, bad, d), fit(d));
        assert_eq!(bound(w, bad), bound(w, 1.0));
    }
}

#[test]
fn lane_rows_keep_ordinary_sizes() {
    assert_eq!((Rows::of(8).row_h, Rows::of(8).per_row), (20.0, 1));
    assert_eq!((Rows::of(16).row_h, Rows::of(16).per_row), (20.0, 1));
    assert_eq!((Rows::of(64).row_h, Rows::of(64).per_row), (10.0, 1));
    assert_eq!((Rows::of(100).row_h, Rows::of(100).per_row), (6.4, 1));
    assert_eq!((Rows::of(320).row_h, Rows::of(320).per_row), (2.0, 1));
    let r = Rows::of(8);
    assert_eq!(r.height(), 160.0);
    assert_eq!(r.lanes_at(0.0), 0..1);
    assert_eq!(r.lanes_at(45.0), 2..3);
    assert_eq!(r.lanes_at(159.9), 7..8);
    assert_eq!(r.lanes_at(160.0), 0..0);
    assert_eq!(r.lanes_at(-0.5), 0..0);
    assert_eq!(r.lanes_at(f64::NAN), 0..0);
    // One 8-lane trace: axis, header, lanes, margin.
    assert_eq!(canvas_height([8]), 18 + 16 + 160 + 4);
}

#[test]
fn many_lanes_share_rows_and_the_canvas_stays_bounded() {
    let most = (MAX_LANES_PX / MIN_ROW_PX) as usize;
    let cap = (AXIS_H + 2.0 * (HEAD_H + MAX_LANES_PX)) as u32 + 4;
    for n in [321, 1000, 4096, 65_536, 1 << 20, u32::MAX as usize] {
        let r = Rows::of(n);
        assert!(r.height() <= MAX_LANES_PX, "{n}: {r:?}");
        assert!(r.rows() <= most && r.rows() * r.per_row >= n, "{n}: {r:?}");
        assert!(r.row_h >= MIN_ROW_PX);
        // Every lane is in exactly one row, the one `lanes_at` finds.
        for lane in [0, n / 2, n - 1] {
            let y = r.row_of(lane) as f64 * r.row_h + r.row_h / 2.0;
            assert!(r.lanes_at(y).contains(&lane), "{n} lane {lane}");
        }
        let h = canvas_height([n, n]);
        assert!(h <= cap, "{n}: {h}");
        // The frame's pixels at a wide 4000 px: under 24 MB whatever the lanes.
        assert!(4000 * h as usize * 4 < 24 << 20);
    }
}
