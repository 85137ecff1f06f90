//! The browser tests of the viz, in real headless Chromium driven over WebDriver.
//!
//! Each check drives the page the way a person does (menus, buttons, keys, the file picker, a
//! dropped file) and reads the state the app publishes on its root element (`data-state`,
//! `data-pos`, `data-events`, `data-load-ms`, `data-ready-at`) and the topology canvas's
//! `data-edges` ([`super::topology`]).

use super::examples;
use super::http;
use crate::util;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use symm_core::perfetto;
use symm_core::trace::Reader;
use symm_viz_serve::webdriver::Browser;

const RING4: &str = "all_reduce-ring-w4.trace";

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Chromium and chromedriver, installed with apt-get when missing.
pub fn install() -> Result<(PathBuf, PathBuf), String> {
    let find = || Some((which("chromium")?, which("chromedriver")?));
    if let Some(found) = find() {
        return Ok(found);
    }
    eprintln!("viz: installing chromium and chromium-driver with apt-get");
    let apt = |args: &[&str]| {
        util::run(
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    apt(&["update", "-qq"])?;
    apt(&[
        "install",
        "-y",
        "-qq",
        "--no-install-recommends",
        "chromium",
        "chromium-driver",
    ])?;
    find().ok_or_else(|| "chromium or chromedriver is still missing after apt-get install".into())
}

fn attr(b: &Browser, name: &str) -> Result<String, String> {
    let v = b.js(&format!(
        "return document.getElementById('app').getAttribute('{name}') || '';"
    ))?;
    Ok(v.as_str().unwrap_or("").to_string())
}

fn num(b: &Browser, name: &str) -> Result<f64, String> {
    attr(b, name)?
        .parse::<f64>()
        .map_err(|e| format!("{name}: {e}"))
}

fn ready(b: &Browser, timeout_s: u64) -> Result<(), String> {
    b.wait_for(
        "the trace to open",
        "var a = document.getElementById('app'); return !!a && a.getAttribute('data-state') === 'ready';",
        Duration::from_secs(timeout_s),
    )
    .map_err(|e| {
        let err = b.js("var e = document.getElementById('error'); return e ? e.textContent : '';");
        format!("{e} (page error: {err:?})")
    })
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    ok.then_some(())
        .ok_or_else(|| format!("browser check failed: {what}"))
}

fn select(b: &Browser, id: &str, value: &str) -> Result<(), String> {
    b.js(&format!(
        "var s = document.getElementById('{id}'); s.value = '{value}'; s.dispatchEvent(new Event('change', {{bubbles: true}})); return true;"
    ))
    .map(|_| ())
}

fn painted(b: &Browser, id: &str) -> Result<bool, String> {
    let v = b.js(&format!(
        "var c = document.getElementById('{id}'); var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;\
         var n = 0; for (var i = 0; i < d.length; i += 4) {{ if (d[i] < 200 || d[i+1] < 200 || d[i+2] < 200) n++; }} return n > 50;"
    ))?;
    Ok(v == Json::Bool(true))
}

/// Runs every check and returns the one-line summary.
pub fn run_all(
    dist: &Path,
    scratch: &Path,
    chromium: &Path,
    driver: &Path,
    screenshots: Option<&Path>,
) -> Result<String, String> {
    let traces = scratch.join("traces");
    std::fs::create_dir_all(&traces).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    // Reuse the large trace of an earlier run in this target directory when it still decodes.
    let big_path = traces.join("big.trace");
    let count = |b: &[u8]| Reader::new(b).ok().map(|r| r.map_while(Result::ok).count());
    let big = match std::fs::read(&big_path) {
        Ok(b) if count(&b).is_some_and(|n| n >= 1_000_000) => b,
        _ => {
            let b = examples::big(1_000_000)?;
            std::fs::write(&big_path, &b).map_err(|e| e.to_string())?;
            b
        }
    };
    let big_events = count(&big).unwrap_or(0);
    eprintln!(
        "viz: prepared a {big_events}-event trace ({:.1} MB) in {:.1} s",
        big.len() as f64 / 1e6,
        t0.elapsed().as_secs_f64()
    );
    let ring = std::fs::read(dist.join("examples").join(RING4)).map_err(|e| e.to_string())?;
    // A flipped byte mid-file (refused) and a file cut short as by a crash (opens with a warning).
    let corrupt = scratch.join("corrupt.trace");
    let mut damaged = ring.clone();
    damaged[ring.len() / 2] ^= 0x08;
    std::fs::write(&corrupt, &damaged).map_err(|e| e.to_string())?;
    let truncated = scratch.join("truncated.trace");
    std::fs::write(&truncated, &ring[..ring.len() * 2 / 3]).map_err(|e| e.to_string())?;
    let addr = http::start(dist, &traces, http::Port::Given(0))?.addr;
    let base = format!("http://{addr}/");
    let b = Browser::start(chromium, driver, scratch)?;
    let mut passed = 0;

    // 1. An example from ?trace=, at the end of the run, every view painted.
    b.goto(&format!("{base}?trace=examples/{RING4}"))?;
    ready(&b, 30)?;
    let n = num(&b, "data-events")? as usize;
    check(
        n > 0 && num(&b, "data-pos")? as usize == n,
        "the example opens at its last event",
    )?;
    for id in ["timeline", "topology", "buffers"] {
        check(painted(&b, id)?, &format!("the {id} view is drawn"))?;
    }
    passed += 1;

    // Screenshots of each view at the end of the ring all-reduce of world 4.
    let shots = scratch.join("img");
    std::fs::create_dir_all(&shots).map_err(|e| e.to_string())?;
    let shot = |file: &str, css: &str| -> Result<(), String> {
        let png = b.screenshot(css)?;
        check(png.starts_with(b"\x89PNG"), "screenshots are PNG")?;
        std::fs::write(shots.join(file), &png).map_err(|e| e.to_string())?;
        if let Some(dir) = screenshots {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            std::fs::write(dir.join(file), &png).map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    shot("viz-topology.png", ".row > .panel:nth-child(1)")?;
    shot("viz-buffers.png", ".row > .panel:nth-child(2)")?;
    shot("viz-timeline.png", "#timeline")?;
    shot("viz-details.png", "#details")?;

    // 2. Step with the buttons and the keyboard, scrub, play.
    b.click("#step-back")?;
    check(
        num(&b, "data-pos")? as usize == n - 1,
        "step back one event",
    )?;
    b.keys("body", "\u{E012}")?; // left arrow
    check(
        num(&b, "data-pos")? as usize == n - 2,
        "left arrow steps back",
    )?;
    b.keys("body", "\u{E011}")?; // home
    check(num(&b, "data-pos")? as usize == 0, "home goes to the start")?;
    b.click("#step-fwd")?;
    check(num(&b, "data-pos")? as usize == 1, "step forward one event")?;
    let mid = n / 2;
    b.js(&format!(
        "var s = document.getElementById('scrub'); s.value = '{mid}'; s.dispatchEvent(new Event('input', {{bubbles: true}})); return true;"
    ))?;
    check(
        num(&b, "data-pos")? as usize == mid,
        "scrubbing moves the position",
    )?;
    std::fs::write(shots.join("mid-page.png"), b.screenshot("#app")?).map_err(|e| e.to_string())?;
    let words = b.js("return document.querySelector('#details .op').textContent;")?;
    check(
        words.as_str().is_some_and(|w| w.starts_with("rank ")),
        "the details name the op in words",
    )?;
    b.click("#play")?;
    std::thread::sleep(Duration::from_millis(400));
    b.click("#play")?;
    check(num(&b, "data-pos")? as usize > mid, "play advances")?;
    // Zoom with the wheel, then select the op under the pointer.
    let w0 = attr(&b, "data-window")?;
    b.js("var c = document.getElementById('timeline'); var r = c.getBoundingClientRect();\
          c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2, clientY: r.top + 40, bubbles: true, cancelable: true})); return true;")?;
    check(
        attr(&b, "data-window")? != w0,
        "the wheel zooms the timeline",
    )?;
    b.click("#fit")?;
    check(attr(&b, "data-window")? == w0, "fit shows the whole trace")?;
    b.js("var c = document.getElementById('timeline'); var r = c.getBoundingClientRect();\
          var o = {clientX: r.left + 120, clientY: r.top + 18 + 16 + 2 * 20 + 10, bubbles: true};\
          c.dispatchEvent(new MouseEvent('mousedown', o)); c.dispatchEvent(new MouseEvent('mouseup', o)); return true;")?;
    let picked = b.js("return document.querySelector('#details .op').textContent;")?;
    check(
        picked.as_str().is_some_and(|w| w.starts_with("rank 2 ")),
        &format!("clicking rank 2's lane selects its op: {picked:?}"),
    )?;
    passed += 1;

    // 3. A corrupted file from the file picker: a clear error with the byte offset, app still works.
    b.keys("#file", &corrupt.display().to_string())?;
    b.wait_for(
        "the error",
        "return !!document.getElementById('error');",
        Duration::from_secs(10),
    )?;
    let err = b.js("return document.getElementById('error').textContent;")?;
    let err = err.as_str().unwrap_or("").to_string();
    check(
        err.contains("corrupt.trace") && err.contains("at byte"),
        &format!("error names the file and byte: {err}"),
    )?;
    check(
        num(&b, "data-events")? as usize == n,
        "the previous trace stays open",
    )?;
    let before = num(&b, "data-pos")?;
    b.click("#step-fwd")?;
    check(
        num(&b, "data-pos")? == before + 1.0,
        "the app keeps working after a bad file",
    )?;
    passed += 1;

    // 3b. A file cut short: opens with what it holds and a warning with the byte offset.
    b.keys("#file", &truncated.display().to_string())?;
    b.wait_for(
        "the truncation warning",
        "var w = document.getElementById('warning'); return !!w && w.textContent.indexOf('truncated.trace') >= 0;",
        Duration::from_secs(10),
    )?;
    ready(&b, 10)?;
    let warn = b.js("return document.getElementById('warning').textContent;")?;
    let warn = warn.as_str().unwrap_or("").to_string();
    check(
        warn.contains("truncated") && warn.contains("at byte"),
        &format!("the warning names the byte: {warn}"),
    )?;
    let shown = num(&b, "data-events")? as usize;
    check(
        shown > 0 && shown < n,
        &format!("a cut trace shows the {shown} events it holds (of {n})"),
    )?;
    passed += 1;

    // 4. A dropped file that is not a trace at all is refused; a dropped trace opens.
    b.js("var dt = new DataTransfer(); dt.items.add(new File(['hello, world'], 'notes.txt'));\
          document.getElementById('app').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true})); return true;")?;
    b.wait_for(
        "the bad-magic error",
        "var e = document.getElementById('error'); return !!e && e.textContent.indexOf('notes.txt') >= 0;",
        Duration::from_secs(10),
    )?;
    let err = b.js("return document.getElementById('error').textContent;")?;
    check(
        err.as_str()
            .is_some_and(|e| e.contains("not a symm trace") && e.contains("byte 0")),
        &format!("a text file is refused by name and byte: {err:?}"),
    )?;
    b.js_async(&format!(
        "var done = arguments[0]; fetch('examples/{RING4}').then(r => r.arrayBuffer()).then(buf => {{\
           var dt = new DataTransfer(); dt.items.add(new File([buf], 'dropped.trace'));\
           document.getElementById('app').dispatchEvent(new DragEvent('drop', {{dataTransfer: dt, bubbles: true, cancelable: true}}));\
           done(true); }});"
    ))?;
    ready(&b, 20)?;
    check(
        b.js("return !document.getElementById('error') && !document.getElementById('warning');")?
            == Json::Bool(true),
        "a dropped trace clears the error and the warning",
    )?;
    passed += 1;

    // 5. Export to Perfetto: valid JSON, a process per rank, a flow per Signal -> Wait pair.
    let (spans, _) = perfetto::spans_indexed(
        &Reader::new(&ring)
            .map_err(|e| e.to_string())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?,
    );
    let pairs = perfetto::pairs(&spans).len();
    b.click("#export")?;
    b.wait_for(
        "the export",
        "return !!document.getElementById('perfetto-link');",
        Duration::from_secs(10),
    )?;
    let v = b.js_async(
        "var done = arguments[0]; fetch(document.getElementById('perfetto-link').href).then(r => r.text()).then(t => {\
           var j; try { j = JSON.parse(t); } catch (e) { done('parse error: ' + e); return; }\
           var procs = new Set(), outs = {}, ins = {}, nout = 0, nin = 0, ints = true;\
           for (var e of j.traceEvents) {\
             if (e.ph === 'M' && e.name === 'process_name') procs.add(e.pid);\
             if (e.bind_id !== undefined) { if (!Number.isInteger(e.bind_id)) ints = false;\
               if (e.flow_out) { outs[e.bind_id] = 1; nout++; } if (e.flow_in) { ins[e.bind_id] = 1; nin++; } } }\
           var matched = Object.keys(outs).filter(k => ins[k]).length;\
           done(procs.size + ' ' + nout + ' ' + nin + ' ' + matched + ' ' + ints); });",
    )?;
    let got = v.as_str().unwrap_or("").to_string();
    let want = format!("4 {pairs} {pairs} {pairs} true");
    check(pairs > 0 && got == want, &format!("perfetto export: got {got:?}, want {want:?} (processes, flow_out, flow_in, matched, integer ids)"))?;
    passed += 1;

    // A look at other schedules mid-run (kept under target/ only).
    for ex in [
        "all_reduce-tree-w8.trace",
        "all_reduce-multicast-w8.trace",
        "all_to_all-pairwise-w8.trace",
        "moe_dispatch-w4.trace",
    ] {
        select(&b, "example", ex)?;
        b.wait_for(
            ex,
            &format!("return document.getElementById('app').getAttribute('data-state') === 'ready' && document.querySelector('#compare td').textContent === '{ex}';"),
            Duration::from_secs(20),
        )?;
        b.js("var s = document.getElementById('scrub'); s.value = '' + Math.floor(s.max * 0.4); s.dispatchEvent(new Event('input', {bubbles: true})); return true;")?;
        let png = b.screenshot(".row")?;
        std::fs::write(shots.join(format!("mid-{ex}.png")), png).map_err(|e| e.to_string())?;
    }

    // 6. The example menu, compare with the cost model, a hang with its wait-for chain.
    select(&b, "example", "all_reduce-ring-w8.trace")?;
    b.wait_for("the w8 example", "return document.querySelectorAll('#compare tr').length === 2 && document.getElementById('app').getAttribute('data-state') === 'ready' && document.querySelector('#compare td').textContent.indexOf('w8') >= 0;", Duration::from_secs(20))?;
    select(&b, "compare-example", "all_reduce-tree-w8.trace")?;
    b.wait_for(
        "compare",
        "return document.querySelectorAll('#compare tr').length === 3;",
        Duration::from_secs(20),
    )?;
    check(
        attr(&b, "data-compare")? == "true",
        "compare mode holds two traces",
    )?;
    check(
        painted(&b, "buffers-compare")?,
        "the compared trace's buffers are drawn",
    )?;
    std::fs::write(shots.join("compare-row.png"), b.screenshot(".row")?)
        .map_err(|e| e.to_string())?;
    shot("viz-compare.png", "#timeline")?;
    b.click("#close-compare")?;
    check(attr(&b, "data-compare")? == "false", "compare closes")?;
    select(&b, "example", "hang-all_reduce-ring-w4.trace")?;
    b.wait_for(
        "the hang report",
        "return !!document.getElementById('hang');",
        Duration::from_secs(20),
    )?;
    let hang = b.js("return document.getElementById('hang').textContent;")?;
    let hang = hang.as_str().unwrap_or("");
    check(
        hang.contains("expected") && hang.contains("found") && hang.contains("root: rank 2"),
        &format!("hang report names rank 2 as the root: {hang}"),
    )?;
    shot("viz-hang.png", "#hang")?;
    b.keys("body", "\u{E011}")?;
    b.click("#next-stall")?;
    check(num(&b, "data-pos")? > 0.0, "next stall jumps forward")?;
    // A deadlocked trace in the compare view (the labs' `lab view N` link) shows its hang
    // panel at once, without "swap", and both slots name their trace beside the file buttons.
    b.goto(&format!(
        "{base}?trace=examples/{RING4}&compare=examples/hang-all_reduce-ring-w4.trace"
    ))?;
    b.wait_for(
        "the compared trace's hang report",
        "return !!document.getElementById('hang-compare') && !document.getElementById('hang');",
        Duration::from_secs(20),
    )?;
    let hang = b.js("return document.getElementById('hang-compare').textContent;")?;
    let hang = hang.as_str().unwrap_or("");
    check(
        hang.contains("compared trace") && hang.contains("root: rank 2"),
        &format!("the compare view's hang report names rank 2 as the root: {hang}"),
    )?;
    let names = b.js(
        "return document.getElementById('file-name').textContent + '|' + document.getElementById('compare-name').textContent;",
    )?;
    let names = names.as_str().unwrap_or("");
    check(
        names.contains("all_reduce-ring-w4") && names.contains("hang-all_reduce-ring-w4"),
        &format!("the loaded traces are named beside their file buttons: {names}"),
    )?;
    passed += 1;

    // 6b. The topology draws the edges the trace's data signals name (tree schedules).
    for line in super::topology::check(&b, &base, &traces, &shots)? {
        eprintln!("{line}");
    }
    passed += 1;

    // 7. One million events open in under 2 s.
    b.goto(&format!("{base}?trace=traces/big.trace"))?;
    ready(&b, 120)?;
    let events = num(&b, "data-events")? as usize;
    let open_ms = num(&b, "data-ready-at")?;
    let load_ms = num(&b, "data-load-ms")?;
    let phases = attr(&b, "data-load-phases")?;
    check(events == big_events, "the large trace opens whole")?;
    check(painted(&b, "timeline")?, "the large trace is drawn")?;
    // Playback frames: the time to redraw every view after a step, at full zoom and zoomed in.
    let mut frames = Vec::new();
    for _ in 0..5 {
        b.click("#step-back")?;
        frames.push(num(&b, "data-frame-ms")?);
    }
    b.js("var c = document.getElementById('timeline'); var r = c.getBoundingClientRect();\
          for (var i = 0; i < 12; i++) c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2, clientY: r.top + 40, bubbles: true, cancelable: true})); return true;")?;
    for _ in 0..5 {
        b.click("#step-back")?;
        frames.push(num(&b, "data-frame-ms")?);
    }
    let frame = frames.iter().cloned().fold(0.0, f64::max);
    let parts = attr(&b, "data-frame-parts")?;
    check(
        open_ms < 2000.0,
        &format!("a {events}-event trace must open in under 2 s, took {open_ms:.0} ms"),
    )?;
    passed += 1;

    Ok(format!(
        "viz: {passed} browser checks passed in headless Chromium; a {events}-event trace ({:.1} MB) opened in {open_ms:.0} ms from navigation (file to first frame {load_ms:.0} ms: {phases}); slowest playback frame {frame:.0} ms (last: {parts}); screenshots in {}",
        big.len() as f64 / 1e6,
        screenshots.unwrap_or(&shots).display()
    ))
}
