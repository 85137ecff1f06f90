//! The topology: ranks on a circle (ring, halving-doubling, direct and pairwise schedules), as a
//! binary tree (tree schedules) or around an NVSwitch (multicast), with the chunks in flight at
//! the playback time drawn as dots along the edge they travel, at the fraction of the op done.
//! A rank blocked in a wait is ringed orange, one whose wait never finished red.

use super::rank_colour;
use crate::model::Trace;
use std::f64::consts::PI;
use symm_core::op::Op;
use symm_core::sched::{Algorithm, Collective};
use web_sys::CanvasRenderingContext2d;

/// A chunk in flight: where it left, where it is now, whose colour it has.
type Flight = ((f64, f64), (f64, f64), usize);

/// Canvas height of the view.
pub const HEIGHT: u32 = 300;

/// How ranks are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Circle,
    Tree,
    Switch,
}

fn positions(shape: Shape, world: usize, w: f64, h: f64) -> Vec<(f64, f64)> {
    let (cx, cy) = (w / 2.0, h / 2.0);
    match shape {
        Shape::Circle | Shape::Switch => {
            let r = (w.min(h) / 2.0 - 28.0).max(20.0);
            (0..world)
                .map(|i| {
                    let a = -PI / 2.0 + 2.0 * PI * i as f64 / world.max(1) as f64;
                    (cx + r * a.cos(), cy + r * a.sin())
                })
                .collect()
        }
        Shape::Tree => {
            let depth = (usize::BITS - world.max(1).leading_zeros()) as f64;
            (0..world)
                .map(|i| {
                    let level = (usize::BITS - (i + 1).leading_zeros() - 1) as usize;
                    let first = (1usize << level) - 1;
                    let count = 1usize << level;
                    let x = w * ((i - first) as f64 + 0.5) / count as f64;
                    let y = 28.0 + (h - 56.0) * level as f64 / (depth - 1.0).max(1.0);
                    (x, y)
                })
                .collect()
        }
    }
}

/// Draws the topology at a playback position.
pub fn draw(ctx: &CanvasRenderingContext2d, width: f64, t: &Trace, pos: usize) {
    let h = HEIGHT as f64;
    ctx.set_fill_style_str("#ffffff");
    ctx.fill_rect(0.0, 0.0, width, h);
    let world = t.header.world as usize;
    let shape = match t.header.request.algorithm {
        Algorithm::Tree => Shape::Tree,
        Algorithm::Multicast => Shape::Switch,
        _ => Shape::Circle,
    };
    let pts = positions(shape, world, width, h);
    let switch = (width / 2.0, h / 2.0);
    // Edges.
    ctx.set_stroke_style_str("#c8ced6");
    ctx.set_line_width(1.0);
    ctx.begin_path();
    match shape {
        Shape::Circle if t.header.request.algorithm == Algorithm::Ring => {
            for i in 0..world {
                let (a, b) = (pts[i], pts[(i + 1) % world]);
                ctx.move_to(a.0, a.1);
                ctx.line_to(b.0, b.1);
            }
        }
        Shape::Circle if world <= 16 => {
            for i in 0..world {
                for j in i + 1..world {
                    ctx.move_to(pts[i].0, pts[i].1);
                    ctx.line_to(pts[j].0, pts[j].1);
                }
            }
        }
        Shape::Tree => {
            // Tree 0 is heap ordered by rank: parent (r - 1) / 2.
            for i in 1..world {
                let p = (i - 1) / 2;
                ctx.move_to(pts[p].0, pts[p].1);
                ctx.line_to(pts[i].0, pts[i].1);
            }
        }
        Shape::Switch => {
            for p in &pts {
                ctx.move_to(switch.0, switch.1);
                ctx.line_to(p.0, p.1);
            }
        }
        Shape::Circle => {}
    }
    ctx.stroke();
    if shape == Shape::Tree && t.header.request.collective == Collective::AllReduce {
        // The all-reduce's second tree is the mirror: rank r sits at position world - 1 - r.
        ctx.set_stroke_style_str("#f0b27a");
        let _ = ctx.set_line_dash(&js_sys::Array::of2(&4.0.into(), &4.0.into()));
        ctx.begin_path();
        for pos in 1..world {
            let (child, parent) = (world - 1 - pos, world - 1 - (pos - 1) / 2);
            let (a, b) = (pts[parent], pts[child]);
            let mid = ((a.0 + b.0) / 2.0 + 18.0, (a.1 + b.1) / 2.0);
            ctx.move_to(a.0, a.1);
            ctx.quadratic_curve_to(mid.0, mid.1, b.0, b.1);
        }
        ctx.stroke();
        let _ = ctx.set_line_dash(&js_sys::Array::new());
        ctx.set_fill_style_str("#888");
        ctx.set_font("10px sans-serif");
        let _ = ctx.fill_text("solid: tree 0, dashed: tree 1 (mirrored)", 6.0, h - 8.0);
    }
    if shape == Shape::Switch {
        ctx.set_fill_style_str("#444");
        ctx.fill_rect(switch.0 - 26.0, switch.1 - 12.0, 52.0, 24.0);
        ctx.set_fill_style_str("#fff");
        ctx.set_font("11px sans-serif");
        let _ = ctx.fill_text("NVSwitch", switch.0 - 23.0, switch.1 + 4.0);
    }
    // Chunks in flight and rank states at the playback time.
    let now = t.time_at(pos);
    let mut state = vec![0u8; world]; // 0 idle, 1 waiting, 2 stalled
    let mut dots: Vec<Flight> = Vec::new();
    let at = |r: u16| pts.get(r as usize).copied();
    let lerp =
        |a: (f64, f64), b: (f64, f64), f: f64| (a.0 + (b.0 - a.0) * f, a.1 + (b.1 - a.1) * f);
    for lane in &t.lanes {
        let Some(si) = t.lane_span_at(lane, now) else {
            continue;
        };
        let s = &t.spans[si];
        let running = s.end.is_none_or(|e| e > now) && s.begin <= now;
        if !running {
            continue;
        }
        let f = match s.end {
            Some(e) if e > s.begin => (now - s.begin) as f64 / (e - s.begin) as f64,
            _ => 0.5,
        };
        let me = s.rank;
        match s.op {
            Op::Wait { .. } => {
                if let Some(st) = state.get_mut(me as usize) {
                    *st = (*st).max(if s.stall.is_some() { 2 } else { 1 });
                }
            }
            Op::Copy { src, dst, .. } | Op::LlPut { src, dst, .. } if src.rank != dst.rank => {
                if let (Some(a), Some(b)) = (at(src.rank), at(dst.rank)) {
                    dots.push((a, lerp(a, b, f), src.rank as usize));
                }
            }
            Op::Reduce { a, b, .. } => {
                for l in [a, b] {
                    if l.rank != me {
                        if let (Some(x), Some(y)) = (at(l.rank), at(me)) {
                            dots.push((x, lerp(x, y, f), l.rank as usize));
                        }
                    }
                }
            }
            Op::ReduceN { ranks, .. } => {
                for &q in ranks.as_slice() {
                    if q != me {
                        if let (Some(x), Some(y)) = (at(q), at(me)) {
                            dots.push((x, lerp(x, y, f), q as usize));
                        }
                    }
                }
            }
            Op::McReduce { .. } => {
                if let Some(y) = at(me) {
                    dots.push((switch, lerp(switch, y, f), me as usize));
                }
            }
            Op::McStore { .. } => {
                if let Some(x) = at(me) {
                    if f < 0.5 {
                        dots.push((x, lerp(x, switch, f * 2.0), me as usize));
                    } else {
                        for q in &pts {
                            dots.push((switch, lerp(switch, *q, (f - 0.5) * 2.0), me as usize));
                        }
                    }
                }
            }
            // A copy within a rank, signals and low-latency reduces (their lines arrived
            // with their puts) move nothing between ranks.
            Op::Copy { .. } | Op::LlPut { .. } | Op::Signal { .. } | Op::LlReduce { .. } => {}
        }
    }
    // Ranks.
    ctx.set_font("bold 12px sans-serif");
    for (r, p) in pts.iter().enumerate() {
        ctx.begin_path();
        let _ = ctx.arc(p.0, p.1, 16.0, 0.0, 2.0 * PI);
        ctx.set_fill_style_str(&rank_colour(r, world));
        ctx.fill();
        let (ring, lw) = match state[r] {
            2 => ("#d00000", 5.0),
            1 => ("#f39c12", 4.0),
            _ => ("#333333", 1.0),
        };
        ctx.set_stroke_style_str(ring);
        ctx.set_line_width(lw);
        ctx.stroke();
        ctx.set_fill_style_str("#fff");
        let _ = ctx.fill_text(&format!("r{r}"), p.0 - 8.0, p.1 + 4.0);
    }
    for (from, (x, y), r) in dots {
        let colour = rank_colour(r, world);
        ctx.set_stroke_style_str(&colour);
        ctx.set_line_width(4.0);
        ctx.begin_path();
        ctx.move_to(from.0, from.1);
        ctx.line_to(x, y);
        ctx.stroke();
        ctx.begin_path();
        let _ = ctx.arc(x, y, 6.0, 0.0, 2.0 * PI);
        ctx.set_fill_style_str(&colour);
        ctx.fill();
        ctx.set_line_width(1.5);
        ctx.set_stroke_style_str("#000");
        ctx.stroke();
    }
    ctx.set_line_width(1.0);
    ctx.set_fill_style_str("#333");
    ctx.set_font("11px sans-serif");
    let _ = ctx.fill_text(
        &format!(
            "t = {}",
            crate::describe::duration(t, now.saturating_sub(t.start))
        ),
        6.0,
        14.0,
    );
}
