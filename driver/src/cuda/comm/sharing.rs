//! Ranks that share a GPU.
//!
//! When a job has more ranks than GPUs (`SYMM_DEVICES`, `cuda::placement`), several processes
//! open the same device and import each other's heap memory on it. Without MPS their kernels
//! take turns on the GPU in time slices of milliseconds, so a signal that crosses between them
//! takes milliseconds instead of a microsecond: collectives stay correct but slow. At open, every
//! rank tells the others its device (PCI domain, bus and device) and whether MPS serves it; a
//! rank whose device holds other ranks without MPS says so once per process, with how to start
//! MPS, and runs with its device-wait deadline scaled by [`SLICED_DEADLINE_FACTOR`] (at most
//! `MAX_WAIT`), so time slicing still completes.

use std::sync::Once;
use std::time::Duration;

use crate::cuda::bounds::MAX_WAIT;
use crate::cuda::device::Device;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::ffi::driver as ffi;
use crate::cuda::rendezvous::{Bootstrap, SocketRendezvous};

/// How much longer device waits may take when ranks share a GPU without MPS.
pub const SLICED_DEADLINE_FACTOR: u32 = 30;

/// How this rank's GPU is shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sharing {
    /// Ranks of the job on this rank's device, itself included.
    pub ranks_on_device: u16,
    /// Whether MPS serves the device (kernels of several processes run at once).
    pub mps: bool,
    /// Whether this rank is the lowest-numbered rank on its device (the one that warns).
    pub first: bool,
}

impl Sharing {
    /// Whether ranks take turns on the device (shared without MPS).
    pub fn time_sliced(&self) -> bool {
        self.ranks_on_device > 1 && !self.mps
    }

    /// The topology symm's default choices are made for: ranks sharing a GPU or not.
    pub fn topology(&self) -> symm_core::cost::Topology {
        if self.ranks_on_device > 1 {
            symm_core::cost::Topology::SharedDevice
        } else {
            symm_core::cost::Topology::Nvlink
        }
    }

    /// The device-wait deadline for `timeout`: scaled when time sliced, never past `MAX_WAIT`.
    pub fn deadline(&self, timeout: Duration) -> Duration {
        if self.time_sliced() {
            timeout.saturating_mul(SLICED_DEADLINE_FACTOR).min(MAX_WAIT)
        } else {
            timeout
        }
    }
}

/// This rank's device identity and MPS flag as sent to the others: domain, bus, device, mps.
fn identity(dev: &Device) -> Result<[u32; 4]> {
    let a = |attr| dev.attribute(attr).map(|v| v as u32);
    Ok([
        a(ffi::ATTR_PCI_DOMAIN_ID)?,
        a(ffi::ATTR_PCI_BUS_ID)?,
        a(ffi::ATTR_PCI_DEVICE_ID)?,
        a(ffi::ATTR_MPS_ENABLED)?,
    ])
}

/// Collective: how `rank`'s device `dev` is shared in the job, from every rank's identity.
pub(super) fn exchange(boot: &SocketRendezvous, rank: u16, dev: &Device) -> Result<Sharing> {
    let mine = identity(dev)?;
    let bytes: Vec<u8> = mine.iter().flat_map(|x| x.to_le_bytes()).collect();
    let all = boot.all_gather(rank, &bytes)?;
    let parts: Vec<[u32; 4]> = all
        .iter()
        .enumerate()
        .map(|(r, v)| {
            let w: Vec<u32> = v
                .chunks_exact(4)
                .filter_map(|b| b.try_into().ok().map(u32::from_le_bytes))
                .collect();
            <[u32; 4]>::try_from(w).map_err(|_| CudaError::Malformed {
                rank: u16::try_from(r).unwrap_or(u16::MAX),
                what: "device identity",
            })
        })
        .collect::<Result<_>>()?;
    Ok(sharing(rank, &mine, &parts))
}

/// How the device `mine` of `rank` is shared among `all` ranks' identities.
fn sharing(rank: u16, mine: &[u32; 4], all: &[[u32; 4]]) -> Sharing {
    let on = all.iter().filter(|p| p[..3] == mine[..3]).count();
    let first = all.iter().position(|p| p[..3] == mine[..3]) == Some(rank as usize);
    Sharing {
        ranks_on_device: u16::try_from(on).unwrap_or(u16::MAX),
        mps: mine[3] != 0,
        first,
    }
}

/// Says once per job and device (from its lowest rank, once per process) that ranks share a
/// GPU without MPS, and how to start it.
pub(super) fn warn_once(s: &Sharing, ordinal: i32, timeout: Duration) {
    static ONCE: Once = Once::new();
    if !s.time_sliced() || !s.first {
        return;
    }
    ONCE.call_once(|| {
        eprintln!(
            "symm: warning: {} ranks share GPU {ordinal} without MPS, so their kernels take \
             turns (a signal between them takes milliseconds); results stay correct and device \
             waits may take up to {:?}. For full speed start MPS before the job: \
             export CUDA_MPS_PIPE_DIRECTORY=$HOME/.symm-mps/pipe \
             CUDA_MPS_LOG_DIRECTORY=$HOME/.symm-mps/log; mkdir -p those; \
             nvidia-cuda-mps-control -d (and `echo quit | nvidia-cuda-mps-control` after)",
            s.ranks_on_device,
            s.deadline(timeout)
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_on_one_device_without_mps_are_time_sliced_with_longer_deadlines() {
        let a = [0, 0x41, 0, 0];
        let b = [0, 0x42, 0, 0];
        let s = sharing(2, &a, &[a, b, a]);
        assert_eq!(
            s,
            Sharing {
                ranks_on_device: 2,
                mps: false,
                first: false,
            }
        );
        assert!(sharing(0, &a, &[a, b, a]).first);
        assert!(s.time_sliced());
        assert_eq!(
            s.deadline(Duration::from_secs(10)),
            Duration::from_secs(10 * SLICED_DEADLINE_FACTOR as u64)
        );
        assert_eq!(s.deadline(MAX_WAIT), MAX_WAIT);
        // Under MPS, or alone on the device: the deadline as given.
        let mps = sharing(0, &[0, 0x41, 0, 1], &[[0, 0x41, 0, 1], [0, 0x41, 0, 1]]);
        assert!(!mps.time_sliced());
        assert_eq!(
            mps.deadline(Duration::from_secs(10)),
            Duration::from_secs(10)
        );
        assert!(!sharing(0, &a, &[a, b]).time_sliced());
    }
}
