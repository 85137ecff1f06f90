//! symm-viz: replays symm traces in the browser.
//!
//! A yew app compiled to WebAssembly. It opens a trace (file picker, drag and drop, `?trace=URL`
//! or the built-in [`examples`]), decodes it with symm-core's reader ([`model`]) and plays it
//! back: one playback position drives the topology, timeline and buffers views ([`canvas`]) and
//! the details panel ([`describe`]). A trace from a run that timed out gets a hang report with the
//! wait-for chain ([`hang`]); a second trace can be compared on the same time axis next to the
//! cost model's prediction; "Export to Perfetto" writes Chrome trace JSON with symm-core's
//! [`symm_core::perfetto`], the same code as `cargo xtask trace export --perfetto`.
//!
//! A trace cut short (no end record, or a partial last record) opens with what it holds and a
//! warning naming the byte offset; a damaged one is refused with the offset.
//!
//! The `app` feature (on by default) is the browser app. Without it the crate is the viewer's
//! model only ([`model`], [`buffers`], [`edges`], [`hang`], [`describe`], and the views' bounded
//! arithmetic: [`scale`] for the timeline, [`flight`] for the topology), built natively on
//! symm-core alone, which the fuzz targets drive from bytes to the Perfetto export.

#![forbid(unsafe_code)]

#[cfg(feature = "app")]
pub mod app;
pub mod buffers;
#[cfg(feature = "app")]
pub mod canvas;
pub mod describe;
pub mod edges;
pub mod examples;
pub mod flight;
pub mod hang;
#[cfg(feature = "app")]
pub mod io;
pub mod model;
pub mod scale;
#[cfg(feature = "app")]
pub mod view;

/// Mounts the app on the page's body.
#[cfg(feature = "app")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn start() {
    yew::Renderer::<app::App>::new().render();
}
