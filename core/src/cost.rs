//! The alpha-beta cost model and algorithm selection.
//!
//! A collective's time is modelled as `launch + steps * alpha + bytes_on_the_busiest_link / beta`
//! where `alpha` is the latency of one signalled hop (a put, a release/acquire handshake) and
//! `beta` the bandwidth one rank achieves into the fabric. On an NVSwitch machine every pair of
//! GPUs is one hop, so direct algorithms pay one alpha per round whatever the world size, and a
//! rank that reads from all peers at once is limited by its own link bandwidth.
//!
//! The model is deliberately simple: it ranks algorithms (one-shot for small buffers, two-shot and
//! multicast in the middle, ring for large) and predicts orders of magnitude; `cargo xtask hw`
//! measures the truth.

use crate::sched::{algorithms, Algorithm, Collective, Request};

/// Link and launch parameters of a machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Fixed cost of launching a collective, in microseconds.
    pub launch_us: f64,
    /// Latency of one signalled hop, in microseconds.
    pub alpha_us: f64,
    /// Bandwidth of one rank's link per direction, in bytes per microsecond.
    pub beta_bytes_per_us: f64,
    /// Multicast (switch reduction) bandwidth in bytes per microsecond; 0 when unavailable.
    pub multicast_bytes_per_us: f64,
}

impl Link {
    /// NVLink 4 through NVSwitch (H100/H200): about 370 GB/s achievable per direction, 0.6 us per
    /// hop and 4.5 us launch (NCCL's own model for Hopper), multicast near 480 GB/s.
    pub const NVLINK4: Link = Link {
        launch_us: 4.5,
        alpha_us: 0.6,
        beta_bytes_per_us: 370_000.0,
        multicast_bytes_per_us: 480_000.0,
    };

    /// Host threads over shared memory (what the simulator stamps traces with).
    pub const HOST: Link = Link {
        launch_us: 1.0,
        alpha_us: 0.2,
        beta_bytes_per_us: 10_000.0,
        multicast_bytes_per_us: 10_000.0,
    };
}

fn ceil(x: f64) -> f64 {
    let t = x as u64 as f64;
    if t < x {
        t + 1.0
    } else {
        t
    }
}

fn log2_ceil(n: u64) -> u64 {
    if n <= 1 {
        0
    } else {
        64 - (n - 1).leading_zeros() as u64
    }
}

/// Predicted time of a request in microseconds.
pub fn predict(req: &Request, link: &Link) -> f64 {
    let n = req.world.max(1) as f64;
    let w = req.world as u64;
    let b = req.bytes as f64;
    let a = link.alpha_us;
    let bw = link.beta_bytes_per_us;
    let mc = if link.multicast_bytes_per_us > 0.0 {
        link.multicast_bytes_per_us
    } else {
        bw
    };
    let frac = (n - 1.0) / n;
    let lg = log2_ceil(w) as f64;
    let chunk = (req.chunk_elems() * req.dtype.size()) as f64;
    let chunks = ceil(b / n / chunk).max(1.0);
    let body = match (req.collective, req.algorithm) {
        (Collective::AllReduce, Algorithm::Ring) => {
            2.0 * (n - 1.0) * a + 2.0 * frac * b / bw + (chunks - 1.0) * a
        }
        (Collective::AllReduce, Algorithm::Tree) => {
            2.0 * lg * a + b / bw + ceil(b / 2.0 / chunk) * a
        }
        (Collective::AllReduce, Algorithm::Rhd) => {
            let fold = if w.is_power_of_two() {
                0.0
            } else {
                2.0 * (a + b / bw)
            };
            2.0 * lg * a + 2.0 * frac * b / bw + fold
        }
        (Collective::AllReduce, Algorithm::OneShot) => 2.0 * a + (n - 1.0) * b / bw,
        (Collective::AllReduce, Algorithm::TwoShot) => 3.0 * a + 2.0 * frac * b / bw,
        (Collective::AllReduce, Algorithm::Multicast) => 2.0 * a + 2.0 * b / n / mc,
        (Collective::ReduceScatter | Collective::AllGather, Algorithm::Ring) => {
            (n - 1.0) * a + (n - 1.0) * b / bw
        }
        (Collective::ReduceScatter | Collective::AllGather, Algorithm::Multicast) => {
            2.0 * a + b / mc
        }
        (Collective::ReduceScatter | Collective::AllGather | Collective::AllToAll, _) => {
            2.0 * a + (n - 1.0) * b / bw
        }
        (Collective::Broadcast { .. }, Algorithm::Ring) => {
            (n - 1.0) * a + b / bw + (chunks - 1.0) * a
        }
        (Collective::Broadcast { .. } | Collective::Reduce { .. }, Algorithm::Tree) => {
            lg * a + b / bw * 2.0
        }
        (Collective::Broadcast { .. }, Algorithm::Multicast) => 2.0 * a + b / mc,
        (Collective::Broadcast { .. } | Collective::Reduce { .. }, _) => {
            2.0 * a + (n - 1.0) * b / bw
        }
        (Collective::Scatter { .. } | Collective::Gather { .. }, _) => 2.0 * a + (n - 1.0) * b / bw,
        (Collective::SendRecv { .. }, _) => a + b / bw,
        _ => 2.0 * (n - 1.0) * a + 2.0 * b / bw,
    };
    link.launch_us + body
}

/// Picks the algorithm with the lowest predicted time for a request (its `algorithm` field is
/// ignored). Multicast is considered only when `multicast` is true.
pub fn select(req: &Request, link: &Link, multicast: bool) -> Algorithm {
    let mut best = None::<(f64, Algorithm)>;
    for &alg in algorithms(req.collective) {
        if alg == Algorithm::Multicast && !multicast {
            continue;
        }
        let t = predict(
            &Request {
                algorithm: alg,
                ..*req
            },
            link,
        );
        if best.is_none_or(|(bt, _)| t < bt) {
            best = Some((t, alg));
        }
    }
    best.map(|(_, a)| a).unwrap_or(Algorithm::Direct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};

    #[test]
    fn selection_follows_the_size_regimes() {
        let req = |bytes| {
            Request::new(
                Collective::AllReduce,
                Algorithm::Ring,
                8,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
            )
        };
        let l = Link::NVLINK4;
        assert_eq!(select(&req(4096), &l, false), Algorithm::OneShot);
        assert_eq!(select(&req(256 << 20), &l, false), Algorithm::TwoShot);
        assert_eq!(select(&req(64 << 20), &l, true), Algorithm::Multicast);
        let t1 = predict(&req(1 << 30), &l);
        let t2 = predict(&req(2 << 30), &l);
        assert!(
            t2 > 1.9 * t1 && t2 < 2.1 * t1,
            "bandwidth term dominates: {t1} {t2}"
        );
    }
}
