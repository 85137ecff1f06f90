//! `ncclCommSplit` on a communicator symm serves.
//!
//! Splitting is collective over the parent. With a real library, the real split makes the new
//! communicator and its rank and size; without one (`SYMM_NCCL_SHIM=alone`) every rank's color
//! and key cross the parent's bootstrap and the new ranks are [`members`]' order. Either way the
//! members of one color then join a symm job of their own, named after the parent's job, the
//! parent's split count and the color (the same on every member), with the parent's secret.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use symm_driver::cuda::ffi::nccl::Comm;

use crate::exports::{
    blocking, code_of, every_rank_joined, fail, guarded, out, real_api, NcclResult,
    INVALID_ARGUMENT, SUCCESS,
};
use crate::id::Job;
use crate::state::{self, Entry, Real};

/// `NCCL_SPLIT_NOCOLOR`: the rank joins no new communicator.
pub const NO_COLOR: c_int = -1;

/// The old ranks of `me`'s new communicator in new-rank order, from every rank's `(color,
/// key)`: the ranks of `me`'s color by key, then by old rank (NCCL's order). `None` when `me`
/// has [`NO_COLOR`].
pub fn members(all: &[(c_int, c_int)], me: usize) -> Option<Vec<usize>> {
    let (color, _) = *all.get(me)?;
    if color == NO_COLOR {
        return None;
    }
    let mut m: Vec<usize> = (0..all.len()).filter(|&r| all[r].0 == color).collect();
    m.sort_by_key(|&r| (all[r].1, r));
    Some(m)
}

/// Every rank's `(color, key)` from the bytes the ranks exchanged (8 each, little-endian);
/// `None` when any rank's are not exactly that.
pub fn colors<B: AsRef<[u8]>>(all: &[B]) -> Option<Vec<(c_int, c_int)>> {
    let word = |b: &[u8]| c_int::from_le_bytes([b[0], b[1], b[2], b[3]]);
    all.iter()
        .map(|b| {
            let b = b.as_ref();
            (b.len() == 8).then(|| (word(&b[..4]), word(&b[4..])))
        })
        .collect()
}

/// The job of split number `n`, color `color`, of `parent`.
fn child(parent: &Job, n: u32, color: c_int) -> Job {
    Job {
        name: format!("{}-s{n}c{color}", parent.name),
        token: parent.token.clone(),
    }
}

/// `ncclCommSplit`.
///
/// # Safety
/// `comm` a communicator of this library or the real one; `newcomm` null or writable;
/// `config` null or a valid `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut Comm,
    config: *mut c_void,
) -> NcclResult {
    guarded(|| {
        if color < NO_COLOR {
            return fail(INVALID_ARGUMENT, &format!("color {color} is negative"));
        }
        let Some(parent) = state::get(comm as usize) else {
            return match real_api() {
                // SAFETY: the caller's arguments, passed through.
                Ok(api) => unsafe { (api.comm_split)(comm, color, key, newcomm, config) },
                Err(rc) => rc,
            };
        };
        // SAFETY: the caller's out-pointer.
        let handle = match unsafe { out(newcomm) } {
            Ok(h) => h,
            Err(rc) => return rc,
        };
        let n = parent.splits.fetch_add(1, Ordering::Relaxed);
        match parent.real {
            // SAFETY: the caller's configuration.
            Some(real) => unsafe { with_real(&parent, real, (color, key, n), handle, config) },
            None => alone(&parent, (color, key, n), handle),
        }
    })
}

/// The split with the real library: its communicator, then the color's symm job.
///
/// # Safety
/// `config` null or a valid `ncclConfig_t`.
unsafe fn with_real(
    parent: &Entry,
    real: Real,
    (color, key, n): (c_int, c_int, u32),
    handle: &mut Comm,
    config: *mut c_void,
) -> NcclResult {
    let api = match real_api() {
        Ok(a) => a,
        Err(rc) => return rc,
    };
    // SAFETY: the parent's real communicator and the caller's out-pointer and configuration.
    let rc = unsafe { (api.comm_split)(real.0, color, key, handle, config) };
    // SAFETY: the caller's configuration, null or valid.
    let blocks = unsafe { blocking(config) };
    if rc != SUCCESS || handle.is_null() || state::in_group() || !blocks {
        return rc;
    }
    let new = Real(*handle);
    let (mut world, mut rank) = (0, 0);
    // SAFETY: the communicator the real library just made, and valid out-pointers.
    let ok = unsafe {
        (api.comm_count)(new.0, &mut world) == SUCCESS
            && (api.comm_user_rank)(new.0, &mut rank) == SUCCESS
    };
    let sized = u16::try_from(world).ok().zip(u16::try_from(rank).ok());
    let joined = match (ok, sized) {
        (true, Some((w, r))) => {
            state::join(child(&parent.job, n, color), w, r, Some(new)).map_err(|e| e.to_string())
        }
        _ => Err("the real split gave no rank and size".to_string()),
    };
    if let Err(e) = &joined {
        eprintln!("symm-nccl: a split communicator runs on NCCL alone: {e}");
    }
    if let (Ok(true), Ok(entry)) = (every_rank_joined(api, new, joined.is_ok()), joined) {
        state::insert(new.0 as usize, entry);
    }
    SUCCESS
}

/// The split without a real library: colors and keys over the parent's bootstrap.
fn alone(parent: &Entry, (color, key, n): (c_int, c_int, u32), handle: &mut Comm) -> NcclResult {
    let mine = [color.to_le_bytes(), key.to_le_bytes()].concat();
    let all = match parent.comm.exchange(&mine) {
        Ok(a) => a,
        Err(e) => return fail(code_of(e.kind()), &e.to_string()),
    };
    let Some(all) = colors(&all) else {
        return fail(INVALID_ARGUMENT, "a peer sent a malformed split");
    };
    let me = usize::from(parent.comm.rank());
    let Some(m) = members(&all, me) else {
        *handle = std::ptr::null_mut();
        return SUCCESS;
    };
    let rank = m.iter().position(|&r| r == me).unwrap_or(0);
    let (Ok(w), Ok(r)) = (u16::try_from(m.len()), u16::try_from(rank)) else {
        return fail(INVALID_ARGUMENT, "the split is larger than a job");
    };
    match state::join(child(&parent.job, n, color), w, r, None) {
        Ok(entry) => {
            // A handle of the shim's, freed by destroy or abort.
            *handle = state::insert_own(entry);
            SUCCESS
        }
        Err(e) => fail(code_of(e.kind()), &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_follow_color_then_key_then_rank() {
        let all = [(0, 5), (1, 0), (0, -1), (NO_COLOR, 0), (0, 5), (1, -3)];
        assert_eq!(members(&all, 0), Some(vec![2, 0, 4]));
        assert_eq!(members(&all, 4), Some(vec![2, 0, 4]));
        assert_eq!(members(&all, 1), Some(vec![5, 1]));
        assert_eq!(members(&all, 3), None);
        assert_eq!(members(&all, 6), None);
        assert_eq!(members(&[], 0), None);
    }

    #[test]
    fn peers_split_bytes_are_exactly_two_words_or_refused() {
        let mine = [(-1i32).to_le_bytes(), 7i32.to_le_bytes()].concat();
        let theirs = [3i32.to_le_bytes(), i32::MIN.to_le_bytes()].concat();
        assert_eq!(
            colors(&[mine.clone(), theirs.clone()]),
            Some(vec![(NO_COLOR, 7), (3, i32::MIN)])
        );
        assert_eq!(colors::<Vec<u8>>(&[]), Some(vec![]));
        for bad in [vec![], vec![0u8; 7], vec![0u8; 9], vec![0xff; 1 << 16]] {
            assert_eq!(colors(&[mine.clone(), bad.clone()]), None, "{}", bad.len());
            assert_eq!(colors(&[bad, theirs.clone()]), None);
        }
    }

    #[test]
    fn a_splits_job_is_named_the_same_on_every_member_and_valid() {
        let parent = Job::fresh().unwrap();
        let a = child(&parent, 3, 7);
        assert_eq!(a, child(&parent, 3, 7));
        assert_ne!(a.name, child(&parent, 4, 7).name);
        assert_ne!(a.name, child(&parent, 3, 8).name);
        let longest = child(&parent, u32::MAX, c_int::MAX);
        let name = std::ffi::OsString::from(&longest.name);
        assert_eq!(
            symm_driver::bootstrap::env::parse_job(&name),
            Ok(longest.name.clone())
        );
    }
}
