//! The example traces of the app, generated with the host simulator (chunk contents on), a hang
//! derived from one of them, and the large trace of the performance check.

use std::collections::HashMap;
use std::path::Path;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Op;
use symm_core::perfetto;
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::trace::{Event, EventKind, Reader, Writer};
use symm_driver::host::{random_inputs, simulate, SimOptions};

/// The examples: (collective, algorithm); each for world 4 and 8.
const SCHEDULES: &[(Collective, Algorithm)] = &[
    (Collective::AllReduce, Algorithm::Ring),
    (Collective::AllReduce, Algorithm::Tree),
    (Collective::AllReduce, Algorithm::Rhd),
    (Collective::AllReduce, Algorithm::OneShot),
    (Collective::AllReduce, Algorithm::TwoShot),
    (Collective::AllReduce, Algorithm::Multicast),
    (Collective::AllGather, Algorithm::Ring),
    (Collective::AllToAll, Algorithm::Pairwise),
];

/// The MoE dispatch example's file name.
pub const MOE: &str = "moe_dispatch-w4.trace";

/// The request behind an example.
pub fn request(c: Collective, a: Algorithm, world: u16) -> Request {
    let bytes = match c {
        Collective::AllReduce => 32 * 1024,
        _ => 8 * 1024,
    };
    Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum).with_pipeline(4096, 2)
}

/// Simulates a request with contents on and returns its trace.
pub fn simulate_trace(req: &Request, contents: bool) -> Result<Vec<u8>, String> {
    let inputs = random_inputs(req, 7);
    let opts = SimOptions {
        contents,
        ..SimOptions::default()
    };
    let run = simulate(req, &inputs, &opts).map_err(|e| format!("{req:?}: {e:?}"))?;
    Ok(run.trace)
}

/// Writes every example into `dir`; returns the file names.
pub fn write_all(dir: &Path) -> Result<Vec<String>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names = Vec::new();
    let mut ring4 = None;
    for world in [4u16, 8] {
        for &(c, a) in SCHEDULES {
            let req = request(c, a, world);
            let name = format!("{}-{}-w{world}.trace", c.name(), a.name());
            // A schedule bug must not take the other examples down with it.
            let trace = match std::panic::catch_unwind(|| simulate_trace(&req, true)) {
                Ok(t) => t?,
                Err(_) => {
                    eprintln!("viz: warning: simulating {name} panicked; the example is left out");
                    continue;
                }
            };
            std::fs::write(dir.join(&name), &trace).map_err(|e| format!("{name}: {e}"))?;
            if world == 4 && c == Collective::AllReduce && a == Algorithm::Ring {
                ring4 = Some(trace);
            }
            names.push(name);
        }
    }
    let ring4 = ring4.ok_or("no ring example")?;
    let hang = kill_rank(&ring4, 2, 0.3)?;
    let name = "hang-all_reduce-ring-w4.trace".to_string();
    std::fs::write(dir.join(&name), hang).map_err(|e| format!("{name}: {e}"))?;
    names.push(name);
    // The demo's MoE dispatch: each token once per destination rank, then the fan-out.
    let (_, moe, ok) = crate::demo::moe_dispatch_run()?;
    if !ok {
        return Err("the MoE dispatch example does not match its layout".into());
    }
    let name = MOE.to_string();
    std::fs::write(dir.join(&name), &moe.trace).map_err(|e| format!("{name}: {e}"))?;
    names.push(name);
    Ok(names)
}

/// A trace of at least `min_events` events (contents off): a pipelined ring all-reduce on 8
/// ranks and 4 channels with small chunks. A small run calibrates events per byte, so the large
/// one is simulated once.
pub fn big(min_events: usize) -> Result<Vec<u8>, String> {
    let req = |bytes: u64| {
        Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            8,
            bytes,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_channels(4)
        .with_pipeline(1024, 4)
    };
    let count = |t: &[u8]| -> Result<usize, String> {
        Ok(Reader::new(t).map_err(|e| e.to_string())?.count())
    };
    let probe: u64 = 1024 * 1024;
    let n = count(&simulate_trace(&req(probe), false)?)?.max(1);
    let mut bytes =
        (probe as f64 * min_events as f64 / n as f64 * 1.01) as u64 / 4096 * 4096 + 4096;
    loop {
        let trace = simulate_trace(&req(bytes), false)?;
        if count(&trace)? >= min_events {
            return Ok(trace);
        }
        bytes += bytes / 16;
    }
}

/// Rewrites a complete trace as if `rank` had died at `frac` of the run: its later ops vanish,
/// every wait whose releasing signal never came stalls (a `Stall` event with what it expected and
/// found), and every stream blocked that way records nothing after its stalled wait.
pub fn kill_rank(bytes: &[u8], rank: u16, frac: f64) -> Result<Vec<u8>, String> {
    let r = Reader::new(bytes).map_err(|e| e.to_string())?;
    let header = r.header().clone();
    let events: Vec<Event> = r.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
    let (spans, _) = perfetto::spans_indexed(&events);
    let pairs = perfetto::pairs(&spans);
    let released_by: HashMap<usize, usize> = pairs.iter().map(|p| (p.wait, p.signal)).collect();
    let t_end = events.iter().map(|e| e.time).max().unwrap_or(0);
    let t_kill = (t_end as f64 * frac) as u64;
    // Lane -> first dead op index.
    let mut dead: HashMap<(u16, u16), u32> = HashMap::new();
    for s in spans
        .iter()
        .filter(|s| s.rank == rank && s.end.unwrap_or(u64::MAX) > t_kill)
    {
        let e = dead.entry((s.rank, s.channel)).or_insert(u32::MAX);
        *e = (*e).min(s.index);
    }
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].end.unwrap_or(u64::MAX), spans[i].index));
    let mut kept = vec![false; spans.len()];
    let mut stalled: Vec<usize> = Vec::new();
    for i in order {
        let s = &spans[i];
        let lane = (s.rank, s.channel);
        if dead.get(&lane).is_some_and(|d| s.index >= *d) {
            continue;
        }
        if matches!(s.op, Op::Wait { .. }) {
            if let Some(&sig) = released_by.get(&i) {
                if !kept[sig] {
                    stalled.push(i);
                    dead.insert(lane, s.index);
                    continue;
                }
            }
        }
        kept[i] = true;
    }
    // Signals that did arrive, per (rank, slot).
    let mut arrived: HashMap<(u16, u32), u64> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        if let (
            true,
            Op::Signal {
                peer, slot, value, ..
            },
        ) = (kept[i], s.op)
        {
            *arrived.entry((peer, slot)).or_default() += value;
        }
    }
    let mut target: HashMap<(u16, u32), u64> = HashMap::new();
    let mut waits: Vec<usize> = (0..spans.len())
        .filter(|i| matches!(spans[*i].op, Op::Wait { .. }))
        .collect();
    waits.sort_by_key(|&i| (spans[i].rank, spans[i].index));
    let mut stall_of: HashMap<usize, (u64, u64)> = HashMap::new();
    for i in waits {
        if let Op::Wait { slot, count } = spans[i].op {
            let t = target.entry((spans[i].rank, slot)).or_default();
            *t += count;
            if stalled.contains(&i) {
                let found = arrived.get(&(spans[i].rank, slot)).copied().unwrap_or(0);
                stall_of.insert(i, (*t, found));
            }
        }
    }
    let deadline = t_end + t_end / 4 + 1;
    let mut w = Writer::new(Vec::new(), &header).map_err(|e| e.to_string())?;
    let mut out: Vec<Event> = Vec::new();
    let mut span_of: HashMap<(u16, u16, u32), usize> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        span_of.insert((s.rank, s.channel, s.index), i);
    }
    for e in &events {
        let Some(&i) = span_of.get(&(e.rank, e.channel, e.index)) else {
            continue;
        };
        if kept[i] || (stall_of.contains_key(&i) && e.kind == EventKind::Begin) {
            out.push(*e);
        }
        if let (Some(&(target, found)), EventKind::Begin) = (stall_of.get(&i), e.kind) {
            out.push(Event {
                time: deadline,
                kind: EventKind::Stall { target, found },
                contents: None,
                ..*e
            });
        }
    }
    out.sort_by_key(|e| e.time);
    for e in &out {
        w.event(e).map_err(|e| e.to_string())?;
    }
    w.finish().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn killing_a_rank_stalls_its_peers() {
        let req = request(Collective::AllReduce, Algorithm::Ring, 4);
        let full = simulate_trace(&req, true).unwrap();
        let hung = kill_rank(&full, 2, 0.3).unwrap();
        let r = Reader::new(&hung).unwrap();
        let evs: Vec<Event> = r.map(|e| e.unwrap()).collect();
        let stalls: Vec<&Event> = evs
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Stall { .. }))
            .collect();
        assert!(!stalls.is_empty());
        assert!(stalls.iter().all(|e| e.rank != 2));
    }
}
