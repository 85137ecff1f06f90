//! symm-viz: replays symm traces in the browser.
//!
//! A yew app compiled to WebAssembly. It opens a trace (file picker, drag and drop, `?trace=URL`
//! or the built-in [`examples`]), decodes it with symm-core's reader ([`model`]) and plays it
//! back: one playback position drives the topology, timeline and buffers views ([`canvas`]) and
//! the details panel ([`describe`]). A trace from a run that timed out gets a hang report with the
//! wait-for chain ([`hang`]); a second trace can be compared on the same time axis next to the
//! cost model's prediction; "Export to Perfetto" writes Chrome trace JSON with symm-core's
//! [`symm_core::perfetto`], the same code as `cargo xtask trace export --perfetto`.

pub mod app;
pub mod buffers;
pub mod canvas;
pub mod describe;
pub mod examples;
pub mod hang;
pub mod io;
pub mod model;
pub mod view;

use wasm_bindgen::prelude::*;

/// Mounts the app on the page's body.
#[wasm_bindgen(start)]
pub fn start() {
    yew::Renderer::<app::App>::new().render();
}
