//! How many GPUs a job's ranks will see, and whether they must share them.

use std::ffi::OsString;

/// The GPUs a rank will see: `CUDA_VISIBLE_DEVICES`'s entries when it is set, else the
/// `/dev/nvidiaN` nodes (`nodes`); `None` when neither says.
pub(super) fn visible_gpus(
    cuda_visible: Option<OsString>,
    nodes: impl Iterator<Item = String>,
) -> Option<usize> {
    if let Some(v) = cuda_visible {
        let v = v.to_string_lossy();
        return Some(v.split(',').filter(|e| !e.trim().is_empty()).count());
    }
    let n = nodes
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    (n > 0).then_some(n)
}

/// The names in /dev (bounded: a directory listing, at most 4096 names).
pub(super) fn dev_nodes() -> impl Iterator<Item = String> {
    std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .take(4096)
        .filter_map(|e| e.file_name().into_string().ok())
}

/// When a job has more ranks than the GPUs it sees and the user chose no placement, its ranks
/// share the GPUs (`SYMM_DEVICES=mod`, `cuda::placement`): the GPU count, else `None`.
pub(super) fn share_gpus(ranks: u16, placed: bool, gpus: Option<usize>) -> Option<usize> {
    gpus.filter(|&g| !placed && g > 0 && (ranks as usize) > g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_ranks_than_gpus_share_them_unless_placed() {
        let nodes = |v: &[&str]| {
            v.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .into_iter()
        };
        let devs = nodes(&[
            "nvidia0",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia1",
            "null",
            "nvidia",
        ]);
        assert_eq!(visible_gpus(None, devs), Some(2));
        assert_eq!(visible_gpus(Some("3".into()), nodes(&[])), Some(1));
        assert_eq!(visible_gpus(Some("0,1,,2".into()), nodes(&[])), Some(3));
        assert_eq!(visible_gpus(Some("".into()), nodes(&["nvidia0"])), Some(0));
        assert_eq!(visible_gpus(None, nodes(&["nvidiactl"])), None);
        assert_eq!(share_gpus(4, false, Some(1)), Some(1));
        assert_eq!(
            share_gpus(4, true, Some(1)),
            None,
            "SYMM_DEVICES set: the user placed"
        );
        assert_eq!(share_gpus(2, false, Some(2)), None);
        assert_eq!(share_gpus(4, false, Some(0)), None);
        assert_eq!(share_gpus(4, false, None), None);
    }
}
