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

/// An RGBA frame filled in wasm memory and handed to the canvas in one `putImageData` call:
/// tens of thousands of bars cost one call across the JS boundary instead of one each.
pub struct Pixels {
    w: usize,
    h: usize,
    data: Vec<u8>,
}

impl Pixels {
    /// A white frame.
    pub fn new(w: u32, h: u32) -> Pixels {
        let (w, h) = (w as usize, h as usize);
        Pixels {
            w,
            h,
            data: vec![255; w * h * 4],
        }
    }

    /// Fills a rectangle (clipped, at least one pixel wide and high).
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, rgba: [u8; 4]) {
        let clamp = |v: f64, max: usize| (v.max(0.0) as usize).min(max);
        let x0 = clamp(x.floor(), self.w);
        let x1 = clamp((x + w).ceil(), self.w).max((x0 + 1).min(self.w));
        let y0 = clamp(y.round(), self.h);
        let y1 = clamp((y + h).round(), self.h).max((y0 + 1).min(self.h));
        for row in y0..y1 {
            let line = &mut self.data[(row * self.w + x0) * 4..(row * self.w + x1) * 4];
            for px in line.chunks_exact_mut(4) {
                px.copy_from_slice(&rgba);
            }
        }
    }

    /// Draws the frame at the canvas origin.
    pub fn put(&self, ctx: &CanvasRenderingContext2d) {
        if let Ok(img) = web_sys::ImageData::new_with_u8_clamped_array_and_sh(
            wasm_bindgen::Clamped(&self.data),
            self.w as u32,
            self.h as u32,
        ) {
            let _ = ctx.put_image_data(&img, 0.0, 0.0);
        }
    }
}
