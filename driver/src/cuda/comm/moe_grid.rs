//! How many blocks each MoE kernel of a rank launches.
//!
//! The receiving blocks of dispatch and combine spin on flags their peers set, so every one of
//! them must be resident: at most one per SM (the kernels fit two blocks of their size on an
//! SM), and the GPU's share when ranks share it. More waiting blocks are not free: on four
//! H200s over NVLink, 128 tokens of 7168 bf16 (top-8) took 414 us with a block on every SM and
//! 170 us with 32 blocks, while 1024 tokens took 823 us on every SM and 1335 us on 32. So by
//! default a call waits with a block per four of its tokens, at least [`MIN_WAITING`], as its
//! sending side already does; a cap set with `MoeLayer::set_sms` replaces that rule.

use symm_core::moe::Mode;

/// The sending phase of the normal mode's dispatch (its own kernel).
pub(super) const SEND: u32 = 1;
/// The receiving phase (the low-latency mode runs both in one kernel).
pub(super) const RECV: u32 = 2;

/// Fewest waiting blocks the token rule gives: a rank with few or no tokens still receives
/// its peers' rows.
pub(super) const MIN_WAITING: u32 = 16;

/// The GPU a rank's MoE kernels run on.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gpu {
    /// SMs of the GPU (clamped to 1..=128).
    pub sms: u32,
    /// Whether ranks share it (each then takes its share of the SMs).
    pub shared: bool,
    /// Ranks of the job.
    pub world: u32,
}

/// `(phase, blocks)` per launch of a call of `tokens` tokens; `cap` is `MoeLayer::set_sms`'s
/// (0: the default rule), `stage_rows` the layer's staged rows.
pub(super) fn grids(
    mode: Mode,
    tokens: u32,
    stage_rows: u32,
    gpu: Gpu,
    cap: u32,
) -> Vec<(u32, u32)> {
    let sms = gpu.sms.clamp(1, 128);
    let resident = if gpu.shared {
        (sms / gpu.world.max(1)).clamp(1, 64)
    } else {
        sms
    };
    let (cap, waiting) = match cap {
        0 => (u32::MAX, resident.min(tokens.div_ceil(4).max(MIN_WAITING))),
        n => (n, resident.min(n)),
    };
    match mode {
        Mode::LowLatency => vec![(SEND | RECV, waiting)],
        _ => {
            let send = tokens
                .div_ceil(4)
                .clamp(1, if gpu.shared { 96 } else { 256 })
                .min(cap);
            vec![
                (SEND, send),
                (RECV, stage_rows.div_ceil(4).clamp(1, waiting)),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: Gpu = Gpu {
        sms: 132,
        shared: false,
        world: 4,
    };

    #[test]
    fn few_tokens_wait_on_few_blocks_and_many_on_every_sm() {
        // The measured points: 128 tokens on 32 blocks, 1024 on every SM (128 at most).
        assert_eq!(
            grids(Mode::LowLatency, 128, 4096, H200, 0),
            vec![(SEND | RECV, 32)]
        );
        assert_eq!(
            grids(Mode::LowLatency, 1024, 4096, H200, 0),
            vec![(SEND | RECV, 128)]
        );
        assert_eq!(
            grids(Mode::Normal, 128, 4096, H200, 0),
            vec![(SEND, 32), (RECV, 32)]
        );
        assert_eq!(
            grids(Mode::Normal, 1024, 4096, H200, 0),
            vec![(SEND, 256), (RECV, 128)]
        );
        // No tokens here: still enough blocks to take the peers' rows.
        assert_eq!(
            grids(Mode::LowLatency, 0, 4096, H200, 0),
            vec![(SEND | RECV, MIN_WAITING)]
        );
    }

    #[test]
    fn a_cap_replaces_the_rule_and_a_shared_gpu_is_split() {
        assert_eq!(
            grids(Mode::LowLatency, 128, 4096, H200, 100),
            vec![(SEND | RECV, 100)]
        );
        assert_eq!(
            grids(Mode::Normal, 1024, 4096, H200, 8),
            vec![(SEND, 8), (RECV, 8)]
        );
        let shared = Gpu {
            shared: true,
            ..H200
        };
        // 132 SMs clamp to 128, a quarter each.
        assert_eq!(
            grids(Mode::LowLatency, 4096, 4096, shared, 0),
            vec![(SEND | RECV, 32)]
        );
        assert_eq!(
            grids(Mode::Normal, 4096, 8, shared, 0),
            vec![(SEND, 96), (RECV, 2)]
        );
    }
}
