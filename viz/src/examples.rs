//! The example traces built into the app.
//!
//! `cargo xtask viz` generates them with the host simulator (chunk contents on) into
//! `dist/examples/` next to the app; the menu fetches them by file name.

/// (file name, label) of every example, in menu order.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("all_reduce-ring-w4.trace", "all-reduce, ring, 4 ranks"),
    ("all_reduce-tree-w4.trace", "all-reduce, tree, 4 ranks"),
    (
        "all_reduce-rhd-w4.trace",
        "all-reduce, halving-doubling, 4 ranks",
    ),
    (
        "all_reduce-one_shot-w4.trace",
        "all-reduce, one-shot, 4 ranks",
    ),
    (
        "all_reduce-two_shot-w4.trace",
        "all-reduce, two-shot, 4 ranks",
    ),
    (
        "all_reduce-multicast-w4.trace",
        "all-reduce, multicast, 4 ranks",
    ),
    ("all_gather-ring-w4.trace", "all-gather, ring, 4 ranks"),
    (
        "all_to_all-pairwise-w4.trace",
        "all-to-all, pairwise, 4 ranks",
    ),
    ("all_reduce-ring-w8.trace", "all-reduce, ring, 8 ranks"),
    ("all_reduce-tree-w8.trace", "all-reduce, tree, 8 ranks"),
    (
        "all_reduce-rhd-w8.trace",
        "all-reduce, halving-doubling, 8 ranks",
    ),
    (
        "all_reduce-one_shot-w8.trace",
        "all-reduce, one-shot, 8 ranks",
    ),
    (
        "all_reduce-two_shot-w8.trace",
        "all-reduce, two-shot, 8 ranks",
    ),
    (
        "all_reduce-multicast-w8.trace",
        "all-reduce, multicast, 8 ranks",
    ),
    ("all_gather-ring-w8.trace", "all-gather, ring, 8 ranks"),
    (
        "all_to_all-pairwise-w8.trace",
        "all-to-all, pairwise, 8 ranks",
    ),
    (
        "hang-all_reduce-ring-w4.trace",
        "a hang: ring all-reduce, rank 2 dies",
    ),
    ("moe_dispatch-w4.trace", "MoE dispatch, top-2, 4 ranks"),
];

/// Where the examples are served, relative to the app.
pub const DIR: &str = "examples/";
