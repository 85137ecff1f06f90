//! The HTML around the canvases: open menu, controls, details, hang report, compare summary.

use crate::app::{example_url, App, Msg, Slot};
use crate::examples::EXAMPLES;
use crate::{describe, hang};
use symm_core::cost::{self, Link};
use wasm_bindgen::JsCast;
use web_sys::{DragEvent, HtmlInputElement, HtmlSelectElement, MouseEvent, WheelEvent};
use yew::prelude::*;

fn example_menu(ctx: &Context<App>, id: &'static str, slot: Slot, prompt: &'static str) -> Html {
    let onchange = ctx.link().batch_callback(move |e: Event| {
        let sel: HtmlSelectElement = e.target()?.dyn_into().ok()?;
        let v = sel.value();
        sel.set_value("");
        (!v.is_empty()).then(|| Msg::OpenUrl(slot, example_url(&v)))
    });
    html! {
        <select id={id} {onchange}>
            <option value="" selected=true>{ prompt }</option>
            { for EXAMPLES.iter().map(|(file, label)| html! {
                <option value={*file}>{ *label }</option>
            }) }
        </select>
    }
}

fn file_input(ctx: &Context<App>, id: &'static str, slot: Slot) -> Html {
    let onchange = ctx.link().batch_callback(move |e: Event| {
        let input: HtmlInputElement = e.target()?.dyn_into().ok()?;
        let file = input.files()?.get(0)?;
        input.set_value("");
        Some(Msg::OpenFile(slot, file))
    });
    html! { <input type="file" id={id} accept=".trace,.bin,*/*" {onchange} /> }
}

fn summary(t: &crate::model::Trace) -> Html {
    let measured_us = t.duration_ns() / 1e3;
    // Launch excluded everywhere, as `cargo xtask demo` prints them: a trace's events start
    // after the launch, so its first-to-last span is compared with the model's time after it.
    let nv = cost::predict(&t.header.request, &Link::NVLINK4) - Link::NVLINK4.launch_us;
    let host = cost::predict(&t.header.request, &Link::HOST) - Link::HOST.launch_us;
    let r = &t.header.request;
    html! {
        <tr>
            <td>{ &t.name }</td>
            <td>{ format!("{} / {}", r.collective.name(), r.algorithm.name()) }</td>
            <td>{ describe::world(&t.header) }</td>
            <td>{ describe::size(r.bytes) }</td>
            <td class="num">{ format!("{measured_us:.2} us") }</td>
            <td class="num">{ format!("{nv:.2} us") }</td>
            <td class="num">{ format!("{host:.2} us") }</td>
            <td class="num">{ t.events.len() }</td>
        </tr>
    }
}

/// The hang panel of trace `t` (nothing when it finished): `id` is `hang` for the played trace
/// and `hang-compare` for the compared one, so a deadlock shows in the compare view too. At most
/// [`hang::MAX_ROWS`] stalled waits are listed, then how many more there are.
fn hang_report(
    t: &crate::model::Trace,
    report: Option<&hang::Report>,
    id: &'static str,
    compared: bool,
) -> Html {
    let Some(h) = report else {
        return html! {};
    };
    let whose = if compared {
        format!("The compared trace ({}) hung", t.name)
    } else {
        "This run hung".to_string()
    };
    html! {
        <div id={id} class="panel hang">
            <h3>{ format!("{whose}: {} wait(s) never finished", h.stalls) }</h3>
            <ul>
            { for h.rows.iter().map(|row| html! { <li>{ row }</li> }) }
            if h.more > 0 {
                <li class="more">{ format!("and {} more", h.more) }</li>
            }
            </ul>
            <p>{ "wait-for chain: " }{ &h.chain }</p>
            <p class="root">{ &h.root }</p>
        </div>
    }
}

/// The name of the trace in a slot, beside its file button (the button's own text would say
/// "No file chosen" for a trace opened from the URL or a menu).
fn loaded_name(id: &'static str, t: Option<&crate::model::Trace>) -> Html {
    html! { <span id={id} class="loaded">{ t.map_or("none".to_string(), |t| t.name.clone()) }</span> }
}

/// A buffers panel's heading: in a compare view each trace has its own, named.
fn buffers_title(t: Option<&crate::model::Trace>, named: bool) -> String {
    match t {
        Some(t) if named => format!("buffers: {}", t.name),
        _ => "buffers".to_string(),
    }
}

/// The whole page.
pub fn view(app: &App, ctx: &Context<App>) -> Html {
    let link = ctx.link();
    let n = app.main.as_ref().map_or(0, |t| t.events.len());
    let ondrop = link.batch_callback(|e: DragEvent| {
        e.prevent_default();
        let file = e.data_transfer()?.files()?.get(0)?;
        Some(Msg::OpenFile(Slot::Main, file))
    });
    let ondragover = Callback::from(|e: DragEvent| e.prevent_default());
    let onscrub = link.batch_callback(|e: InputEvent| {
        let input: HtmlInputElement = e.target()?.dyn_into().ok()?;
        input.value().parse::<usize>().ok().map(Msg::Seek)
    });
    let onspeed = link.batch_callback(|e: Event| {
        let sel: HtmlSelectElement = e.target()?.dyn_into().ok()?;
        sel.value().parse::<f64>().ok().map(Msg::Speed)
    });
    let onwheel = link.callback(|e: WheelEvent| {
        e.prevent_default();
        let f = if e.delta_y() > 0.0 { 1.25 } else { 0.8 };
        Msg::Zoom(f, e.offset_x() as f64)
    });
    let ondown = link.callback(|e: MouseEvent| Msg::Down(e.offset_x() as f64));
    let onmove = link.callback(|e: MouseEvent| Msg::Move(e.offset_x() as f64));
    let onup = link.callback(|e: MouseEvent| Msg::Up(e.offset_x() as f64, e.offset_y() as f64));
    let details = app.main.as_ref().map(|t| {
        let sel = match app.selected {
            Some((1, s)) => app.compare.as_ref().map(|c| (c, s)),
            Some((_, s)) => Some((t, s)),
            None => t.current_span(app.pos).map(|s| (t, s)),
        };
        let ev = app.pos.checked_sub(1).and_then(|i| t.events.get(i));
        let what = ev.map(|e| match e.mark {
            crate::model::Mark::Begin => "begins",
            crate::model::Mark::End => "ends",
            crate::model::Mark::Stall => "stalls",
        });
        (
            sel.map(|(tr, s)| describe::op(tr, s)).unwrap_or_default(),
            format!(
                "event {} of {}{} at {}",
                app.pos,
                t.events.len(),
                what.map(|w| format!(" (an op {w})")).unwrap_or_default(),
                describe::duration(t, t.time_at(app.pos).saturating_sub(t.start))
            ),
        )
    });
    let speeds = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0];
    html! {
        <div id="app" ref={app.root_ref.clone()} {ondrop} {ondragover}>
            <header>
                <b>{ "symm-viz" }</b>
                { example_menu(ctx, "example", Slot::Main, "open an example...") }
                <label>{ "open a file " }{ file_input(ctx, "file", Slot::Main) }</label>
                { loaded_name("file-name", app.main.as_ref()) }
                <span class="hint">{ "or drop a .trace file anywhere, or add ?trace=URL" }</span>
                { example_menu(ctx, "compare-example", Slot::Compare, "compare with...") }
                <label>{ "compare file " }{ file_input(ctx, "compare-file", Slot::Compare) }</label>
                { loaded_name("compare-name", app.compare.as_ref()) }
                if app.compare.is_some() {
                    <button id="swap" title="play the compared trace instead" onclick={link.callback(|_| Msg::Swap)}>{ "swap" }</button>
                    <button id="close-compare" onclick={link.callback(|_| Msg::CloseCompare)}>{ "close compare" }</button>
                }
            </header>
            if let Some(e) = &app.error {
                <div id="error" class="error">{ e }</div>
            }
            if let Some(w) = &app.warning {
                <div id="warning" class="warning">{ format!("warning: {w}") }</div>
            }
            if let Some(l) = &app.loading {
                <div class="loading">{ format!("loading {l}...") }</div>
            }
            if app.main.is_none() {
                <p class="empty">{ "Open a trace: pick an example above, choose a file or drop one here." }</p>
            }
            <div class="controls" style={if app.main.is_some() { "" } else { "display:none" }}>
                <button id="play" title="space" onclick={link.callback(|_| Msg::TogglePlay)}>
                    { if app.playing { "pause" } else { "play" } }</button>
                <button id="step-back" title="left arrow (shift: 100)" onclick={link.callback(|_| Msg::Step(-1))}>{ "< step" }</button>
                <button id="step-fwd" title="right arrow (shift: 100)" onclick={link.callback(|_| Msg::Step(1))}>{ "step >" }</button>
                <button id="next-stall" title="n" onclick={link.callback(|_| Msg::NextStall)}>{ "next stall" }</button>
                <input id="scrub" type="range" min="0" max={n.to_string()} value={app.pos.to_string()} oninput={onscrub} />
                <label>{ "speed " }
                    <select id="speed" onchange={onspeed}>
                    { for speeds.iter().map(|s| html! {
                        <option value={s.to_string()} selected={(*s - app.speed).abs() < 1e-9}>{ format!("{s}x") }</option>
                    }) }
                    </select>
                </label>
                <button id="fit" title="0" onclick={link.callback(|_| Msg::Fit)}>{ "fit" }</button>
                <button id="export" title="e" onclick={link.callback(|_| Msg::Export)}>{ "Export to Perfetto" }</button>
                if let Some(url) = &app.export_url {
                    <a id="perfetto-link" href={url.clone()} download={format!("{}.json", app.main.as_ref().map_or("trace", |t| t.name.as_str()))}>{ "perfetto json" }</a>
                }
                <span class="keys">{ "keys: space play, arrows step, n next stall, +/- speed, 0 fit, e export" }</span>
            </div>
            <div class="views" style={if app.main.is_some() { "" } else { "display:none" }}>
                <div class="row">
                    <div class="panel"><h3>{ "topology" }</h3><canvas id="topology" ref={app.topology_ref.clone()}></canvas></div>
                    <div class="panel"><h3>{ buffers_title(app.main.as_ref(), app.compare.is_some()) }</h3><canvas id="buffers" ref={app.buffers_ref.clone()}></canvas></div>
                    if app.compare.is_some() {
                        <div class="panel"><h3>{ buffers_title(app.compare.as_ref(), true) }</h3><canvas id="buffers-compare" ref={app.buffers_compare_ref.clone()}></canvas></div>
                    }
                </div>
                <div class="panel">
                    <h3>{ "timeline" }<span class="hint">{ " wheel: zoom, drag: pan, click: select; waits shade yellow to red by stall, black: never finished" }</span></h3>
                    <canvas id="timeline" ref={app.timeline_ref.clone()} onwheel={onwheel}
                        onmousedown={ondown} onmousemove={onmove} onmouseup={onup}></canvas>
                </div>
                <div id="details" class="panel">
                    <h3>{ "details" }</h3>
                    if let Some((op, at)) = details {
                        <p class="at">{ at }</p>
                        <p class="op">{ op }</p>
                    }
                </div>
                { app.main.as_ref().map_or(html! {}, |t| hang_report(t, app.hang.as_ref(), "hang", false)) }
                { app.compare.as_ref().map_or(html! {}, |t| hang_report(t, app.hang_compare.as_ref(), "hang-compare", true)) }
                <div id="compare" class="panel">
                    <h3>{ "measured and predicted" }</h3>
                    <table>
                        <tr><th>{ "trace" }</th><th>{ "schedule" }</th><th>{ "world" }</th><th>{ "bytes" }</th>
                            <th>{ "measured (first to last event)" }</th><th>{ "model, NVLink 4 (launch excluded)" }</th><th>{ "model, host link (launch excluded)" }</th><th>{ "events" }</th></tr>
                        { for [app.main.as_ref(), app.compare.as_ref()].into_iter().flatten().map(summary) }
                    </table>
                </div>
            </div>
        </div>
    }
}
