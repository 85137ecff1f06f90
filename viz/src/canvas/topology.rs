//! The topology: the ranks and the edges the schedule used, taken from the trace
//! ([`crate::edges`]), with the chunks in flight at the playback time drawn as dots along the
//! edge they travel, at the fraction of the op done. A rank blocked in a wait is ringed orange,
//! one whose wait never finished red. At most [`MAX_DOTS`] chunks are drawn in a frame; the
//! view counts the rest.
//!
//! A tree schedule is laid out by depth in its tree-0 graph from the root ([`Graph::layout`]),
//! tree 0 solid and tree 1 (`DataB`) dashed; other schedules put the ranks on a circle, and
//! multicast around an NVSwitch. Control signals (ready, credit, done, barrier) are not drawn.
//! [`draw`] returns the edges it drew, which the app publishes as the canvas's `data-edges`.

use super::rank_colour;
use crate::edges::{Class, Edge, Graph};
use crate::flight::{self, InFlight, MAX_DOTS};
use crate::model::Trace;
use std::f64::consts::PI;
use symm_core::sched::Algorithm;
use web_sys::CanvasRenderingContext2d;

/// Canvas height of the view.
pub const HEIGHT: u32 = 300;

/// How ranks are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Circle,
    Tree,
    Switch,
}

fn circle(world: usize, w: f64, h: f64) -> Vec<(f64, f64)> {
    let (cx, cy) = (w / 2.0, h / 2.0);
    let r = (w.min(h) / 2.0 - 28.0).max(20.0);
    (0..world)
        .map(|i| {
            let a = -PI / 2.0 + 2.0 * PI * i as f64 / world.max(1) as f64;
            (cx + r * a.cos(), cy + r * a.sin())
        })
        .collect()
}

/// The shape and the rank positions: a tree schedule without tree-0 edges (cut short before
/// any) falls back to the circle.
fn positions(t: &Trace, world: usize, w: f64, h: f64) -> (Shape, Vec<(f64, f64)>) {
    match t.header.request.algorithm {
        Algorithm::Multicast => (Shape::Switch, circle(world, w, h)),
        Algorithm::Tree => match t.graph.layout(world) {
            Some((places, rows)) => {
                let pts = places
                    .iter()
                    .map(|&(x, row)| {
                        let y = 28.0 + (h - 64.0) * row as f64 / (rows - 1).max(1) as f64;
                        (18.0 + (w - 36.0) * x, y)
                    })
                    .collect();
                (Shape::Tree, pts)
            }
            None => (Shape::Circle, circle(world, w, h)),
        },
        _ => (Shape::Circle, circle(world, w, h)),
    }
}

/// The edges drawn for a shape: every derived edge, except that around a switch the data moved
/// between ranks is the switch's spokes.
fn drawn(shape: Shape, g: &Graph) -> Vec<Edge> {
    g.edges
        .iter()
        .filter(|e| shape != Shape::Switch || e.class != Class::Put)
        .copied()
        .collect()
}

fn stroke_edges(
    ctx: &CanvasRenderingContext2d,
    pts: &[(f64, f64)],
    edges: &[Edge],
    class: Class,
    bend: f64,
) {
    ctx.begin_path();
    for e in edges.iter().filter(|e| e.class == class) {
        let (Some(a), Some(b)) = (pts.get(e.from as usize), pts.get(e.to as usize)) else {
            continue;
        };
        ctx.move_to(a.0, a.1);
        if bend == 0.0 {
            ctx.line_to(b.0, b.1);
        } else {
            // Bent to the same side whichever way the edge goes, so both directions overlap.
            let (lo, hi) = if e.from < e.to { (a, b) } else { (b, a) };
            let (dx, dy) = (hi.0 - lo.0, hi.1 - lo.1);
            let len = (dx * dx + dy * dy).sqrt().max(1.0);
            let mid = (
                (a.0 + b.0) / 2.0 - dy / len * bend,
                (a.1 + b.1) / 2.0 + dx / len * bend,
            );
            ctx.quadratic_curve_to(mid.0, mid.1, b.0, b.1);
        }
    }
    ctx.stroke();
}

/// Draws the topology at a playback position; returns the edges drawn.
pub fn draw(ctx: &CanvasRenderingContext2d, width: f64, t: &Trace, pos: usize) -> Vec<Edge> {
    let h = HEIGHT as f64;
    ctx.set_fill_style_str("#ffffff");
    ctx.fill_rect(0.0, 0.0, width, h);
    let world = t.header.world as usize;
    let (shape, pts) = positions(t, world, width, h);
    let switch = (width / 2.0, h / 2.0);
    let edges = drawn(shape, &t.graph);
    if shape == Shape::Switch {
        ctx.set_stroke_style_str("#c8ced6");
        ctx.set_line_width(1.0);
        ctx.begin_path();
        for p in &pts {
            ctx.move_to(switch.0, switch.1);
            ctx.line_to(p.0, p.1);
        }
        ctx.stroke();
    }
    ctx.set_line_width(1.0);
    ctx.set_stroke_style_str("#c8ced6");
    stroke_edges(ctx, &pts, &edges, Class::Put, 0.0);
    ctx.set_line_width(1.5);
    ctx.set_stroke_style_str("#7f8c9b");
    stroke_edges(ctx, &pts, &edges, Class::Data, 0.0);
    ctx.set_stroke_style_str("#e67e22");
    let _ = ctx.set_line_dash(&js_sys::Array::of2(&4.0.into(), &4.0.into()));
    stroke_edges(ctx, &pts, &edges, Class::DataB, 18.0);
    let _ = ctx.set_line_dash(&js_sys::Array::new());
    ctx.set_line_width(1.0);
    ctx.set_fill_style_str("#888");
    ctx.set_font("10px sans-serif");
    let two = edges.iter().any(|e| e.class == Class::DataB);
    let legend = match shape {
        Shape::Tree if two => {
            "solid: tree 0 (Data), dashed: tree 1 (DataB); control signals not drawn"
        }
        Shape::Tree => "lines: the tree's Data signals; control signals not drawn",
        Shape::Switch => {
            "spokes: data through the NVSwitch, lines: Data signals; control signals not drawn"
        }
        Shape::Circle => {
            "lines: data between ranks (Data signals, puts); control signals not drawn"
        }
    };
    let _ = ctx.fill_text(legend, 6.0, h - 8.0);
    if shape == Shape::Switch {
        ctx.set_fill_style_str("#444");
        ctx.fill_rect(switch.0 - 26.0, switch.1 - 12.0, 52.0, 24.0);
        ctx.set_fill_style_str("#fff");
        ctx.set_font("11px sans-serif");
        let _ = ctx.fill_text("NVSwitch", switch.0 - 23.0, switch.1 + 4.0);
    }
    // Chunks in flight and rank states at the playback time.
    let now = t.time_at(pos);
    let InFlight { dots, more, state } = flight::at(t, now, &pts, switch, MAX_DOTS);
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
    if more > 0 {
        let _ = ctx.fill_text(
            &format!("{more} more chunks in flight not drawn"),
            6.0,
            28.0,
        );
    }
    edges
}
