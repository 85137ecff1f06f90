use super::*;
use crate::symbolic::Rng;
use alloc::string::ToString;
use alloc::vec;

/// How a random routing picks experts.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// Any expert, with some negative and some invalid indices.
    Uniform,
    /// Every entry of every token names the same expert.
    Skewed(i64),
}

fn routing(rng: &mut Rng, cfg: &MoeConfig, pick: Pick, tokens: &[u32]) -> Vec<Vec<i64>> {
    let experts = u64::from(cfg.experts);
    tokens
        .iter()
        .map(|&t| {
            (0..t as usize * cfg.topk as usize)
                .map(|_| match pick {
                    Pick::Skewed(e) => e,
                    Pick::Uniform => match rng.below(20) {
                        0 => -1,
                        1 => (experts + rng.below(3)) as i64,
                        _ => rng.below(experts) as i64,
                    },
                })
                .collect()
        })
        .collect()
}

/// A random shape: `world` ranks, `topk` per token, up to 6 tokens per rank, some ranks with
/// none, and `rows_max` cut below the room for every entry when `clip`.
fn shape(rng: &mut Rng, world: u16, topk: u16, clip: bool) -> (MoeConfig, Vec<u32>) {
    let per = u32::from(topk)
        .div_ceil(u32::from(world))
        .max(1 + rng.below(3) as u32);
    let tokens_max = 1 + rng.below(6) as u32;
    let mut cfg = MoeConfig::new(world, per * u32::from(world), topk, tokens_max, 3).unwrap();
    if clip {
        let rows = rng.below(u64::from(cfg.rows_max) / 2 + 1) as u32;
        cfg = cfg.with_rows_max(rows).unwrap();
    }
    let tokens = (0..world)
        .map(|_| match rng.below(4) {
            0 => 0,
            _ => rng.below(u64::from(tokens_max) + 1) as u32,
        })
        .collect();
    (cfg, tokens)
}

#[test]
fn random_routings_pass_at_worlds_1_to_8_and_topk_1_to_8() {
    let mut rng = Rng::new(7);
    let mut dropped = 0;
    let mut invalid = 0;
    for world in 1..=8u16 {
        for topk in 1..=8u16 {
            for round in 0..6 {
                let clip = round % 2 == 1;
                let (cfg, tokens) = shape(&mut rng, world, topk, clip);
                let pick = if round >= 4 {
                    Pick::Skewed(rng.below(u64::from(cfg.experts)) as i64)
                } else {
                    Pick::Uniform
                };
                let idx = routing(&mut rng, &cfg, pick, &tokens);
                let r =
                    check(&cfg, &idx).unwrap_or_else(|e| panic!("{cfg:?} {pick:?} {idx:?}: {e}"));
                let valid: u64 = idx
                    .iter()
                    .flatten()
                    .filter(|&&e| cfg.owner(e).is_some())
                    .count() as u64;
                assert_eq!(r.entries, valid);
                if !clip {
                    assert_eq!(r.dropped, 0, "{cfg:?}");
                }
                dropped += r.dropped;
                invalid += r.invalid;
            }
        }
    }
    // The grid really clipped and really met invalid indices.
    assert!(dropped > 0 && invalid > 0, "{dropped} {invalid}");
}

#[test]
fn no_tokens_anywhere_passes() {
    let cfg = MoeConfig::new(4, 8, 2, 3, 5).unwrap();
    let r = check(&cfg, &[vec![], vec![], vec![], vec![]]).unwrap();
    assert_eq!(r, MoeCheckReport::default());
}

#[test]
fn skewed_routing_counts_every_entry_and_drops_past_the_bound() {
    // Three ranks, every token names expert 4 (rank 1) twice: all 2 * 9 entries on one expert.
    let cfg = MoeConfig::new(3, 6, 2, 3, 1).unwrap();
    let idx = vec![vec![4; 6]; 3];
    let r = check(&cfg, &idx).unwrap();
    assert_eq!((r.staged, r.entries, r.dropped), (9, 18, 0));
    let r = check(&cfg.with_rows_max(5).unwrap(), &idx).unwrap();
    assert_eq!((r.staged, r.entries, r.dropped), (9, 18, 13));
}

#[test]
fn malformed_routings_are_config_errors() {
    let cfg = MoeConfig::new(2, 4, 2, 2, 1).unwrap();
    assert_eq!(
        check(&cfg, &[vec![0, 1]]),
        Err(MoeCheckError::Config(MoeError::BadLength {
            what: "ranks",
            len: 1,
            want: 2
        }))
    );
    assert_eq!(
        check(&cfg, &[vec![0, 1, 2, 3, 0, 1], vec![]]),
        Err(MoeCheckError::Config(MoeError::TooManyTokens {
            tokens: 3,
            bound: 2
        }))
    );
    assert!(matches!(
        check(&cfg, &[vec![0, 1, 2], vec![]]),
        Err(MoeCheckError::Config(MoeError::BadLength { .. }))
    ));
}

/// The module's layout with one function replaced.
struct Broken {
    stage: fn(&MoeConfig, u16, u32) -> u64,
    row: fn(&MoeConfig, &[u32], u16, u32, u32) -> Option<u32>,
    span: fn(&MoeConfig, &[u32], u32) -> (u32, u32),
}

impl Broken {
    fn spec() -> Broken {
        Broken {
            stage: MoeConfig::stage_row,
            row: expert_row,
            span: expert_span,
        }
    }
}

impl Layout for Broken {
    fn stage_row(&self, cfg: &MoeConfig, sender: u16, slot: u32) -> u64 {
        (self.stage)(cfg, sender, slot)
    }
    fn expert_row(
        &self,
        cfg: &MoeConfig,
        ecol: &[u32],
        sender: u16,
        j: u32,
        eslot: u32,
    ) -> Option<u32> {
        (self.row)(cfg, ecol, sender, j, eslot)
    }
    fn expert_span(&self, cfg: &MoeConfig, ecol: &[u32], j: u32) -> (u32, u32) {
        (self.span)(cfg, ecol, j)
    }
}

/// Two ranks, four experts; both ranks send a token to expert 2 (rank 1), rank 0 also to 0.
fn two_senders() -> (MoeConfig, Vec<Vec<i64>>) {
    let cfg = MoeConfig::new(2, 4, 2, 2, 1).unwrap();
    (cfg, vec![vec![2, 0, 1, -1], vec![2, 3]])
}

#[test]
fn the_spec_passes_through_the_layout_trait() {
    let (cfg, idx) = two_senders();
    assert_eq!(check_with(&Broken::spec(), &cfg, &idx), check(&cfg, &idx));
    assert!(check(&cfg, &idx).is_ok());
}

#[test]
fn mutant_forgetting_the_sender_prefix_collides() {
    let (cfg, idx) = two_senders();
    let layout = Broken {
        row: |cfg, ecol, _sender, j, eslot| expert_row(cfg, ecol, 0, j, eslot),
        ..Broken::spec()
    };
    let e = check_with(&layout, &cfg, &idx).unwrap_err();
    assert_eq!(
        e,
        MoeCheckError::ExpertCollision {
            dest: 1,
            row: 0,
            first: Entry {
                rank: 0,
                token: 0,
                k: 0
            },
            second: Entry {
                rank: 1,
                token: 0,
                k: 0
            },
        }
    );
    assert!(e.to_string().contains("expert row 0 of rank 1"), "{e}");
}

#[test]
fn mutant_staging_by_slot_alone_collides() {
    let (cfg, idx) = two_senders();
    let layout = Broken {
        stage: |_, _, slot| u64::from(slot),
        ..Broken::spec()
    };
    assert_eq!(
        check_with(&layout, &cfg, &idx),
        Err(MoeCheckError::StageCollision {
            dest: 1,
            row: 0,
            first: (0, 0),
            second: (1, 0)
        })
    );
}

#[test]
fn mutant_staging_past_the_half_is_out_of_range() {
    let (cfg, idx) = two_senders();
    let layout = Broken {
        stage: |cfg, sender, slot| cfg.stage_row(sender, slot) + u64::from(cfg.tokens_max),
        ..Broken::spec()
    };
    let e = check_with(&layout, &cfg, &idx);
    assert!(
        matches!(
            e,
            Err(MoeCheckError::StageOutOfRange {
                rank: 1,
                row: 4,
                rows: 4,
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn mutant_spans_that_overlap_or_miss_the_end_fail() {
    let (cfg, idx) = two_senders();
    let wide = Broken {
        span: |cfg, ecol, j| {
            let (s, n) = expert_span(cfg, ecol, j);
            (s, n + 1)
        },
        ..Broken::spec()
    };
    assert!(matches!(
        check_with(&wide, &cfg, &idx),
        Err(MoeCheckError::Spans { .. })
    ));
    // Spans that ignore rows_max: rank 0 gets 2 entries, keeps 1, and the spans end at 2.
    let cfg = cfg.with_rows_max(1).unwrap();
    let unclipped = Broken {
        span: |cfg, ecol, j| {
            let full = MoeConfig {
                rows_max: u32::MAX,
                ..*cfg
            };
            expert_span(&full, ecol, j)
        },
        ..Broken::spec()
    };
    let e = check_with(&unclipped, &cfg, &idx);
    assert!(
        matches!(
            e,
            Err(MoeCheckError::Spans {
                dest: 0,
                expert: 2,
                start: 2,
                want: 1
            })
        ),
        "{e:?}"
    );
}

#[test]
fn mutant_placing_experts_in_reverse_leaves_the_span() {
    // Rank 0 gets one entry of each of its experts; swapped, each lands in the other's span.
    let (cfg, idx) = two_senders();
    let layout = Broken {
        row: |cfg, ecol, sender, j, eslot| {
            expert_row(cfg, ecol, sender, cfg.local_experts() - 1 - j, eslot)
        },
        ..Broken::spec()
    };
    let e = check_with(&layout, &cfg, &idx);
    assert!(
        matches!(
            e,
            Err(MoeCheckError::OutsideSpan {
                dest: 0,
                row: 1,
                span: (0, 1),
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn mutant_dropping_a_kept_row_leaves_a_row_empty() {
    let (cfg, idx) = two_senders();
    let layout = Broken {
        row: |cfg, ecol, sender, j, eslot| {
            expert_row(cfg, ecol, sender, j, eslot).filter(|_| sender == 0)
        },
        ..Broken::spec()
    };
    assert_eq!(
        check_with(&layout, &cfg, &idx),
        Err(MoeCheckError::RowCount {
            dest: 1,
            placed: 1,
            covered: 3
        })
    );
}

#[test]
fn errors_name_the_rank_token_and_entry() {
    let e = MoeCheckError::Combine {
        entry: Entry {
            rank: 3,
            token: 5,
            k: 2,
        },
        found: 2,
        want: 1,
    };
    assert_eq!(
        e.to_string(),
        "rank 3 token 5 entry 2 summed 2 times in combine, expected 1"
    );
    let c = MoeCheckError::Config(MoeError::ZeroHidden);
    assert!(core::error::Error::source(&c).is_some());
}
