//! symm-viz: replays symm traces in the browser.
