//! The bench's outputs: nccl-tests columns on stdout, `bench-wN.json`, SVG plots ([`plot`]) of
//! time and bus bandwidth against size (one line per system and mode) and of symm's time over the
//! best peer's, and `bench-wN.md` (the tables docs/perf.md shows).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::plot::{self, Axis};
use super::{Kind, Sample, REPORTED};

fn algbw(s: &Sample) -> f64 {
    s.size as f64 / s.us / 1e3
}

fn busbw(s: &Sample, world: u16) -> f64 {
    algbw(s) * s.kind.bus_factor(world)
}

pub(super) fn human(size: u64) -> String {
    match size {
        s if s >= 1 << 30 => format!("{}G", s >> 30),
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s if s >= 1 << 10 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// The (system, mode) series present, in a stable order (symm first).
pub(super) fn series(samples: &[Sample]) -> Vec<(String, String)> {
    let set: BTreeSet<(u8, String, String)> = samples
        .iter()
        .map(|s| {
            let rank = match s.system.as_str() {
                "symm" => 0,
                "nccl" => 1,
                _ => 2,
            };
            (rank, s.system.clone(), s.mode.clone())
        })
        .collect();
    set.into_iter().map(|(_, a, b)| (a, b)).collect()
}

/// Prints, writes the JSON record, the plots and the markdown tables.
pub(super) fn write(world: u16, samples: &[Sample], out: &Path) -> Result<(), String> {
    print_tables(world, samples);
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let json = out.join(format!("bench-w{world}.json"));
    std::fs::write(&json, to_json(world, samples)).map_err(|e| io(&json, e))?;
    for kind in REPORTED {
        let these: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        if these.is_empty() {
            continue;
        }
        for (what, axis, lines) in [
            ("time", Axis::Time, plot::lines(&these, world, |s, _| s.us)),
            ("busbw", Axis::Busbw, plot::lines(&these, world, busbw)),
            ("ratio", Axis::Ratio, plot::ratios(&these)),
        ] {
            if lines.is_empty() {
                continue;
            }
            let p = out.join(format!("w{world}-{}-{what}.svg", kind.name()));
            let svg = plot::svg(world, kind, axis, &lines);
            std::fs::write(&p, svg).map_err(|e| io(&p, e))?;
        }
    }
    let md = out.join(format!("bench-w{world}.md"));
    std::fs::write(&md, markdown(world, samples)).map_err(|e| io(&md, e))?;
    println!(
        "bench: wrote {}, {} and the plots to {}",
        json.display(),
        md.display(),
        out.display()
    );
    Ok(())
}

fn print_tables(world: u16, samples: &[Sample]) {
    for kind in REPORTED {
        for (system, mode) in series(samples) {
            let rows: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.kind == kind && s.system == system && s.mode == mode)
                .collect();
            if rows.is_empty() {
                continue;
            }
            println!(
                "\n# {} | {system} {mode} | world {world} | bf16 sum, out of place",
                kind.name()
            );
            println!(
                "# {:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7}  what",
                "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
            );
            for s in rows {
                let root = if kind == Kind::Broadcast { "0" } else { "-1" };
                let wrong = if s.wrong == u64::MAX {
                    "n/c".to_string()
                } else {
                    s.wrong.to_string()
                };
                println!(
                    "  {:>12} {:>12} {:>6} {:>6} {:>5} {:>10.2} {:>8.2} {:>8.2} {:>7}  {}",
                    s.size,
                    s.size / 2,
                    "bf16",
                    "sum",
                    root,
                    s.us,
                    algbw(s),
                    busbw(s, world),
                    wrong,
                    s.label
                );
            }
        }
    }
}

fn to_json(world: u16, samples: &[Sample]) -> String {
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let rows: Vec<serde_json::Value> = samples
        .iter()
        .map(|s| {
            serde_json::json!({
                "collective": s.kind.name(),
                "size": s.size,
                "system": s.system,
                "mode": s.mode,
                "us": round(s.us),
                "algbw": round(algbw(s)),
                "busbw": round(busbw(s, world)),
                "wrong": (s.wrong != u64::MAX).then_some(s.wrong),
                "what": s.label,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "world": world,
        "dtype": "bf16",
        "redop": "sum",
        "samples": rows,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// Per collective: time (us) per size for every series, and symm's ratio to the best peer in
/// the same mode (below 1: symm is faster).
fn markdown(world: u16, samples: &[Sample]) -> String {
    let mut m = String::new();
    let all = series(samples);
    for kind in REPORTED {
        let these: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        if these.is_empty() {
            continue;
        }
        let cols: Vec<&(String, String)> = all
            .iter()
            .filter(|(sys, mode)| these.iter().any(|s| &s.system == sys && &s.mode == mode))
            .collect();
        let _ = writeln!(
            m,
            "\n### {} (world {world}, time per op in us, busbw GB/s)\n",
            kind.name()
        );
        let head: Vec<String> = cols.iter().map(|(s, md)| format!("{s} {md}")).collect();
        // Copy engines beside the kernel path, when the run measured them.
        let ce = these.iter().any(|s| s.system == "symm-ce");
        let _ = writeln!(
            m,
            "| size | {} | symm / best peer, eager | symm / best peer, graph |{}",
            head.join(" | "),
            if ce {
                " copy engines / kernel, eager | copy engines / kernel, graph |"
            } else {
                ""
            }
        );
        let _ = writeln!(
            m,
            "|---|{}---|---|{}",
            "---|".repeat(cols.len()),
            if ce { "---|---|" } else { "" }
        );
        let sizes: BTreeSet<u64> = these.iter().map(|s| s.size).collect();
        for size in sizes {
            let get = |sys: &str, mode: &str| {
                these
                    .iter()
                    .find(|s| s.size == size && s.system == sys && s.mode == mode)
                    .copied()
            };
            let cells: Vec<String> = cols
                .iter()
                .map(|(sys, mode)| {
                    get(sys, mode).map_or("-".into(), |s| {
                        format!("{:.2} ({:.0})", s.us, busbw(s, world))
                    })
                })
                .collect();
            let ratio = |mode: &str| {
                let symm = get("symm", mode)?;
                let peer = these
                    .iter()
                    .filter(|s| s.size == size && !s.system.starts_with("symm") && s.mode == mode)
                    .map(|s| s.us)
                    .fold(f64::MAX, f64::min);
                (peer < f64::MAX).then(|| format!("{:.2}", symm.us / peer))
            };
            let ce_ratio = |mode: &str| {
                let k = get("symm", mode)?;
                let c = get("symm-ce", mode)?;
                Some(format!("{:.2}", c.us / k.us))
            };
            let extra = if ce {
                format!(
                    " {} | {} |",
                    ce_ratio("eager").unwrap_or("-".into()),
                    ce_ratio("graph").unwrap_or("-".into())
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} |{extra}",
                human(size),
                cells.join(" | "),
                ratio("eager").unwrap_or("-".into()),
                ratio("graph").unwrap_or("-".into())
            );
        }
    }
    m
}

/// symm-core's calibration table from the best symm eager samples (label `algorithm/Nch`),
/// with the simulator's fitted link in its header when there is one; `None` when no sample
/// gives an entry (a table is never emptied).
pub(super) fn calibration(
    world: u16,
    topology: symm_core::cost::Topology,
    samples: &[Sample],
    fit: Option<&symm_driver::host::LinkFit>,
) -> Option<String> {
    let mut rows = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.system == "symm" && s.mode == "eager")
    {
        let Some((a, ch)) = super::fit::parse_label(&s.label) else {
            continue;
        };
        let Some(req) = super::rank::request(s.kind, s.size, world, a, ch) else {
            continue;
        };
        // Only requests symm would run, with a real time (the samples may come from a file).
        if req.bytes == 0 || req.validate().is_err() || !(s.us.is_finite() && s.us > 0.0) {
            continue;
        }
        rows.push((
            req.collective.name(),
            world,
            req.bytes,
            format!("{a:?}"),
            ch,
            s.us,
        ));
    }
    if rows.is_empty() {
        return None;
    }
    rows.sort_by(|x, y| (x.0, x.1, x.2).cmp(&(y.0, y.1, y.2)));
    let mut t = String::from(
        "//! GENERATED by `cargo xtask hw bench --calibrate` (measured on GPUs). Do not edit by hand.\n\
         //! Each entry: the fastest (algorithm, channels) symm measured for a collective at a world size\n\
         //! and a request size (`Request::bytes`), eager, one process per rank.\n",
    );
    if let Some(f) = fit {
        let l = &f.link;
        let _ = writeln!(
            t,
            "//! The simulator's link fitted to the run's {} samples of 1 MiB and more: launch {:.2} us,\n\
             //! alpha {:.3} us, beta {:.0} B/us; worst simulated / measured {:.2}x.",
            f.rows.len(),
            l.launch_us,
            l.alpha_us,
            l.beta_bytes_per_us,
            f.worst
        );
    }
    t.push_str(
        "\nuse crate::cost::Calibrated;\n#[allow(unused_imports)]\nuse crate::cost::Topology::*;\n#[allow(unused_imports)]\nuse crate::sched::Algorithm::*;\n\n",
    );
    let _ = writeln!(
        t,
        "/// Where the table was measured.\npub const SOURCE: &str = \"world {world}, {}, bf16 sum, one process per rank, {} entries\";\n",
        topology.name(),
        rows.len()
    );
    t.push_str("/// The entries, sorted by (collective, world, bytes).\n#[rustfmt::skip]\npub const TABLE: &[Calibrated] = &[\n");
    for (c, w, bytes, a, ch, us) in rows {
        let _ = writeln!(
            t,
            "    Calibrated {{ topology: {topology:?}, collective: \"{c}\", world: {w}, bytes: {bytes}, algorithm: {a}, channels: {ch}, us: {us:.2} }},"
        );
    }
    t.push_str("];\n");
    Some(t)
}

/// Writes `table` (from [`calibration`]) as `dir/<topology>_w<world>.rs` and rewrites the index
/// `dir.rs` beside it to list every table in `dir`, sorted by name; returns the table's path.
pub(super) fn write_calibration(
    dir: &Path,
    world: u16,
    topology: symm_core::cost::Topology,
    table: &str,
) -> Result<PathBuf, String> {
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let path = dir.join(format!("{}_w{world}.rs", topology.name()));
    std::fs::write(&path, table).map_err(|e| err(&path, e))?;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| err(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_str()?.strip_suffix(".rs")?.to_string();
            is_table_name(&n).then_some(n)
        })
        .collect();
    names.sort();
    let index = dir.with_extension("rs");
    std::fs::write(&index, calibration_index(&names)).map_err(|e| err(&index, e))?;
    Ok(path)
}

/// Whether `n` names a calibration table: `<topology>_w<world>`, the names
/// [`write_calibration`] gives (anything else in the directory is left out of the index).
fn is_table_name(n: &str) -> bool {
    use symm_core::cost::Topology;
    [Topology::Nvlink, Topology::SharedDevice].iter().any(|t| {
        n.strip_prefix(t.name())
            .and_then(|r| r.strip_prefix("_w"))
            .is_some_and(|w| !w.starts_with('0') && w.parse::<u16>().is_ok())
    })
}

/// The index module of the calibration tables `names` (one file each).
pub(super) fn calibration_index(names: &[String]) -> String {
    let mut t = String::from(
        "//! GENERATED by `cargo xtask hw bench --calibrate` (the index of its tables). Do not edit by\n\
         //! hand. One table per (topology, world) that was measured, each in its own file: a run on\n\
         //! other GPUs adds or replaces its own table and leaves the others.\n\n\
         use super::Calibrated;\n\n",
    );
    for n in names {
        let _ = writeln!(t, "mod {n};");
    }
    t.push_str("\n/// Every table: where it was measured, and its entries.\n#[rustfmt::skip]\npub const TABLES: &[(&str, &[Calibrated])] = &[\n");
    for n in names {
        let _ = writeln!(t, "    ({n}::SOURCE, {n}::TABLE),");
    }
    t.push_str("];\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_tables_go_one_file_per_topology_and_world_with_an_index() {
        let dir = std::env::temp_dir().join(format!("symm-cal-{}", std::process::id()));
        let tables = dir.join("calibration");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&tables).unwrap();
        std::fs::write(tables.join("nvlink_w2.rs"), "old").unwrap();
        std::fs::write(tables.join("README.md"), "not a table").unwrap();
        for stray in [
            "mod.rs",
            "nvlink_w.rs",
            "nvlink_w02.rs",
            "shared_device_w99999.rs",
            "x y.rs",
        ] {
            std::fs::write(tables.join(stray), "stray").unwrap();
        }
        use symm_core::cost::Topology::SharedDevice;
        let p = write_calibration(&tables, 4, SharedDevice, "new").unwrap();
        assert_eq!(p, tables.join("shared_device_w4.rs"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(
            std::fs::read_to_string(tables.join("nvlink_w2.rs")).unwrap(),
            "old"
        );
        let index = std::fs::read_to_string(dir.join("calibration.rs")).unwrap();
        assert!(
            index.contains("mod nvlink_w2;\nmod shared_device_w4;\n"),
            "{index}"
        );
        assert!(index.contains("    (shared_device_w4::SOURCE, shared_device_w4::TABLE),\n"));
        assert!(!index.contains("README"));
        assert_eq!(index.matches("\nmod ").count(), 2, "{index}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn samples() -> Vec<Sample> {
        let mut v = Vec::new();
        for (i, size) in [1u64 << 10, 1 << 20, 1 << 28].into_iter().enumerate() {
            let t = 10.0 * (i as f64 + 1.0);
            v.push(Sample::new(
                Kind::AllReduce,
                size,
                "symm",
                "eager",
                t,
                0,
                "two_shot/1ch",
            ));
            v.push(Sample::new(
                Kind::AllReduce,
                size,
                "nccl",
                "eager",
                2.0 * t,
                u64::MAX,
                "nccl",
            ));
        }
        v
    }

    #[test]
    fn outputs_carry_the_measurements() {
        let s = samples();
        let md = markdown(2, &s);
        assert!(
            md.contains("| 1K | 10.00 (0) | 20.00 (0) | 0.50 | - |"),
            "{md}"
        );
        let j: serde_json::Value = serde_json::from_str(&to_json(2, &s)).expect("valid JSON");
        assert_eq!(j["world"], 2);
        let last = &j["samples"][4];
        assert_eq!(
            (&last["size"], &last["system"]),
            (&268435456.into(), &"symm".into())
        );
        assert_eq!(last["us"], 30.0);
        assert!(j["samples"][1]["wrong"].is_null());
        assert_eq!(j["samples"][0]["wrong"], 0);
        let refs: Vec<&Sample> = s.iter().collect();
        let svg = plot::svg(
            2,
            Kind::AllReduce,
            Axis::Time,
            &plot::lines(&refs, 2, |s, _| s.us),
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("symm eager") && svg.contains("nccl eager"));
        let line = s[0].line();
        assert_eq!(Sample::parse(&line), Some(s[0].clone()));
        // Lines from a rank's file or the PyTorch script's output are checked field by field.
        for bad in [
            "",
            "all_reduce\t1024",
            "frobnicate\t1024\tsymm\teager\t1.0\t0\tx",
            "all_reduce\t-1\tsymm\teager\t1.0\t0\tx",
            "all_reduce\t1024\tsymm\teager\tNaNx\t0\tx",
            "all_reduce\t1024\tsymm\teager\t1.0\t0\tx\textra",
        ] {
            assert_eq!(Sample::parse(bad), None, "{bad:?}");
        }
    }
}
