//! `cargo xtask trace export --perfetto FILE [-o OUT]`: converts a trace to Chrome trace JSON
//! for Perfetto with symm-core's exporter, the same code the browser viewer runs.
//!
//! A damaged trace is an error naming the byte offset (exit status 1). A trace cut short by a
//! crash is exported up to the cut, with the warning the viewer shows.

use crate::util;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use symm_core::perfetto;

/// Usage of `cargo xtask trace`.
pub const USAGE: &str = "usage: cargo xtask trace export --perfetto FILE [-o OUT]
  converts a symm trace (simulator or GPU) to Chrome trace JSON for https://ui.perfetto.dev
  --perfetto FILE   the trace to convert
  -o OUT            where to write the JSON (default FILE.json)";

/// `cargo xtask trace ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("export") => export(&args[1..]),
        Some("--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown trace command {other:?}\n{USAGE}")),
        None => Err(format!("missing a trace command\n{USAGE}")),
    }
}

fn export(args: &[String]) -> Result<(), String> {
    let flags: &util::Flags = &[("--perfetto", true), ("-o", true)];
    let Some(args) = util::command_args(args, flags, USAGE)? else {
        return Ok(());
    };
    let input = args
        .value("--perfetto")
        .ok_or_else(|| format!("--perfetto FILE is required\n{USAGE}"))?;
    let bytes = std::fs::read(input).map_err(|e| format!("{input}: {e}"))?;
    let folded = perfetto::fold(&bytes).map_err(|e| format!("cannot open {input}: {e}"))?;
    drop(bytes);
    if let Some(w) = folded.warning {
        eprintln!(
            "warning: {input}: {w}; exporting the {} events before it (unverified)",
            folded.events
        );
    }
    let out = args
        .value("-o")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("{input}.json")));
    let failed = |e: std::io::Error| format!("{}: {e}", out.display());
    let file = std::fs::File::create(&out).map_err(failed)?;
    let mut w = FmtIo {
        out: BufWriter::new(file),
        error: None,
    };
    if folded.write_json(&mut w).is_err() {
        let e = w
            .error
            .unwrap_or_else(|| std::io::Error::other("formatting failed"));
        return Err(failed(e));
    }
    w.out.flush().map_err(failed)?;
    println!(
        "trace: wrote {} ({} events, {} ranks, {} signal -> wait flows); open it in https://ui.perfetto.dev",
        out.display(),
        folded.events,
        folded.header.world,
        folded.pairs.len()
    );
    Ok(())
}

/// `fmt::Write` over an `io::Write`, keeping the I/O error.
struct FmtIo<W> {
    out: W,
    error: Option<std::io::Error>,
}

impl<W: Write> std::fmt::Write for FmtIo<W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.out.write_all(s.as_bytes()).map_err(|e| {
            self.error = Some(e);
            std::fmt::Error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::run;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::perfetto;
    use symm_core::sched::{Algorithm, Collective, Request};
    use symm_core::trace::{Header, Reader, Source, Writer};
    use symm_driver::host::{random_inputs, simulate, SimOptions};

    fn export(dir: &std::path::Path, name: &str, bytes: &[u8]) -> Result<String, String> {
        let input = dir.join(name);
        let out = dir.join(format!("{name}.json"));
        std::fs::write(&input, bytes).unwrap();
        let args: Vec<String> = ["export", "--perfetto", &input.display().to_string(), "-o"]
            .iter()
            .map(|s| s.to_string())
            .chain([out.display().to_string()])
            .collect();
        run(&args)?;
        Ok(std::fs::read_to_string(&out).unwrap())
    }

    /// The export of a world-4 ring all-reduce on two channels: one process per rank, a thread
    /// per channel, and one flow (a `flow_out` and a `flow_in` with the same integer `bind_id`)
    /// for every Signal -> Wait pair.
    #[test]
    fn export_has_a_process_per_rank_and_a_flow_per_signal_wait_pair() {
        use serde_json::Value as Json;
        use std::collections::{BTreeMap, BTreeSet};
        let dir = std::env::temp_dir().join(format!("symm-trace-flows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            4,
            32 << 10,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_channels(2);
        let trace = simulate(&req, &random_inputs(&req, 7), &SimOptions::default())
            .unwrap()
            .trace;
        let doc: Json = serde_json::from_str(&export(&dir, "ring.trace", &trace).unwrap()).unwrap();
        let events: Vec<_> = Reader::new(&trace).unwrap().map(Result::unwrap).collect();
        let pairs = perfetto::pairs(&perfetto::spans(&events)).len();
        let (mut procs, mut threads) = (BTreeSet::new(), BTreeSet::new());
        let mut flows: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let int = |v: Option<&Json>| v.and_then(Json::as_f64).filter(|v| v.fract() == 0.0);
        for e in doc["traceEvents"].as_array().unwrap() {
            let pid = int(e.get("pid")).expect("every event has a pid") as u64;
            match (e["ph"].as_str().unwrap(), e["name"].as_str().unwrap_or("")) {
                ("M", "process_name") => _ = procs.insert(pid),
                ("M", "thread_name") => {
                    _ = threads.insert((pid, int(e.get("tid")).unwrap() as u64))
                }
                ("X", _) if e.get("bind_id").is_some() => {
                    let id = int(e.get("bind_id")).expect("integer bind_id") as u64;
                    let f = flows.entry(id).or_default();
                    f.0 += u32::from(e.get("flow_out") == Some(&Json::Bool(true)));
                    f.1 += u32::from(e.get("flow_in") == Some(&Json::Bool(true)));
                }
                _ => {}
            }
        }
        assert_eq!((procs.len(), threads.len()), (4, 8));
        assert!(
            pairs > 0 && flows.len() == pairs,
            "{} flows, {pairs} pairs",
            flows.len()
        );
        assert!(flows.values().all(|f| *f == (1, 1)), "{flows:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn export_refuses_damaged_traces_and_exports_cut_ones() {
        let dir = std::env::temp_dir().join(format!("symm-trace-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            2,
            256,
            DType::F32,
            ReduceOp::Sum,
        );
        let good = simulate(&req, &random_inputs(&req, 1), &SimOptions::default())
            .unwrap()
            .trace;
        assert!(export(&dir, "good.trace", &good)
            .unwrap()
            .contains("\"traceEvents\""));
        // A header whose world is not the request's (65535 x 65535 rows if believed).
        let header = Header {
            world: u16::MAX,
            channels: u16::MAX,
            request: req,
            source: Source::Host { simulated: true },
            time_unit_ns: 1,
            team: None,
        };
        let crafted = Writer::new(Vec::new(), &header).unwrap().finish().unwrap();
        let e = export(&dir, "crafted.trace", &crafted).unwrap_err();
        assert!(
            e.contains("crafted.trace") && e.contains("header at byte 14 is invalid"),
            "{e}"
        );
        let mut damaged = good.clone();
        damaged[good.len() / 2] ^= 0x08;
        let e = export(&dir, "damaged.trace", &damaged).unwrap_err();
        assert!(e.contains("at byte"), "{e}");
        // Cut short by a crash: exported up to the cut.
        let json = export(&dir, "cut.trace", &good[..good.len() / 2]).unwrap();
        assert!(json.contains("\"ph\":\"X\""));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
