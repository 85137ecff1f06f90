//! The timeout records kernels write to host-mapped memory: a device wait that passed its
//! deadline, a peer whose call differs, or an op the interpreter refused, becomes a typed
//! error.

use core::mem::offset_of;

use symm_core::sched::Signature;
use symm_kernels::abi::{self, TimeoutRecord};

use super::device::HostMapped;
use super::error::CudaError;

/// The error of a peer `rank` whose call signature `theirs` differs from this rank's `mine`
/// (`symm_core::sched::Signature`): what differs, in words, and both words.
pub fn differ(rank: u16, mine: u64, theirs: u64) -> CudaError {
    let (m, t) = (Signature(mine), Signature(theirs));
    CudaError::RanksDiffer {
        rank,
        mine: format!("made call {} (signature {mine:#018x})", m.sequence()),
        theirs: format!(
            "a call that differs in {} (signature {theirs:#018x})",
            m.differs(t).words()
        ),
    }
}

/// The error the timeout records at byte offsets `ats` of `host` report: the first call that
/// differs across ranks (a timeout it causes elsewhere is its consequence), else the first
/// timeout, else the first op the interpreter refused; `None` when every record is empty
/// (records of waits stopped by the abort word are the consequence of another failure and
/// report nothing).
pub fn first_failure(host: &HostMapped, ats: impl Iterator<Item = usize>) -> Option<CudaError> {
    let (mut late, mut bad) = (None, None);
    for at in ats {
        // Field offsets of `symm_timeout_record`, from the one definition of the ABI.
        let u32_at = |o: usize| host.read_u32(at + o);
        let rank = u32_at(offset_of!(TimeoutRecord, rank)) as u16;
        let channel = u32_at(offset_of!(TimeoutRecord, channel)) as u16;
        let op_index = u32_at(offset_of!(TimeoutRecord, op_index));
        match u32_at(offset_of!(TimeoutRecord, reason)) {
            abi::STOP_DIFFER => {
                let rows = |o: usize| format!("called it with {} rows", host.read_u64(at + o));
                return Some(CudaError::RanksDiffer {
                    rank: u32_at(offset_of!(TimeoutRecord, peer)) as u16,
                    mine: rows(offset_of!(TimeoutRecord, expected)),
                    theirs: rows(offset_of!(TimeoutRecord, found)),
                });
            }
            abi::STOP_SIGNATURE => {
                let word = |o: usize| host.read_u64(at + o);
                let (mine, theirs) = (
                    word(offset_of!(TimeoutRecord, expected)),
                    word(offset_of!(TimeoutRecord, found)),
                );
                return Some(differ(
                    u32_at(offset_of!(TimeoutRecord, peer)) as u16,
                    mine,
                    theirs,
                ));
            }
            abi::STOP_TIMEOUT => {
                late.get_or_insert(CudaError::Timeout {
                    rank,
                    peer: u32_at(offset_of!(TimeoutRecord, peer)) as u16,
                    slot: u32_at(offset_of!(TimeoutRecord, slot)),
                    channel,
                    expected: host.read_u64(at + offset_of!(TimeoutRecord, expected)),
                    found: host.read_u64(at + offset_of!(TimeoutRecord, found)),
                    op_index,
                });
            }
            abi::STOP_BAD_OP => {
                bad.get_or_insert(CudaError::BadOp {
                    rank,
                    channel,
                    op_index,
                });
            }
            _ => {}
        }
    }
    late.or(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::{Algorithm, Collective, Request};

    /// A signature record names the peer, this rank's call and what differs, in words.
    #[test]
    fn a_signature_record_names_what_differs() {
        let mine = Request::new(
            Collective::AllReduce,
            Algorithm::OneShot,
            4,
            4096,
            DType::F32,
            ReduceOp::Sum,
        );
        let theirs = Request {
            bytes: 4128,
            op: ReduceOp::Max,
            ..mine
        };
        let e = differ(3, mine.signature(104).0, theirs.signature(104).0);
        let CudaError::RanksDiffer { rank, .. } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*rank, 3);
        let text = e.to_string();
        assert!(text.contains("made call 104"), "{text}");
        assert!(
            text.contains("differs in the reduction operator and the size"),
            "{text}"
        );
    }
}
