//! The buffers view: per rank a row of output chunks; each chunk is split into one stripe per
//! rank, filled in that rank's colour when the chunk holds its contribution. A correct all-reduce
//! ends with every chunk of every rank fully striped.

use super::rank_colour;
use crate::model::Trace;
use web_sys::CanvasRenderingContext2d;

/// Canvas height for a trace.
pub fn height(t: &Trace) -> u32 {
    (24.0 + row_h(t) * t.cells.world as f64).ceil() as u32 + 4
}

fn row_h(t: &Trace) -> f64 {
    if t.cells.world <= 16 {
        30.0
    } else {
        (480.0 / t.cells.world as f64).max(4.0)
    }
}

/// Draws the buffers at a playback position.
pub fn draw(ctx: &CanvasRenderingContext2d, width: f64, t: &Trace, pos: usize) {
    let hgt = height(t) as f64;
    ctx.set_fill_style_str("#ffffff");
    ctx.fill_rect(0.0, 0.0, width, hgt.max(40.0));
    ctx.set_font("11px sans-serif");
    ctx.set_fill_style_str("#333");
    let c = &t.cells;
    if !c.recorded || c.cells() == 0 {
        let _ = ctx.fill_text(
            "this trace records no chunk contents (simulator runs with contents on do)",
            6.0,
            16.0,
        );
        return;
    }
    let _ = ctx.fill_text(
        &format!(
            "output buffers: {} chunks per rank, stripes = ranks contained",
            c.cells()
        ),
        6.0,
        14.0,
    );
    let world = c.world as usize;
    let rh = row_h(t);
    let label = 34.0;
    let cw = ((width - label - 6.0) / c.cells() as f64).max(1.0);
    let stripe = ((cw - 2.0) / world as f64).max(0.25);
    // One path per rank colour.
    let mut per_colour: Vec<Vec<[f64; 4]>> = vec![Vec::new(); world];
    let mut empty: Vec<[f64; 4]> = Vec::new();
    for r in 0..world {
        let y = 22.0 + r as f64 * rh;
        if rh >= 10.0 {
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
}
