use super::*;

/// Two ranks, four experts (two per rank), two per token, four tokens, hidden 1.
fn small() -> MoeConfig {
    MoeConfig::new(2, 4, 2, 4, 1).unwrap()
}

#[test]
fn new_fills_rows_max_and_checks_every_field() {
    let c = MoeConfig::new(4, 8, 2, 16, 64).unwrap();
    assert_eq!(c.rows_max, 4 * 16 * 2);
    assert_eq!(c.local_experts(), 2);
    assert_eq!(c.header_words(), 3);
    assert_eq!(c.stage_rows(), 64);
    assert_eq!(
        MoeConfig::new(0, 8, 2, 16, 64),
        Err(MoeError::BadWorld { world: 0 })
    );
    assert_eq!(
        MoeConfig::new(65, 65, 1, 1, 1),
        Err(MoeError::BadWorld { world: 65 })
    );
    assert_eq!(
        MoeConfig::new(3, 8, 2, 16, 64),
        Err(MoeError::ExpertsNotDivisible {
            experts: 8,
            world: 3
        })
    );
    assert_eq!(
        MoeConfig::new(2, 0, 1, 16, 64),
        Err(MoeError::ExpertsNotDivisible {
            experts: 0,
            world: 2
        })
    );
    for topk in [0, 9] {
        assert_eq!(
            MoeConfig::new(2, 8, topk, 16, 64),
            Err(MoeError::BadTopK { topk, experts: 8 })
        );
    }
    assert_eq!(
        MoeConfig::new(1, 64, 33, 1, 1),
        Err(MoeError::BadTopK {
            topk: 33,
            experts: 64
        })
    );
    assert!(MoeConfig::new(1, 64, MAX_TOPK, 1, 1).is_ok());
    assert_eq!(MoeConfig::new(2, 8, 2, 16, 0), Err(MoeError::ZeroHidden));
}

#[test]
fn buffers_past_the_limit_are_too_large() {
    // 2^20 staging rows of about 2^32 bytes each.
    let e = MoeConfig::new(1, 1, 1, 1 << 20, 1 << 30).unwrap_err();
    assert!(
        matches!(e, MoeError::TooLarge { bytes } if bytes > 1 << 48),
        "{e:?}"
    );
    // More expert rows than a u32 counts.
    let e = MoeConfig::new(64, 64, 32, u32::MAX / 8, 1).unwrap_err();
    assert!(matches!(e, MoeError::TooLarge { .. }), "{e:?}");
    // The expert rows alone: rows_max * hidden * 4 bytes.
    let c = MoeConfig::new(1, 1, 1, 1, 1 << 24).unwrap();
    assert_eq!(
        c.with_rows_max(1 << 23),
        Err(MoeError::TooLarge { bytes: 1 << 49 })
    );
    assert_eq!(c.with_rows_max(7).unwrap().rows_max, 7);
}

#[test]
fn owner_splits_experts_evenly_and_rejects_negative_and_invalid() {
    let c = MoeConfig::new(4, 12, 2, 1, 1).unwrap();
    assert_eq!(c.owner(0), Some((0, 0)));
    assert_eq!(c.owner(2), Some((0, 2)));
    assert_eq!(c.owner(3), Some((1, 0)));
    assert_eq!(c.owner(11), Some((3, 2)));
    assert_eq!(c.owner(12), None);
    assert_eq!(c.owner(-1), None);
    assert_eq!(c.owner(i64::MIN), None);
    assert_eq!(c.owner(i64::from(u32::MAX) + 1), None);
}

#[test]
fn dest_mask_sends_a_token_once_per_rank() {
    let c = small();
    // Experts 0 and 1 both live on rank 0: one destination.
    assert_eq!(dest_mask(&c, &[0, 1]), 0b01);
    assert_eq!(dest_mask(&c, &[3, 0]), 0b11);
    assert_eq!(dest_mask(&c, &[2, 2]), 0b10);
    assert_eq!(dest_mask(&c, &[-1, 4]), 0);
    let c64 = MoeConfig::new(64, 64, 2, 1, 1).unwrap();
    assert_eq!(dest_mask(&c64, &[63, 0]), 1 << 63 | 1);
}

#[test]
fn route_on_a_hand_worked_example() {
    let c = small();
    // t0: experts 0, 1 (both rank 0); t1: 3 (rank 1) and 0 (rank 0); t2: expert 2 twice;
    // t3: no expert and an invalid one.
    let idx = [0, 1, 3, 0, 2, 2, -1, 7];
    let (mut slots, mut eslots) = ([9u32; 8], [9u32; 8]);
    let (mut counts, mut ecounts) = ([9u32; 2], [9u32; 4]);
    let r = route(&c, &idx, &mut slots, &mut eslots, &mut counts, &mut ecounts).unwrap();
    assert_eq!(r, Routed { invalid: 1 });
    assert_eq!(slots, [0, NONE, 1, 0, NONE, 1, NONE, NONE]);
    assert_eq!(eslots, [0, 0, 0, 1, 0, 1, NONE, NONE]);
    assert_eq!(counts, [2, 2]);
    assert_eq!(ecounts, [2, 1, 2, 1]);
}

#[test]
fn route_skips_negative_indices_without_counting_them() {
    let c = small();
    let idx = [-1, -5, i64::MIN, 1];
    let (mut slots, mut eslots) = ([0u32; 4], [0u32; 4]);
    let (mut counts, mut ecounts) = ([0u32; 2], [0u32; 4]);
    let r = route(&c, &idx, &mut slots, &mut eslots, &mut counts, &mut ecounts).unwrap();
    assert_eq!(r.invalid, 0);
    assert_eq!(slots, [NONE, NONE, 0, NONE]);
    assert_eq!(eslots, [NONE, NONE, NONE, 0]);
    assert_eq!(counts, [1, 0]);
    assert_eq!(ecounts, [0, 1, 0, 0]);
}

#[test]
fn route_of_no_tokens_clears_the_counts() {
    let c = small();
    let (mut counts, mut ecounts) = ([5u32; 2], [5u32; 4]);
    let r = route(&c, &[], &mut [], &mut [], &mut counts, &mut ecounts).unwrap();
    assert_eq!(r.invalid, 0);
    assert_eq!(counts, [0, 0]);
    assert_eq!(ecounts, [0; 4]);
}

#[test]
fn route_checks_every_length() {
    let c = small();
    let idx = [0i64, 1, 2, 3];
    let mut s = [0u32; 4];
    let mut es = [0u32; 4];
    let mut n = [0u32; 2];
    let mut en = [0u32; 4];
    let e = route(&c, &idx[..3], &mut s, &mut es, &mut n, &mut en).unwrap_err();
    assert_eq!(
        e,
        MoeError::BadLength {
            what: "topk_idx",
            len: 3,
            want: 2
        }
    );
    let e = route(&c, &idx, &mut s[..3], &mut es, &mut n, &mut en).unwrap_err();
    assert!(matches!(e, MoeError::BadLength { what: "slots", .. }));
    let e = route(&c, &idx, &mut s, &mut es[..1], &mut n, &mut en).unwrap_err();
    assert!(matches!(e, MoeError::BadLength { what: "eslots", .. }));
    let e = route(&c, &idx, &mut s, &mut es, &mut n[..1], &mut en).unwrap_err();
    assert!(matches!(e, MoeError::BadLength { what: "counts", .. }));
    let e = route(&c, &idx, &mut s, &mut es, &mut n, &mut en[..3]).unwrap_err();
    assert!(matches!(
        e,
        MoeError::BadLength {
            what: "ecounts",
            ..
        }
    ));
}

#[test]
fn check_routing_names_the_first_invalid_index() {
    let c = small();
    assert_eq!(check_routing(&c, &[0, 1, -1, 3]), Ok(()));
    assert_eq!(check_routing(&c, &[]), Ok(()));
    assert_eq!(
        check_routing(&c, &[0, 1, 2, 4, 9, 9]),
        Err(MoeError::ExpertOutOfRange {
            token: 1,
            k: 1,
            expert: 4,
            experts: 4
        })
    );
    assert_eq!(
        check_routing(&c, &[0, 1, 2]),
        Err(MoeError::BadLength {
            what: "topk_idx",
            len: 3,
            want: 2
        })
    );
}

#[test]
fn check_tokens_uses_the_bound_of_the_mode() {
    let c = MoeConfig::new(1, 1, 1, 200, 1).unwrap();
    assert_eq!(c.check_tokens(200, Mode::Normal), Ok(()));
    assert_eq!(
        c.check_tokens(201, Mode::Normal),
        Err(MoeError::TooManyTokens {
            tokens: 201,
            bound: 200
        })
    );
    assert_eq!(
        c.check_tokens(129, Mode::LowLatency),
        Err(MoeError::TooManyTokens {
            tokens: 129,
            bound: LL_MAX_TOKENS
        })
    );
}

#[test]
fn row_sizes_round_each_part_to_16_bytes() {
    let c = MoeConfig::new(2, 4, 3, 5, 9).unwrap();
    assert_eq!(c.data_bytes(2), 32);
    assert_eq!(c.data_bytes(4), 48);
    assert_eq!(c.row_bytes(2), 32 + 48);
    assert_eq!(c.partial_bytes(), 48);
    assert_eq!(c.stage_row(0, 0), 0);
    assert_eq!(c.stage_row(1, 2), 7);
}

#[test]
fn expert_rows_are_prefix_sums_expert_then_sender_then_slot() {
    let c = MoeConfig::new(2, 4, 2, 4, 1).unwrap();
    // ec[p][j] for this receiver: sender 0 has 2, 1; sender 1 has 3, 0.
    let ecol = [2, 1, 3, 0];
    assert_eq!(expert_row(&c, &ecol, 0, 0, 0), Some(0));
    assert_eq!(expert_row(&c, &ecol, 0, 0, 1), Some(1));
    assert_eq!(expert_row(&c, &ecol, 1, 0, 0), Some(2));
    assert_eq!(expert_row(&c, &ecol, 1, 0, 2), Some(4));
    assert_eq!(expert_row(&c, &ecol, 0, 1, 0), Some(5));
    assert_eq!(expert_span(&c, &ecol, 0), (0, 5));
    assert_eq!(expert_span(&c, &ecol, 1), (5, 1));
    // No entries at all.
    assert_eq!(expert_span(&c, &[0; 4], 1), (0, 0));
}

#[test]
fn rows_past_rows_max_are_dropped_and_spans_clip() {
    let ecol = [2, 1, 3, 0];
    let c = MoeConfig::new(2, 4, 2, 4, 1)
        .unwrap()
        .with_rows_max(5)
        .unwrap();
    assert_eq!(expert_row(&c, &ecol, 1, 0, 2), Some(4));
    assert_eq!(expert_row(&c, &ecol, 0, 1, 0), None);
    assert_eq!(expert_span(&c, &ecol, 0), (0, 5));
    assert_eq!(expert_span(&c, &ecol, 1), (5, 0));
    let c = c.with_rows_max(3).unwrap();
    assert_eq!(expert_row(&c, &ecol, 1, 0, 0), Some(2));
    assert_eq!(expert_row(&c, &ecol, 1, 0, 1), None);
    assert_eq!(expert_span(&c, &ecol, 0), (0, 3));
    assert_eq!(expert_span(&c, &ecol, 1), (3, 0));
    let c = c.with_rows_max(0).unwrap();
    assert_eq!(expert_row(&c, &ecol, 0, 0, 0), None);
    assert_eq!(expert_span(&c, &ecol, 0), (0, 0));
}

#[test]
fn tags_carry_the_epoch_and_the_value() {
    let w = tag(7, 42);
    assert_eq!(w, 7 << 32 | 42);
    assert_eq!(untag(w, 7), Some(42));
    assert_eq!(untag(w, 6), None);
    assert_eq!(untag(w, 8), None);
    assert_eq!(untag(tag(u32::MAX, u32::MAX), u32::MAX), Some(u32::MAX));
    assert_eq!(untag(tag(1, 0), 1), Some(0));
    // A zeroed word is no epoch a call uses (epochs start at 1).
    assert_eq!(untag(0, 1), None);
}

#[cfg(feature = "alloc")]
#[test]
fn errors_display_what_failed() {
    use alloc::string::ToString;
    assert!(MoeError::TooLarge { bytes: 3 }.to_string().contains("2^48"));
    let e = MoeError::ExpertOutOfRange {
        token: 3,
        k: 1,
        expert: 99,
        experts: 8,
    };
    assert_eq!(
        e.to_string(),
        "token 3 entry 1 names expert 99, outside 0..8"
    );
    assert!(MoeError::BadWorld { world: 0 }
        .to_string()
        .contains("world 0"));
}

#[test]
fn a_token_bound_past_two_to_the_31_is_refused() {
    use super::{MoeConfig, MoeError, MAX_TOKENS};
    assert_eq!(
        MoeConfig::new(1, 1, 1, MAX_TOKENS + 1, 1),
        Err(MoeError::TooManyTokens {
            tokens: MAX_TOKENS + 1,
            bound: MAX_TOKENS
        })
    );
    assert!(MoeConfig::new(1, 1, 1, 4096, 1).is_ok());
}
