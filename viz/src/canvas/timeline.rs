//! The timeline: one lane per (rank, channel), ops as bars, Signal -> Wait arrows, waits coloured
//! by how long they stalled, a cursor at the playback time; zoom and pan.
//!
//! Several traces (compare mode) stack on one time axis measured in nanoseconds from each trace's
//! start. Ops after the playback time are drawn as pale ghosts so the whole schedule stays
//! visible. Per lane only the spans inside the window are visited (binary search), and when many
//! fall on one pixel column the rest of the column is skipped with another binary search, so a
//! frame costs O(width x lanes x log n) whatever the trace size. Past 320 lanes consecutive
//! lanes share a pixel row ([`Rows`]), so the frame's height, and its pixels, stay bounded.

use super::Pixels;
use crate::model::Trace;
use crate::scale::{self, Rows};
use symm_core::op::Op;
use web_sys::CanvasRenderingContext2d;

pub use crate::scale::{Window, AXIS_H, HEAD_H};

/// Width of the lane labels.
pub const LABEL_W: f64 = 64.0;
/// Most arrows drawn; beyond that, zoom in to see them.
pub const MAX_ARROWS: usize = 1500;

const PALETTE: [[u8; 4]; 11] = [
    [0x4e, 0x79, 0xa7, 255], // 0 copy
    [0x59, 0xa1, 0x4f, 255], // 1 reduce
    [0xb0, 0x7a, 0xa1, 255], // 2 signal
    [0xf1, 0xe3, 0xa0, 255], // 3 wait, short
    [0xf3, 0xc2, 0x6b, 255], // 4
    [0xef, 0x8a, 0x3c, 255], // 5
    [0xe4, 0x57, 0x2e, 255], // 6
    [0xb3, 0x00, 0x1b, 255], // 7 wait, longest
    [0x00, 0x00, 0x00, 255], // 8 never finished
    [0x17, 0xbe, 0xcf, 255], // 9 multicast
    [0xdd, 0xe3, 0xea, 255], // 10 ghost (not yet played)
];

/// What one trace contributes to a frame.
pub struct Track<'a> {
    /// The trace.
    pub trace: &'a Trace,
    /// Playback time, in ns from its start.
    pub now_ns: f64,
    /// The selected span.
    pub selected: Option<usize>,
}

/// Canvas height for the tracks (bounded whatever their lanes: see [`Rows`]).
pub fn height(tracks: &[&Trace]) -> u32 {
    scale::canvas_height(tracks.iter().map(|t| t.lanes.len()))
}

fn colour(t: &Trace, s: &symm_core::perfetto::Span) -> usize {
    match s.op {
        Op::Copy { .. } => 0,
        Op::Reduce { .. } | Op::ReduceN { .. } | Op::LlReduce { .. } => 1,
        Op::LlPut { .. } => 0,
        Op::Signal { .. } => 2,
        Op::McReduce { .. } | Op::McStore { .. } => 9,
        Op::Wait { .. } => match s.end {
            None => 8,
            Some(e) => {
                let f = e.saturating_sub(s.begin) as f64 / t.wait_max.max(1) as f64;
                3 + ((f * 4.0).floor() as usize).min(4)
            }
        },
    }
}

/// Draws a frame.
pub fn draw(ctx: &CanvasRenderingContext2d, width: f64, tracks: &[Track], w: Window) {
    let height = ctx.canvas().map_or(1, |c| c.height());
    let mut bars = Pixels::new(width as u32, height);
    let mut labels: Vec<(String, f64, f64)> = Vec::new();
    let plot_w = (width - LABEL_W).max(10.0);
    let span_ns = (w.t1 - w.t0).max(1e-9);
    let xof = |ns: f64| LABEL_W + (ns - w.t0) / span_ns * plot_w;
    let mut y = AXIS_H;

    let mut arrows: Vec<[f64; 4]> = Vec::new();
    let mut too_many = false;
    let mut cursors = Vec::new();
    let mut outline = None;
    ctx.set_font("11px sans-serif");
    for tr in tracks {
        let t = tr.trace;
        let unit = t.header.time_unit_ns;
        let to_ns = |time: u64| scale::ns_since(t.start, unit, time);
        let to_time = |ns: f64| scale::time_at_ns(t.start, unit, ns);
        let rows = Rows::of(t.lanes.len());
        let lh = rows.row_h;
        let shared = if rows.per_row > 1 {
            format!(", {} lanes a row", rows.per_row)
        } else {
            String::new()
        };
        labels.push((
            format!(
                "{} ({} {} w{}{shared})",
                t.name,
                t.header.request.collective.name(),
                t.header.request.algorithm.name(),
                t.header.world
            ),
            4.0,
            y + 12.0,
        ));
        y += HEAD_H;
        let top = y;
        let now = to_time(tr.now_ns);
        let (lo, hi) = (to_time(w.t0), to_time(w.t1).saturating_add(1));
        let mut lane_y = Vec::with_capacity(t.lanes.len());
        for (li, lane) in t.lanes.iter().enumerate() {
            let y = top + rows.row_of(li) as f64 * lh;
            lane_y.push(y);
            if lh >= 8.0 && rows.per_row == 1 {
                labels.push((
                    format!("r{} c{}", lane.rank, lane.channel),
                    4.0,
                    y + lh - 5.0,
                ));
            }
            let n = lane.spans.len();
            let mut k = lane.ends.partition_point(|e| *e < lo);
            while k < n {
                let begin = lane.begins[k];
                if begin > hi {
                    break;
                }
                let si = lane.spans[k] as usize;
                let s = &t.spans[si];
                let end = lane.ends[k].min(t.end).max(begin);
                let played = begin <= now;
                let c = if played { colour(t, s) } else { 10 };
                let shown_end = if played { end.min(now) } else { end };
                let x0 = xof(to_ns(begin)).max(LABEL_W);
                let x1 = xof(to_ns(shown_end)).min(width);
                let bw = (x1 - x0).max(1.0);
                bars.rect(x0, y + 1.0, bw, lh - 2.0, PALETTE[c]);
                if played && end > now && s.end.is_some() {
                    let gx = xof(to_ns(now)).max(LABEL_W);
                    let gw = (xof(to_ns(end)) - gx).max(0.0);
                    bars.rect(gx, y + 1.0, gw, lh - 2.0, PALETTE[10]);
                }
                if tr.selected == Some(si) {
                    outline = Some([x0, y, bw, lh]);
                }
                k += 1;
                if x1 - x0 < 1.0 && k < n {
                    // Skip what else ends in this pixel column: gallop, then bisect, over the
                    // lane's contiguous end times.
                    let next_t = to_time(w.t0 + (x0.floor() + 1.0 - LABEL_W) / plot_w * span_ns);
                    let mut step = 1;
                    while k + step < n && lane.ends[k + step] < next_t {
                        step *= 2;
                    }
                    let hi_k = (k + step).min(n);
                    k += lane.ends[k..hi_k].partition_point(|e| *e < next_t);
                }
            }
        }
        y = top + rows.height();
        // Arrows of the pairs whose signal has played.
        let lane_of = |rank: u16, ch: u16| {
            t.lanes
                .binary_search_by_key(&(rank, ch), |l| (l.rank, l.channel))
                .ok()
        };
        let visible = t.pairs.len() as f64 * (w.t1 - w.t0) / t.duration_ns().max(1.0);
        if visible > MAX_ARROWS as f64 {
            too_many = true;
        }
        for p in t.pairs.iter().take(if too_many { 0 } else { usize::MAX }) {
            let (s, wt) = (&t.spans[p.signal], &t.spans[p.wait]);
            let (Some(se), Some(we)) = (s.end, wt.end) else {
                continue;
            };
            if se > now || we < lo || se > hi {
                continue;
            }
            if arrows.len() >= MAX_ARROWS {
                too_many = true;
                break;
            }
            let (Some(ls), Some(lw)) = (lane_of(s.rank, s.channel), lane_of(wt.rank, wt.channel))
            else {
                continue;
            };
            arrows.push([
                xof(to_ns(se)),
                lane_y[ls] + lh / 2.0,
                xof(to_ns(we.min(now.max(se)))),
                lane_y[lw] + lh / 2.0,
            ]);
        }
        cursors.push((xof(tr.now_ns), lane_y.first().copied().unwrap_or(y), y));
    }
    bars.put(ctx);
    axis(ctx, width, w, &xof);
    ctx.set_font("11px sans-serif");
    ctx.set_fill_style_str("#333");
    for (text, x, y) in &labels {
        let _ = ctx.fill_text(text, *x, *y);
    }
    if !arrows.is_empty() {
        ctx.begin_path();
        for [x0, y0, x1, y1] in &arrows {
            ctx.move_to(*x0, *y0);
            ctx.line_to(*x1, *y1);
            // Arrow head.
            let (dx, dy) = (x1 - x0, y1 - y0);
            let len = (dx * dx + dy * dy).sqrt().max(1e-6);
            let (ux, uy) = (dx / len, dy / len);
            ctx.move_to(*x1, *y1);
            ctx.line_to(x1 - 6.0 * ux + 3.0 * uy, y1 - 6.0 * uy - 3.0 * ux);
            ctx.move_to(*x1, *y1);
            ctx.line_to(x1 - 6.0 * ux - 3.0 * uy, y1 - 6.0 * uy + 3.0 * ux);
        }
        ctx.set_stroke_style_str("rgba(90, 40, 120, 0.7)");
        ctx.set_line_width(1.0);
        ctx.stroke();
    }
    if too_many {
        ctx.set_fill_style_str("#7a2");
        let _ = ctx.fill_text(
            "zoom in to see every Signal -> Wait arrow",
            width - 260.0,
            12.0,
        );
    }
    if let Some([x, y, w, h]) = outline {
        ctx.set_stroke_style_str("#000");
        ctx.set_line_width(2.0);
        ctx.stroke_rect(x, y, w, h);
    }
    ctx.set_stroke_style_str("#d62728");
    ctx.set_line_width(1.5);
    for (x, y0, y1) in cursors {
        if x >= LABEL_W {
            ctx.begin_path();
            ctx.move_to(x, y0);
            ctx.line_to(x, y1);
            ctx.stroke();
        }
    }
}

fn axis(ctx: &CanvasRenderingContext2d, width: f64, w: Window, xof: &dyn Fn(f64) -> f64) {
    let span = (w.t1 - w.t0).max(1e-9);
    let raw = span / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ctx.set_fill_style_str("#555");
    ctx.set_font("10px sans-serif");
    let mut t = (w.t0 / step).ceil() * step;
    // About 8 ticks; the count is bounded even where `t + step` would round back to `t`.
    let mut ticks = 0;
    while t <= w.t1 && ticks < 32 {
        ticks += 1;
        let x = xof(t);
        ctx.fill_rect(x, AXIS_H - 4.0, 1.0, 4.0);
        let shown = if t.abs() < step * 1e-6 { 0.0 } else { t };
        let label = if step >= 1e6 {
            format!("{:.1} ms", shown / 1e6)
        } else if step >= 1e3 {
            format!("{:.1} us", shown / 1e3)
        } else {
            format!("{shown:.0} ns")
        };
        let _ = ctx.fill_text(&label, x + 2.0, 10.0);
        t += step;
    }
    ctx.fill_rect(LABEL_W, AXIS_H - 1.0, width - LABEL_W, 1.0);
}

/// The span under a point: (track, span).
pub fn hit(tracks: &[&Trace], width: f64, w: Window, x: f64, y: f64) -> Option<(usize, usize)> {
    if x < LABEL_W {
        return None;
    }
    let plot_w = (width - LABEL_W).max(10.0);
    let ns = w.t0 + (x - LABEL_W) / plot_w * (w.t1 - w.t0);
    let mut top = AXIS_H;
    for (ti, t) in tracks.iter().enumerate() {
        top += HEAD_H;
        let rows = Rows::of(t.lanes.len());
        let bottom = top + rows.height();
        if y >= top && y < bottom {
            let unit = t.header.time_unit_ns;
            let time = scale::time_at_ns(t.start, unit, ns);
            // Accept the op under the pointer or the nearest one within 3 px.
            let slack = scale::time_at_ns(0, unit, 3.0 / plot_w * (w.t1 - w.t0));
            // Where lanes share the row, the first of them with an op there.
            return rows.lanes_at(y - top).find_map(|l| {
                let lane = t.lanes.get(l)?;
                let s = t.lane_span_at(lane, time.saturating_add(slack))?;
                let sp = &t.spans[s];
                (sp.end.unwrap_or(t.end).saturating_add(slack) >= time).then_some((ti, s))
            });
        }
        top = bottom;
    }
    None
}
