//! The timeline's scales: trace time <-> nanoseconds on the axis, how far the view may zoom and
//! pan, and how lanes share pixel rows.
//!
//! A trace's times are whatever its file says, so every conversion saturates: a time beyond
//! `u64` is the last representable one, never an overflow. The window is kept finite and within
//! a few spans of the longest trace whatever the wheel and the drags do, and the canvas height is
//! bounded whatever the number of lanes, so one frame's pixels take bounded memory.

/// The visible window, in nanoseconds from the start of the traces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Left edge.
    pub t0: f64,
    /// Right edge.
    pub t1: f64,
}

/// Widest window, in multiples of the longest trace's span.
pub const MAX_ZOOM_OUT: f64 = 10.0;
/// Narrowest window, in nanoseconds.
pub const MIN_SPAN_NS: f64 = 1.0;
/// Narrowest window relative to its distance from the start, so that far from zero its edges
/// stay distinct `f64` values and the axis ticks advance.
const MIN_SPAN_REL: f64 = 1e-9;

/// Trace time (in the trace's units) `ns` nanoseconds after `start`. Negative or NaN `ns` is
/// `start`; a time past `u64::MAX` is `u64::MAX`.
pub fn time_at_ns(start: u64, unit_ns: u32, ns: f64) -> u64 {
    // `max` drops a NaN, and a float to integer cast saturates.
    let units = (ns.max(0.0) / unit_ns.max(1) as f64) as u64;
    start.saturating_add(units)
}

/// Nanoseconds from `start` to `time` (0 before `start`).
pub fn ns_since(start: u64, unit_ns: u32, time: u64) -> f64 {
    time.saturating_sub(start) as f64 * unit_ns.max(1) as f64
}

/// The window that shows the whole of traces at most `longest_ns` long, with a small margin.
pub fn fit(longest_ns: f64) -> Window {
    let d = longest(longest_ns);
    Window {
        t0: -d * 0.01,
        t1: d * 1.02,
    }
}

fn longest(ns: f64) -> f64 {
    if ns.is_finite() {
        ns.max(1.0)
    } else {
        1.0
    }
}

/// `w` brought within bounds: between [`MIN_SPAN_NS`] and [`MAX_ZOOM_OUT`] x the longest trace
/// wide; a window wider than the traces (`0..=longest_ns`) holds them whole, a narrower one is
/// centred on them. A window that is not finite is the fit.
pub fn bound(w: Window, longest_ns: f64) -> Window {
    let d = longest(longest_ns);
    let max_span = (d * MAX_ZOOM_OUT).min(f64::MAX);
    let centre = (w.t0 + w.t1) / 2.0;
    let span = w.t1 - w.t0;
    if !centre.is_finite() || !span.is_finite() {
        return fit(d);
    }
    let min_span = MIN_SPAN_NS.max(centre.abs() * MIN_SPAN_REL).min(max_span);
    let span = span.clamp(min_span, max_span);
    let centre = if span >= d {
        centre.clamp(d - span / 2.0, span / 2.0)
    } else {
        centre.clamp(0.0, d)
    };
    Window {
        t0: centre - span / 2.0,
        t1: centre + span / 2.0,
    }
}

/// `w` zoomed by `factor` (above 1: out) around the point `at` of the axis, within bounds.
pub fn zoom(w: Window, factor: f64, at: f64, longest_ns: f64) -> Window {
    let span = (w.t1 - w.t0).max(f64::MIN_POSITIVE);
    let left = (at - w.t0) / span;
    let left = if left.is_finite() {
        left.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let factor = if factor.is_finite() && factor > 0.0 {
        factor
    } else {
        1.0
    };
    let new = span * factor;
    bound(
        Window {
            t0: at - new * left,
            t1: at + new * (1.0 - left),
        },
        longest_ns,
    )
}

/// `w` moved right by `d_ns` (negative: left), within bounds.
pub fn pan(w: Window, d_ns: f64, longest_ns: f64) -> Window {
    bound(
        Window {
            t0: w.t0 + d_ns,
            t1: w.t1 + d_ns,
        },
        longest_ns,
    )
}

/// Tallest lane area of one trace, in pixels.
pub const MAX_LANES_PX: f64 = 640.0;
/// Thinnest row, in pixels.
pub const MIN_ROW_PX: f64 = 2.0;

/// How a trace's lanes are laid out in pixel rows: `per_row` consecutive lanes share a row when
/// there are more lanes than [`MAX_LANES_PX`] / [`MIN_ROW_PX`] rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rows {
    /// Lanes.
    pub lanes: usize,
    /// Height of a row.
    pub row_h: f64,
    /// Lanes in one row (1 up to 320 lanes).
    pub per_row: usize,
}

impl Rows {
    /// The layout of `lanes` lanes.
    pub fn of(lanes: usize) -> Rows {
        let most = (MAX_LANES_PX / MIN_ROW_PX) as usize;
        let (row_h, per_row) = match lanes {
            0..=16 => (20.0, 1),
            17..=64 => (10.0, 1),
            _ if lanes <= most => ((MAX_LANES_PX / lanes as f64).max(MIN_ROW_PX), 1),
            _ => (MIN_ROW_PX, lanes.div_ceil(most)),
        };
        Rows {
            lanes,
            row_h,
            per_row,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.lanes.div_ceil(self.per_row)
    }

    /// Height of the lane area.
    pub fn height(&self) -> f64 {
        self.row_h * self.rows() as f64
    }

    /// The row of a lane.
    pub fn row_of(&self, lane: usize) -> usize {
        lane / self.per_row
    }

    /// The lanes drawn in the row `y` pixels below the top of the lane area (none outside it).
    pub fn lanes_at(&self, y: f64) -> std::ops::Range<usize> {
        if !(y >= 0.0 && y < self.height()) {
            return 0..0;
        }
        let row = ((y / self.row_h) as usize).min(self.rows().saturating_sub(1));
        let first = row * self.per_row;
        first..first.saturating_add(self.per_row).min(self.lanes)
    }
}

/// Height of the time axis.
pub const AXIS_H: f64 = 18.0;
/// Height of the header row of each trace.
pub const HEAD_H: f64 = 16.0;

/// Canvas height of the timeline for traces of these numbers of lanes: at most
/// [`AXIS_H`] + ([`HEAD_H`] + [`MAX_LANES_PX`]) per trace + 4.
pub fn canvas_height(lanes: impl IntoIterator<Item = usize>) -> u32 {
    let mut h = AXIS_H;
    for n in lanes {
        h += HEAD_H + Rows::of(n).height();
    }
    (h.ceil() as u32).saturating_add(4)
}

#[cfg(test)]
mod tests;
