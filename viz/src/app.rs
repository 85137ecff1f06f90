//! The application component: what is loaded, the playback position, and how input changes them.
//!
//! One playback position (a count of applied events of the main trace) drives every view; a
//! second trace (compare mode) follows it by time. The views themselves are drawn on canvases in
//! [`App::rendered`]; the HTML around them is in [`crate::view`].

use crate::canvas::{self, timeline};
use crate::examples;
use crate::hang;
use crate::io;
use crate::model::{LoadError, Trace};
use crate::scale;
use gloo_events::EventListener;
use gloo_timers::callback::Interval;
use wasm_bindgen::JsCast;
use web_sys::{HtmlCanvasElement, HtmlElement, KeyboardEvent};
use yew::prelude::*;

/// Which trace a load fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The main trace.
    Main,
    /// The trace compared with it.
    Compare,
}

/// Input to the app.
pub enum Msg {
    /// Fetch a URL into a slot.
    OpenUrl(Slot, String),
    /// Read a picked or dropped file into a slot.
    OpenFile(Slot, web_sys::File),
    /// Bytes arrived.
    Loaded(Slot, String, Vec<u8>, f64),
    /// A load failed.
    Failed(LoadError),
    /// Drop the compared trace.
    CloseCompare,
    /// Swap the main and the compared trace.
    Swap,
    /// Play or pause.
    TogglePlay,
    /// A playback tick.
    Tick,
    /// Step by events.
    Step(i64),
    /// Go to a position.
    Seek(usize),
    /// Set the playback speed.
    Speed(f64),
    /// Jump to the next stall.
    NextStall,
    /// Zoom the timeline by a factor around an x pixel.
    Zoom(f64, f64),
    /// Fit the whole trace.
    Fit,
    /// Pointer pressed on the timeline.
    Down(f64),
    /// Pointer moved on the timeline.
    Move(f64),
    /// Pointer released on the timeline.
    Up(f64, f64),
    /// Export the main trace to Perfetto JSON.
    Export,
    /// A key was pressed.
    Key(KeyboardEvent),
}

/// The application.
pub struct App {
    pub(crate) main: Option<Trace>,
    pub(crate) compare: Option<Trace>,
    /// The hang panels of the main and the compared trace, computed when each is opened.
    pub(crate) hang: Option<hang::Report>,
    pub(crate) hang_compare: Option<hang::Report>,
    pub(crate) pos: usize,
    pub(crate) playing: bool,
    pub(crate) speed: f64,
    pub(crate) error: Option<String>,
    /// The last opened trace was cut short: what it holds is shown, with this warning.
    pub(crate) warning: Option<String>,
    pub(crate) loading: Option<String>,
    pub(crate) window: Option<timeline::Window>,
    pub(crate) selected: Option<(usize, usize)>,
    pub(crate) export_url: Option<String>,
    pub(crate) load_ms: Option<f64>,
    pub(crate) timeline_ref: NodeRef,
    pub(crate) topology_ref: NodeRef,
    pub(crate) buffers_ref: NodeRef,
    pub(crate) buffers_compare_ref: NodeRef,
    pub(crate) root_ref: NodeRef,
    load_started: Option<f64>,
    phases: String,
    draw_started: f64,
    frame_ms: f64,
    frame_parts: String,
    ready_at: Option<f64>,
    drag: Option<(f64, timeline::Window, bool)>,
    ticker: Option<Interval>,
    last_tick: f64,
    play_ns: f64,
    _keys: Option<EventListener>,
}

impl App {
    /// The span of the longest trace loaded, in ns.
    fn longest_ns(&self) -> f64 {
        self.tracks()
            .iter()
            .map(|t| t.duration_ns())
            .fold(1.0, f64::max)
    }

    /// The visible time window.
    pub(crate) fn window(&self) -> timeline::Window {
        self.window.unwrap_or_else(|| scale::fit(self.longest_ns()))
    }

    /// Playback time in ns from the start of the main trace.
    fn now_ns(&self) -> f64 {
        self.main.as_ref().map_or(0.0, |t| {
            scale::ns_since(t.start, t.header.time_unit_ns, t.time_at(self.pos))
        })
    }

    fn timeline_width(&self) -> f64 {
        self.timeline_ref
            .cast::<HtmlCanvasElement>()
            .map_or(800.0, |c| c.width() as f64)
    }

    fn tracks(&self) -> Vec<&Trace> {
        [self.main.as_ref(), self.compare.as_ref()]
            .into_iter()
            .flatten()
            .collect()
    }

    fn set_pos(&mut self, pos: usize) {
        let n = self.main.as_ref().map_or(0, |t| t.events.len());
        self.pos = pos.min(n);
        self.play_ns = self.now_ns();
        self.selected = None;
    }

    fn start_load(&mut self, name: &str) {
        self.loading = Some(name.to_string());
        self.load_started = Some(io::now_ms());
    }

    fn draw(&self) -> String {
        let Some(t) = self.main.as_ref() else {
            return String::new();
        };
        let t0 = io::now_ms();
        let now_ns = self.now_ns();
        if let Some(c) = self.timeline_ref.cast::<HtmlCanvasElement>() {
            let tracks = self.tracks();
            if let Some(ctx) = canvas::context(&c, timeline::height(&tracks)) {
                let parts: Vec<timeline::Track> = tracks
                    .iter()
                    .enumerate()
                    .map(|(i, tr)| timeline::Track {
                        trace: tr,
                        now_ns,
                        selected: match self.selected {
                            Some((ti, s)) if ti == i => Some(s),
                            None if i == 0 => t.current_span(self.pos),
                            _ => None,
                        },
                    })
                    .collect();
                timeline::draw(&ctx, c.width() as f64, &parts, self.window());
            }
        }
        let t1 = io::now_ms();
        if let Some(c) = self.topology_ref.cast::<HtmlCanvasElement>() {
            if let Some(ctx) = canvas::context(&c, canvas::topology::HEIGHT) {
                let drawn = canvas::topology::draw(&ctx, c.width() as f64, t, self.pos);
                // The edges drawn, for the browser check.
                let text = crate::edges::text(&drawn);
                if c.get_attribute("data-edges").as_deref() != Some(text.as_str()) {
                    let _ = c.set_attribute("data-edges", &text);
                }
            }
        }
        let t2 = io::now_ms();
        // Each trace's buffers at the playback time, the compared one beside the played one.
        let compared = self.compare.as_ref().map(|c| {
            let time = scale::time_at_ns(c.start, c.header.time_unit_ns, now_ns);
            (c, c.pos_at(time))
        });
        for (node, shown) in [
            (&self.buffers_ref, Some((t, self.pos))),
            (&self.buffers_compare_ref, compared),
        ] {
            if let (Some(c), Some((tr, pos))) = (node.cast::<HtmlCanvasElement>(), shown) {
                if let Some(ctx) = canvas::context(&c, canvas::buffers::height(tr)) {
                    canvas::buffers::draw(&ctx, c.width() as f64, tr, pos);
                }
            }
        }
        format!(
            "timeline {:.1} ms, topology {:.1} ms, buffers {:.1} ms",
            t1 - t0,
            t2 - t1,
            io::now_ms() - t2
        )
    }

    /// State the browser tests read.
    fn publish(&self) {
        let Some(root) = self.root_ref.cast::<HtmlElement>() else {
            return;
        };
        let state = if self.loading.is_some() {
            "loading"
        } else if self.error.is_some() {
            "error"
        } else if self.main.is_some() {
            "ready"
        } else {
            "empty"
        };
        let set = |k: &str, v: String| {
            let _ = root.set_attribute(k, &v);
        };
        set("data-state", state.to_string());
        set("data-pos", self.pos.to_string());
        set(
            "data-events",
            self.main.as_ref().map_or(0, |t| t.events.len()).to_string(),
        );
        set("data-compare", self.compare.is_some().to_string());
        if let Some(ms) = self.load_ms {
            set("data-load-ms", format!("{ms:.1}"));
        }
        set("data-frame-ms", format!("{:.1}", self.frame_ms));
        set("data-frame-parts", self.frame_parts.clone());
        let w = self.window();
        set("data-window", format!("{:.0} {:.0}", w.t0, w.t1));
        if !self.phases.is_empty() {
            set("data-load-phases", self.phases.clone());
        }
        if let Some(at) = self.ready_at {
            set("data-ready-at", format!("{at:.1}"));
        }
    }
}

impl Component for App {
    type Message = Msg;
    type Properties = ();

    fn create(ctx: &Context<Self>) -> Self {
        let link = ctx.link().clone();
        let keys = web_sys::window().and_then(|w| w.document()).map(|doc| {
            EventListener::new(&doc, "keydown", move |e| {
                if let Some(k) = e.dyn_ref::<KeyboardEvent>() {
                    link.send_message(Msg::Key(k.clone()));
                }
            })
        });
        if let Some(url) = io::query_param("trace") {
            ctx.link().send_message(Msg::OpenUrl(Slot::Main, url));
        }
        if let Some(url) = io::query_param("compare") {
            ctx.link().send_message(Msg::OpenUrl(Slot::Compare, url));
        }
        App {
            main: None,
            compare: None,
            hang: None,
            hang_compare: None,
            pos: 0,
            playing: false,
            speed: 1.0,
            error: None,
            warning: None,
            loading: None,
            window: None,
            selected: None,
            export_url: None,
            load_ms: None,
            timeline_ref: NodeRef::default(),
            topology_ref: NodeRef::default(),
            buffers_ref: NodeRef::default(),
            buffers_compare_ref: NodeRef::default(),
            root_ref: NodeRef::default(),
            load_started: None,
            phases: String::new(),
            draw_started: 0.0,
            frame_ms: 0.0,
            frame_parts: String::new(),
            ready_at: None,
            drag: None,
            ticker: None,
            last_tick: 0.0,
            play_ns: 0.0,
            _keys: keys,
        }
    }

    fn update(&mut self, ctx: &Context<Self>, msg: Msg) -> bool {
        match msg {
            Msg::OpenUrl(slot, url) => {
                self.start_load(&url);
                let link = ctx.link().clone();
                wasm_bindgen_futures::spawn_local(async move {
                    let started = io::now_ms();
                    match io::fetch(&url).await {
                        Ok(b) => link.send_message(Msg::Loaded(slot, url, b, started)),
                        Err(reason) => {
                            link.send_message(Msg::Failed(LoadError::Io { name: url, reason }))
                        }
                    }
                });
            }
            Msg::OpenFile(slot, file) => {
                let name = file.name();
                self.start_load(&name);
                let link = ctx.link().clone();
                wasm_bindgen_futures::spawn_local(async move {
                    let started = io::now_ms();
                    match io::read_file(file).await {
                        Ok(b) => link.send_message(Msg::Loaded(slot, name, b, started)),
                        Err(reason) => {
                            link.send_message(Msg::Failed(LoadError::Io { name, reason }))
                        }
                    }
                });
            }
            Msg::Loaded(slot, name, bytes, started) => {
                self.loading = None;
                let short = name.rsplit('/').next().unwrap_or(&name).to_string();
                let t0 = io::now_ms();
                let indexed = Trace::decode(&short, bytes);
                let t1 = io::now_ms();
                self.phases = format!(
                    "read {:.0} ms, decode and index {:.0} ms",
                    t0 - started,
                    t1 - t0
                );
                self.draw_started = t1;
                match indexed {
                    Ok(t) => {
                        self.error = None;
                        self.warning = t.warning_text();
                        let report = hang::report(&t, hang::MAX_ROWS);
                        match slot {
                            Slot::Main => {
                                self.hang = report;
                                self.pos = t.events.len();
                                self.main = Some(t);
                                self.selected = None;
                                self.playing = false;
                                self.ticker = None;
                                self.play_ns = self.now_ns();
                            }
                            Slot::Compare => {
                                self.hang_compare = report;
                                self.compare = Some(t);
                            }
                        }
                        self.window = None;
                    }
                    Err(e) => {
                        self.error = Some(e.to_string());
                        self.load_started = None;
                    }
                }
            }
            Msg::Failed(e) => {
                self.loading = None;
                self.load_started = None;
                self.error = Some(e.to_string());
            }
            Msg::CloseCompare => {
                self.compare = None;
                self.hang_compare = None;
                self.window = None;
            }
            Msg::Swap => {
                if self.compare.is_some() {
                    std::mem::swap(&mut self.main, &mut self.compare);
                    std::mem::swap(&mut self.hang, &mut self.hang_compare);
                    let n = self.main.as_ref().map_or(0, |t| t.events.len());
                    self.set_pos(n);
                }
            }
            Msg::TogglePlay => {
                let n = self.main.as_ref().map_or(0, |t| t.events.len());
                if self.main.is_none() {
                    return false;
                }
                self.playing = !self.playing;
                if self.playing {
                    if self.pos >= n {
                        self.set_pos(0);
                    }
                    self.play_ns = self.now_ns();
                    self.last_tick = io::now_ms();
                    let link = ctx.link().clone();
                    self.ticker = Some(Interval::new(33, move || link.send_message(Msg::Tick)));
                } else {
                    self.ticker = None;
                }
            }
            Msg::Tick => {
                let Some(t) = self.main.as_ref() else {
                    return false;
                };
                let now = io::now_ms();
                let dt = (now - self.last_tick).clamp(0.0, 200.0);
                self.last_tick = now;
                // At 1x the whole trace plays in 10 s.
                self.play_ns += dt * self.speed * t.duration_ns().max(1.0) / 10_000.0;
                let pos = t.pos_at(scale::time_at_ns(
                    t.start,
                    t.header.time_unit_ns,
                    self.play_ns,
                ));
                self.pos = pos;
                // Keep the cursor in view while playing zoomed in.
                if let Some(w) = self.window {
                    let span = w.t1 - w.t0;
                    if self.play_ns > w.t1 || self.play_ns < w.t0 {
                        let t0 = self.play_ns - span * 0.1;
                        let moved = timeline::Window { t0, t1: t0 + span };
                        self.window = Some(scale::bound(moved, self.longest_ns()));
                    }
                }
                self.selected = None;
                if pos >= t.events.len() {
                    self.playing = false;
                    self.ticker = None;
                }
            }
            Msg::Step(d) => {
                let p = (self.pos as i64 + d).max(0) as usize;
                self.set_pos(p);
            }
            Msg::Seek(p) => self.set_pos(p),
            Msg::Speed(s) => self.speed = s.clamp(0.01, 1000.0),
            Msg::NextStall => {
                let next = self.main.as_ref().and_then(|t| {
                    let i = t.stall_marks.partition_point(|m| (*m as usize) <= self.pos);
                    let m = *t.stall_marks.get(i)? as usize;
                    Some((m, t.current_span(m)))
                });
                if let Some((m, span)) = next {
                    self.set_pos(m);
                    self.selected = span.map(|s| (0, s));
                }
            }
            Msg::Zoom(f, x) => {
                let w = self.window();
                let width = self.timeline_width();
                let plot = (width - timeline::LABEL_W).max(10.0);
                let at = w.t0 + ((x - timeline::LABEL_W).clamp(0.0, plot) / plot) * (w.t1 - w.t0);
                self.window = Some(scale::zoom(w, f, at, self.longest_ns()));
            }
            Msg::Fit => self.window = None,
            Msg::Down(x) => self.drag = Some((x, self.window(), false)),
            Msg::Move(x) => {
                let Some((x0, w0, _)) = self.drag else {
                    return false;
                };
                if (x - x0).abs() < 3.0 {
                    return false;
                }
                let plot = (self.timeline_width() - timeline::LABEL_W).max(10.0);
                let d = (x - x0) / plot * (w0.t1 - w0.t0);
                self.window = Some(scale::pan(w0, -d, self.longest_ns()));
                self.drag = Some((x0, w0, true));
            }
            Msg::Up(x, y) => {
                let dragged = matches!(self.drag.take(), Some((_, _, true)));
                if !dragged {
                    let tracks = self.tracks();
                    let hit = timeline::hit(&tracks, self.timeline_width(), self.window(), x, y);
                    self.selected = hit;
                }
            }
            Msg::Export => {
                let Some(t) = self.main.as_ref() else {
                    return false;
                };
                let json = t.to_json();
                if let Some(old) = self.export_url.take() {
                    io::revoke(&old);
                }
                match io::json_url(&json) {
                    Ok(url) => self.export_url = Some(url),
                    Err(e) => self.error = Some(format!("export failed: {e}")),
                }
            }
            Msg::Key(k) => return self.key(ctx, &k),
        }
        true
    }

    fn view(&self, ctx: &Context<Self>) -> Html {
        crate::view::view(self, ctx)
    }

    fn rendered(&mut self, _ctx: &Context<Self>, _first: bool) {
        let t0 = io::now_ms();
        self.frame_parts = self.draw();
        self.frame_ms = io::now_ms() - t0;
        if self.main.is_some() && self.loading.is_none() {
            if let Some(started) = self.load_started.take() {
                let now = io::now_ms();
                self.load_ms = Some(now - started);
                self.phases.push_str(&format!(
                    ", render and draw {:.0} ms",
                    now - self.draw_started
                ));
                self.ready_at = Some(now);
            }
        }
        if let Some(url) = &self.export_url {
            // Start the download once per export.
            if let Some(a) = web_sys::window()
                .and_then(|w| w.document())
                .and_then(|d| d.get_element_by_id("perfetto-link"))
                .and_then(|a| a.dyn_into::<HtmlElement>().ok())
            {
                if a.get_attribute("data-clicked").as_deref() != Some(url.as_str()) {
                    let _ = a.set_attribute("data-clicked", url);
                    a.click();
                }
            }
        }
        self.publish();
    }
}

impl App {
    fn key(&mut self, ctx: &Context<Self>, k: &KeyboardEvent) -> bool {
        let in_field = k
            .target()
            .and_then(|t| t.dyn_into::<HtmlElement>().ok())
            .is_some_and(|e| matches!(e.tag_name().as_str(), "INPUT" | "SELECT" | "TEXTAREA"));
        if in_field && k.key() != " " {
            return false;
        }
        let big = if k.shift_key() { 100 } else { 1 };
        let msg = match k.key().as_str() {
            " " | "k" => Msg::TogglePlay,
            "ArrowRight" | "l" => Msg::Step(big),
            "ArrowLeft" | "j" => Msg::Step(-big),
            "Home" => Msg::Seek(0),
            "End" => Msg::Seek(usize::MAX),
            "n" => Msg::NextStall,
            "+" | "=" => Msg::Speed(self.speed * 2.0),
            "-" => Msg::Speed(self.speed / 2.0),
            "0" | "f" => Msg::Fit,
            "e" => Msg::Export,
            _ => return false,
        };
        k.prevent_default();
        ctx.link().send_message(msg);
        false
    }
}

/// The example files, for the menu.
pub fn example_url(file: &str) -> String {
    format!("{}{file}", examples::DIR)
}
