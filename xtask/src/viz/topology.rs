//! The browser check of the topology view's edges.
//!
//! For the library's binary tree broadcast (root 3) and double binary tree all-reduce, both
//! simulated at world 8, and for lab 5's double binary tree broadcast (the reference solution's
//! trace, world 8, root 0, written by the labs' checker), the edges the view drew (its canvas's `data-edges`, `from>to:t0` for a `Data`
//! signal, `t1` for `DataB`, `d` for data with no data signal) must be exactly the trace's data
//! signals, computed here from the decoded events; the all-reduce must show both trees; and
//! none of the edges of a heap ordered by rank (parent `(r - 1) / 2`, what the view once drew
//! for every tree) that the schedule never signals may be drawn.

use super::examples;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;
use symm_core::op::Op;
use symm_core::sched::{Algorithm, Collective};
use symm_core::signal::SlotKind;
use symm_core::trace::{self, EventKind};
use symm_viz_serve::webdriver::Browser;

/// An edge: (from, to, class tag).
type Edge = (u16, u16, &'static str);

/// The traces checked: (file name under the served traces, collective), tree algorithm, world 8.
const CASES: &[(&str, Collective)] = &[
    (
        "broadcast-tree-w8-root3.trace",
        Collective::Broadcast { root: 3 },
    ),
    ("all_reduce-tree-w8.trace", Collective::AllReduce),
];

/// Lab 5's double binary tree broadcast: its reference solution's trace, as `lab check 5
/// --solution` writes it.
const LAB5: &str = "lab05-double-binary-tree.trace";

/// Lab 5's reference trace, written by the labs' checker into a scratch folder under `traces`.
fn lab5_trace(traces: &Path) -> Result<Vec<u8>, String> {
    let out = traces.join("lab05-check");
    let out_s = out.display().to_string();
    crate::util::run(&mut crate::util::cargo_with(&format!(
        "run -q --release -p symm-labs -- check 5 --solution --out {out_s}"
    )))?;
    let bytes = std::fs::read(out.join("reference.trace"))
        .map_err(|e| format!("{}: {e}", out.join("reference.trace").display()))?;
    let _ = std::fs::remove_dir_all(&out);
    Ok(bytes)
}

const WORLD: u16 = 8;

/// Every `Data` / `DataB` signal of a trace as an edge from the signalling rank to its peer,
/// sorted, each once.
fn signal_edges(bytes: &[u8]) -> Result<Vec<Edge>, String> {
    let t = trace::decode(bytes).map_err(|e| e.to_string())?;
    let layout = t.header.request.layout();
    let mut set = BTreeSet::new();
    for e in &t.events {
        if let (EventKind::Begin, Op::Signal { peer, slot, .. }) = (e.kind, e.op) {
            let tag = match layout.key(slot).map(|k| k.kind) {
                Some(SlotKind::Data) => "t0",
                Some(SlotKind::DataB) => "t1",
                _ => continue,
            };
            set.insert((e.rank, peer, tag));
        }
    }
    Ok(set.into_iter().collect())
}

fn text(edges: &[Edge]) -> String {
    let parts: Vec<String> = edges
        .iter()
        .map(|(a, b, c)| format!("{a}>{b}:{c}"))
        .collect();
    parts.join(" ")
}

/// The tree-0 edges of a heap ordered by rank, in both directions.
fn heap_by_rank(world: u16) -> Vec<Edge> {
    (1..world)
        .flat_map(|r| [((r - 1) / 2, r, "t0"), (r, (r - 1) / 2, "t0")])
        .collect()
}

fn fail(what: String) -> String {
    format!("browser check failed: {what}")
}

/// Simulates the traces into `traces` (served as `traces/`), opens each in the app at `base`
/// and checks the edges drawn, with a screenshot of the view in `shots`. Returns a line per
/// trace.
pub fn check(b: &Browser, base: &str, traces: &Path, shots: &Path) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    let lab5 = (LAB5, Collective::Broadcast { root: 0 });
    for &(file, collective) in CASES.iter().chain([&lab5]) {
        let bytes = if file == LAB5 {
            lab5_trace(traces)?
        } else {
            let req = examples::request(collective, Algorithm::Tree, WORLD);
            examples::simulate_trace(&req, true)?
        };
        std::fs::write(traces.join(file), &bytes).map_err(|e| format!("{file}: {e}"))?;
        let want = signal_edges(&bytes)?;
        b.goto(&format!("{base}?trace=traces/{file}"))?;
        b.wait_for(
            &format!("the topology of {file}"),
            "var a = document.getElementById('app'), c = document.getElementById('topology');\
             return !!a && a.getAttribute('data-state') === 'ready' && c.hasAttribute('data-edges');",
            Duration::from_secs(30),
        )?;
        let png = b.screenshot(".row > .panel:nth-child(1)")?;
        std::fs::write(shots.join(format!("topology-{file}.png")), png)
            .map_err(|e| e.to_string())?;
        let got = b.js("return document.getElementById('topology').getAttribute('data-edges');")?;
        let got = got.as_str().unwrap_or("").to_string();
        let drawn: BTreeSet<&str> = got.split(' ').filter(|s| !s.is_empty()).collect();
        let wanted = text(&want);
        if got != wanted {
            let want_set: BTreeSet<&str> = wanted.split(' ').filter(|s| !s.is_empty()).collect();
            let missing: Vec<&str> = want_set.difference(&drawn).copied().collect();
            let extra: Vec<&str> = drawn.difference(&want_set).copied().collect();
            return Err(fail(format!(
                "{file}: the topology draws {got:?}, the trace's data signals are {wanted:?} \
                 (not drawn: {missing:?}; drawn but never signalled: {extra:?})"
            )));
        }
        let count = |tag: &str| want.iter().filter(|e| e.2 == tag).count();
        let (t0, t1) = (count("t0"), count("t1"));
        // The library's all-reduce and lab 5's broadcast run two trees; the library's
        // broadcast one.
        let both = collective == Collective::AllReduce || file == LAB5;
        if t0 == 0 || (both && t1 == 0) {
            return Err(fail(format!(
                "{file}: the topology draws {t0} tree-0 and {t1} tree-1 edges; a tree {} \
                 has {}: {got:?}",
                collective.name(),
                if both { "both trees" } else { "tree 0" }
            )));
        }
        let never: Vec<String> = heap_by_rank(WORLD)
            .into_iter()
            .filter(|e| !want.contains(e))
            .map(|e| text(&[e]))
            .collect();
        let shown: Vec<&String> = never
            .iter()
            .filter(|e| drawn.contains(e.as_str()))
            .collect();
        if !shown.is_empty() {
            return Err(fail(format!(
                "{file}: the topology draws heap-by-rank edges the schedule never signals: \
                 {shown:?}"
            )));
        }
        lines.push(format!(
            "viz: topology of {file}: the {} edges drawn are the trace's data signals \
             ({t0} tree 0, {t1} tree 1); {} heap-by-rank edges never signalled are not drawn{}",
            want.len(),
            never.len(),
            if never.is_empty() {
                String::new()
            } else {
                format!(" ({})", never.join(" "))
            }
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The broadcast from root 3 signals along the heap of positions `(r - 3) mod 8`: never
    /// along 2 -> 6, an edge of the heap by rank; the all-reduce signals along both trees.
    #[test]
    fn the_traces_have_what_the_check_looks_for() {
        let bc = examples::request(CASES[0].1, Algorithm::Tree, WORLD);
        let edges = signal_edges(&examples::simulate_trace(&bc, false).unwrap()).unwrap();
        assert!(!edges.contains(&(2, 6, "t0")), "{edges:?}");
        assert!(edges.contains(&(3, 4, "t0")), "{edges:?}");
        let ar = examples::request(CASES[1].1, Algorithm::Tree, WORLD);
        let edges = signal_edges(&examples::simulate_trace(&ar, false).unwrap()).unwrap();
        for tag in ["t0", "t1"] {
            assert!(edges.iter().any(|e| e.2 == tag), "{tag}: {edges:?}");
        }
    }
}
