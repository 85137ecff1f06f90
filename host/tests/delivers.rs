//! `Collective::delivers_to` says which ranks' outputs a collective defines: exactly those the
//! reference writes (a runtime copies a staged output back only there).

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, collectives, Request};
use symm_host::{random_inputs, reference, POISON};

#[test]
fn delivered_outputs_are_the_ones_the_reference_defines() {
    for world in [1u16, 2, 3, 5] {
        for c in collectives(world) {
            let a = algorithms(c)[0];
            let req = Request::new(c, a, world, 64, DType::I32, ReduceOp::Sum);
            let outs = reference(&req, &random_inputs(&req, 3));
            for (r, out) in outs.iter().enumerate() {
                let defined = out.iter().any(|&b| b != POISON);
                assert_eq!(
                    c.delivers_to(r as u16),
                    defined,
                    "{c:?} rank {r} of {world}"
                );
            }
        }
    }
}
