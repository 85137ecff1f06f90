//! Checks `cargo xtask trace export --perfetto` end to end: the JSON it writes for the world-4
//! ring all-reduce parses, has one process per rank, a thread per channel, and one flow (a
//! `flow_out` and a `flow_in` with the same integer `bind_id`) for every Signal -> Wait pair.

use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use symm_core::perfetto;
use symm_core::trace::Reader;

/// Exports `trace` with the command-line path and checks the JSON; returns a summary.
pub fn check(trace: &Path, scratch: &Path) -> Result<String, String> {
    let out = scratch.join("export.json");
    let args: Vec<String> = [
        "export",
        "--perfetto",
        &trace.display().to_string(),
        "-o",
        &out.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    crate::trace::run(&args)?;
    let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let doc = serde_json::from_str::<Json>(&text)
        .map_err(|e| format!("the Perfetto export is not JSON: {e}"))?;
    let bytes = std::fs::read(trace).map_err(|e| e.to_string())?;
    let reader = Reader::new(&bytes).map_err(|e| e.to_string())?;
    let world = reader.header().world as usize;
    let channels = reader.header().channels as usize;
    let events: Vec<_> = reader
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let pairs = perfetto::pairs(&perfetto::spans(&events)).len();
    let evs = doc
        .get("traceEvents")
        .and_then(Json::as_array)
        .ok_or("no traceEvents array")?;
    let mut procs = BTreeSet::new();
    let mut threads = BTreeSet::new();
    let mut flows: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
    for e in evs {
        let ph = e.get("ph").and_then(Json::as_str).unwrap_or("");
        let name = e.get("name").and_then(Json::as_str).unwrap_or("");
        let pid = e
            .get("pid")
            .and_then(Json::as_f64)
            .ok_or("an event without pid")?;
        match (ph, name) {
            ("M", "process_name") => {
                procs.insert(pid as u64);
            }
            ("M", "thread_name") => {
                let tid = e
                    .get("tid")
                    .and_then(Json::as_f64)
                    .ok_or("thread_name without tid")?;
                threads.insert((pid as u64, tid as u64));
            }
            ("X", _) => {
                e.get("ts")
                    .and_then(Json::as_f64)
                    .ok_or("a slice without ts")?;
                e.get("dur")
                    .and_then(Json::as_f64)
                    .ok_or("a slice without dur")?;
                if let Some(id) = e.get("bind_id") {
                    let id = id
                        .as_f64()
                        .filter(|v| v.fract() == 0.0 && *v >= 0.0)
                        .ok_or("bind_id is not an integer")?;
                    let f = flows.entry(id as u64).or_default();
                    if e.get("flow_out") == Some(&Json::Bool(true)) {
                        f.0 += 1;
                    }
                    if e.get("flow_in") == Some(&Json::Bool(true)) {
                        f.1 += 1;
                    }
                }
            }
            _ => {}
        }
    }
    let complete = flows.values().filter(|f| **f == (1, 1)).count();
    if procs.len() != world || threads.len() != world * channels {
        return Err(format!(
            "perfetto export: {} processes and {} threads, want {world} and {}",
            procs.len(),
            threads.len(),
            world * channels
        ));
    }
    if pairs == 0 || complete != pairs || flows.len() != pairs {
        return Err(format!("perfetto export: {complete} complete flows of {} ids, want {pairs} Signal -> Wait pairs", flows.len()));
    }
    Ok(format!(
        "perfetto export: {world} processes, {pairs} signal -> wait flows"
    ))
}
