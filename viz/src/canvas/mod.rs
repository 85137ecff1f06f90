//! Canvas drawing of the views.
//!
//! Every view is drawn on one `<canvas>` with the 2D context, never one DOM node per event:
//! shapes are culled to the visible window, merged when several fall on one pixel column, and
//! batched into one path per colour, so a million-event trace draws in milliseconds.

pub mod buffers;
pub mod timeline;
pub mod topology;

use wasm_bindgen::JsCast;
use web_sys::{CanvasRenderingContext2d, HtmlCanvasElement};

/// The 2D context of a canvas, sized to its CSS box (width) and the given height.
pub fn context(canvas: &HtmlCanvasElement, height: u32) -> Option<CanvasRenderingContext2d> {
    let width = canvas.client_width().max(200) as u32;
    if canvas.width() != width {
        canvas.set_width(width);
    }
    if canvas.height() != height {
        canvas.set_height(height);
    }
    canvas
        .get_context("2d")
        .ok()
        .flatten()
        .and_then(|c| c.dyn_into::<CanvasRenderingContext2d>().ok())
}

/// The colour of a rank (hues spread around the wheel).
pub fn rank_colour(rank: usize, world: usize) -> String {
    let hue = (rank * 360) / world.max(1);
    format!("hsl({hue}, 70%, 50%)")
}

/// Fills batched rectangles, one path per colour.
pub struct Batches {
    colours: &'static [&'static str],
    rects: Vec<Vec<[f64; 4]>>,
}

impl Batches {
    /// Empty batches for a palette.
    pub fn new(colours: &'static [&'static str]) -> Batches {
        Batches {
            colours,
            rects: vec![Vec::new(); colours.len()],
        }
    }

    /// Queues a rectangle in colour `c`.
    pub fn rect(&mut self, c: usize, x: f64, y: f64, w: f64, h: f64) {
        if let Some(v) = self.rects.get_mut(c) {
            v.push([x, y, w, h]);
        }
    }

    /// Draws everything queued.
    pub fn fill(&self, ctx: &CanvasRenderingContext2d) {
        for (c, rects) in self.rects.iter().enumerate() {
            if rects.is_empty() {
                continue;
            }
            ctx.begin_path();
            for [x, y, w, h] in rects {
                ctx.rect(*x, *y, *w, *h);
            }
            ctx.set_fill_style_str(self.colours[c]);
            ctx.fill();
        }
    }
}
