//! `cargo xtask trace export --perfetto FILE [-o OUT]`: converts a trace to Chrome trace JSON
//! for Perfetto with symm-core's exporter, the same code the browser viewer runs.

use crate::util;
use std::path::PathBuf;
use symm_core::perfetto;
use symm_core::trace::Reader;

const USAGE: &str = "usage: cargo xtask trace export --perfetto FILE [-o OUT]";

/// `cargo xtask trace ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("export") => export(&args[1..]),
        _ => Err(USAGE.into()),
    }
}

fn export(args: &[String]) -> Result<(), String> {
    let input = util::value(args, "--perfetto").ok_or(USAGE)?;
    let bytes = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let reader = Reader::new(&bytes).map_err(|e| format!("{input}: {e}"))?;
    let header = reader.header().clone();
    let events = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{input}: {e}"))?;
    let json = perfetto::to_json(&header, &events);
    let out = util::value(args, "-o")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("{input}.json")));
    std::fs::write(&out, &json).map_err(|e| format!("{}: {e}", out.display()))?;
    let flows = json.matches("\"flow_out\":true").count();
    println!(
        "trace: wrote {} ({} events, {} ranks, {flows} signal -> wait flows); open it in https://ui.perfetto.dev",
        out.display(),
        events.len(),
        header.world
    );
    Ok(())
}
