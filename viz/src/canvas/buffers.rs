//! The buffers view: per rank a row of output chunks and, when the schedule stages data, a row
//! of scratch chunks; each chunk is split into one stripe per rank, filled in that rank's colour
//! when the chunk holds its contribution. A correct all-reduce ends with every output chunk of
//! every rank fully striped; the scratch rows show partial results travelling through staging.
//! The grids' titles come from [`titles`], with the drawn trace's own header: in a compare view
//! each trace gets its own panel.

use super::rank_colour;
use crate::buffers::{titles, Cells};
use crate::model::Trace;
use web_sys::CanvasRenderingContext2d;

const TITLE_H: f64 = 22.0;

/// Canvas height for a trace.
pub fn height(t: &Trace) -> u32 {
    let mut h = TITLE_H + row_h(&t.cells) * t.cells.world as f64;
    if t.scratch.written {
        h += TITLE_H + row_h(&t.scratch) * t.scratch.world as f64;
    }
    h.ceil() as u32 + 4
}

fn row_h(c: &Cells) -> f64 {
    if c.world <= 16 {
        26.0
    } else {
        (400.0 / c.world as f64).max(3.0)
    }
}

/// Draws the buffers at a playback position.
pub fn draw(ctx: &CanvasRenderingContext2d, width: f64, t: &Trace, pos: usize) {
    let hgt = height(t) as f64;
    ctx.set_fill_style_str("#ffffff");
    ctx.fill_rect(0.0, 0.0, width, hgt.max(40.0));
    ctx.set_font("11px sans-serif");
    ctx.set_fill_style_str("#333");
    if !t.cells.recorded {
        let _ = ctx.fill_text(
            "this trace records no chunk contents (simulator runs with contents on do)",
            6.0,
            16.0,
        );
        return;
    }
    let [output, scratch] = titles(&t.header, &t.cells, &t.scratch);
    let y = grid(ctx, width, &t.cells, pos, 0.0, &output);
    if t.scratch.written {
        grid(ctx, width, &t.scratch, pos, y, &scratch);
    }
}

fn grid(
    ctx: &CanvasRenderingContext2d,
    width: f64,
    c: &Cells,
    pos: usize,
    top: f64,
    title: &str,
) -> f64 {
    ctx.set_fill_style_str("#333");
    let _ = ctx.fill_text(title, 6.0, top + 14.0);
    let world = c.world as usize;
    let rh = row_h(c);
    let label = 34.0;
    let cells = c.cells().max(1);
    let cw = ((width - label - 6.0) / cells as f64).max(1.0);
    let stripe = ((cw - 2.0) / world.max(1) as f64).max(0.25);
    // One path per rank colour.
    let mut per_colour: Vec<Vec<[f64; 4]>> = vec![Vec::new(); world];
    let mut empty: Vec<[f64; 4]> = Vec::new();
    for r in 0..world {
        let y = top + TITLE_H + r as f64 * rh;
        if rh >= 10.0 {
            ctx.set_fill_style_str("#333");
            let _ = ctx.fill_text(&format!("r{r}"), 6.0, y + rh / 2.0 + 4.0);
        }
        for cell in 0..c.cells() {
            let x = label + cell as f64 * cw;
            let bits = c.at(r, cell, pos);
            empty.push([x, y, cw - 1.0, rh - 2.0]);
            for (q, rects) in per_colour.iter_mut().enumerate() {
                if bits & (1u64 << q) != 0 {
                    rects.push([x + 1.0 + q as f64 * stripe, y + 1.0, stripe, rh - 4.0]);
                }
            }
        }
    }
    ctx.begin_path();
    for [x, y, w, h] in &empty {
        ctx.rect(*x, *y, *w, *h);
    }
    ctx.set_fill_style_str("#eef0f3");
    ctx.fill();
    for (q, rects) in per_colour.iter().enumerate() {
        if rects.is_empty() {
            continue;
        }
        ctx.begin_path();
        for [x, y, w, h] in rects {
            ctx.rect(*x, *y, *w, *h);
        }
        ctx.set_fill_style_str(&rank_colour(q, world));
        ctx.fill();
    }
    top + TITLE_H + rh * world as f64
}
