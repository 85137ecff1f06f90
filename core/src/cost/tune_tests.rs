use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::sched::Collective;

/// Every table entry is a request that validates; `tune` takes the nearest entry of the
/// request's (collective, world), and the model elsewhere.
#[test]
fn tune_reads_the_calibration_table() {
    let table: alloc::vec::Vec<&Calibrated> = calibrated().collect();
    for &e in &table {
        let c = crate::sched::Collective::parse(e.collective).unwrap_or_else(|err| panic!("{err}"));
        let req = Request::new(c, e.algorithm, e.world, e.bytes, DType::Bf16, ReduceOp::Sum)
            .with_channels(e.channels);
        req.validate()
            .unwrap_or_else(|err| panic!("{e:?}: {err:?}"));
        let (t, how) = tune_on(
            Request::new(
                c,
                Algorithm::Ring,
                e.world,
                e.bytes,
                DType::Bf16,
                ReduceOp::Sum,
            ),
            e.topology,
        );
        assert_eq!(how, Choice::Calibrated);
        let same = table
            .iter()
            .filter(|x| {
                x.topology == e.topology
                    && x.collective == e.collective
                    && x.world == e.world
                    && x.bytes == e.bytes
            })
            .any(|x| x.algorithm == t.algorithm && x.channels == t.channels);
        assert!(same, "{e:?} -> {t:?}");
    }
    // A world the table does not cover falls back to the model.
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        7,
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    );
    let (t, how) = tune(req);
    assert_eq!(how, Choice::Model);
    assert_eq!(t.algorithm, select(&req, &Link::NVLINK4, false));
    assert_eq!(t.channels, default_channels(1 << 20));
}

/// Entries measured with every rank on its own NVLink-joined GPU never choose for ranks
/// that share a device (and the reverse): without entries of its own, a shared device gets
/// the model on its own link.
#[test]
fn tune_keeps_topologies_apart() {
    let table: alloc::vec::Vec<&Calibrated> = calibrated().collect();
    let e = table
        .iter()
        .find(|e| e.topology == Topology::Nvlink && e.collective == "all_reduce")
        .expect("the table holds NVLink all-reduce entries");
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        e.world,
        e.bytes,
        DType::Bf16,
        ReduceOp::Sum,
    );
    assert_eq!(tune_on(req, Topology::Nvlink).1, Choice::Calibrated);
    let shared = table.iter().any(|x| {
        x.topology == Topology::SharedDevice && x.collective == "all_reduce" && x.world == e.world
    });
    if !shared {
        let (t, how) = tune_on(req, Topology::SharedDevice);
        assert_eq!(how, Choice::Model);
        assert_eq!(t.algorithm, select(&req, &Link::SHARED_DEVICE, false));
    }
}
