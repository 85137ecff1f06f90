//! Teaching labs: write collective schedules by hand, and have every check of the library
//! grade them.
//!
//! Each lab lives in its own folder `labs/NN-name/`: a `README.md` that teaches one idea, a
//! `skeleton.rs` the student edits (a schedule written against [`kit::Kit`], the library's own
//! instruction set in element units) and a `solution.rs`, the reference solution. This crate
//! compiles both into every build (`labNN::skeleton`, `labNN::solution`), so neither can rot.
//!
//! A lab's checker ([`LABS`]) runs a schedule over several requests through [`run::check_case`]:
//! each op on its own, the symbolic check under random interleavings, the host simulator and
//! real threads against the reference. It stops at the first [`problem::Problem`], says it in
//! words with a hint, and writes the schedule's trace beside the reference solution's for the
//! viz's compare view.
//!
//! `cargo xtask lab` lists the labs, `cargo xtask lab N` shows one, `cargo xtask lab check N`
//! grades the student's file (`--solution`: the reference), `cargo xtask lab view N` opens the
//! traces in the viz. `cargo xtask test` grades every solution (must pass) and every untouched
//! skeleton (must fail).

#![forbid(unsafe_code)]

// Lab files are written as a student's crate would write them: `use symm_labs::...`.
extern crate self as symm_labs;

pub mod catalogue;
pub mod evidence;
#[cfg(not(loom))]
pub mod gpu;
pub mod grade;
pub mod kit;
pub mod mistakes;
pub mod problem;
pub mod rules;
pub mod run;
pub mod sym;

pub mod lab01;
pub mod lab02;
pub mod lab03;
pub mod lab04;
pub mod lab05;
pub mod lab06;
pub mod lab07;
pub mod lab08;
pub mod lab09;

use grade::{Graded, Grader};

/// One lab.
pub struct Lab {
    /// Its number.
    pub number: u8,
    /// Its folder under `labs/`.
    pub dir: &'static str,
    /// Its title.
    pub title: &'static str,
    /// Its checker.
    pub check: fn(&mut Grader) -> Graded,
    /// Whether part of it is a loom model (`tests/lab04_loom.rs`, run with `--cfg loom`).
    pub loom: bool,
}

/// Every lab, in order.
pub const LABS: &[Lab] = &[
    Lab {
        number: 1,
        dir: "01-ring-all-gather",
        title: "ring all-gather",
        check: lab01::check,
        loom: false,
    },
    Lab {
        number: 2,
        dir: "02-ring-reduce-scatter",
        title: "ring reduce-scatter and all-reduce",
        check: lab02::check,
        loom: false,
    },
    Lab {
        number: 3,
        dir: "03-pipelining-credits",
        title: "pipelining with credits and scratch slots",
        check: lab03::check,
        loom: false,
    },
    Lab {
        number: 4,
        dir: "04-signal-barrier",
        title: "the signal protocol: a barrier, and loom",
        check: lab04::check,
        loom: true,
    },
    Lab {
        number: 5,
        dir: "05-double-binary-tree",
        title: "double binary tree broadcast",
        check: lab05::check,
        loom: false,
    },
    Lab {
        number: 6,
        dir: "06-halving-doubling",
        title: "recursive halving-doubling, any world",
        check: lab06::check,
        loom: false,
    },
    Lab {
        number: 7,
        dir: "07-one-shot-two-shot",
        title: "one-shot against two-shot: the crossover",
        check: lab07::check,
        loom: false,
    },
    Lab {
        number: 8,
        dir: "08-multicast",
        title: "multicast all-reduce on the host model",
        check: lab08::check,
        loom: false,
    },
    Lab {
        number: 9,
        dir: "09-moe-all-to-all",
        title: "all-to-all for MoE dispatch and combine",
        check: lab09::check,
        loom: false,
    },
];

/// The lab numbered `n`.
pub fn lab(n: u8) -> Option<&'static Lab> {
    LABS.iter().find(|l| l.number == n)
}
