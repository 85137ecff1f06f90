//! Placement: which GPU a rank of a job opens.
//!
//! By default rank `LOCAL_RANK` opens GPU `LOCAL_RANK`, as torchrun and symm-run number them.
//! `SYMM_DEVICES` overrides it:
//!
//! * a list of ordinals, one per local rank: `SYMM_DEVICES=0,0,1,1` puts local ranks 0 and 1 on
//!   GPU 0 and local ranks 2 and 3 on GPU 1 (ranks may share a GPU);
//! * `mod`: local rank r opens GPU `r % visible`, so any number of ranks share the visible GPUs.
//!
//! The value is untrusted: it is parsed strictly (decimal ordinals, at most [`MAX_LIST`]
//! entries, at most [`MAX_TEXT`] bytes), and every failure is a [`PlacementError`] that names
//! the value (cut) and what is allowed. A local rank past the visible GPUs without
//! `SYMM_DEVICES` is refused with the count and the way to share a GPU.

use std::ffi::OsString;
use std::fmt;

/// The variable.
pub const SYMM_DEVICES: &str = "SYMM_DEVICES";
/// Most entries of a list.
pub const MAX_LIST: usize = 4096;
/// Longest value read.
pub const MAX_TEXT: usize = 32 * 1024;

/// Why a rank has no GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlacementError {
    /// `LOCAL_RANK` is past the visible GPUs and `SYMM_DEVICES` is not set.
    PastVisible {
        /// The local rank.
        local_rank: u16,
        /// GPUs visible to this process.
        visible: i32,
    },
    /// `SYMM_DEVICES` is not a list of ordinals or `mod`.
    Malformed {
        /// The value, cut to 64 characters.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The list has no entry for this local rank.
    NoEntry {
        /// The local rank.
        local_rank: u16,
        /// Entries in the list.
        entries: usize,
    },
    /// An entry names a GPU that is not visible.
    NotVisible {
        /// The local rank.
        local_rank: u16,
        /// The ordinal named.
        ordinal: u64,
        /// GPUs visible to this process.
        visible: i32,
    },
    /// No GPU is visible.
    NoGpu,
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::PastVisible {
                local_rank,
                visible,
            } => write!(
                f,
                "LOCAL_RANK {local_rank} but {visible} GPU(s) visible: to share GPUs between \
                 ranks set {SYMM_DEVICES}=mod (rank r on GPU r % {visible}) or a list such as \
                 {SYMM_DEVICES}=0,0 (and start MPS for full speed, see the README)"
            ),
            PlacementError::Malformed { value, why } => write!(
                f,
                "{SYMM_DEVICES}={value:?}: {why} (expected `mod` or comma-separated GPU ordinals)"
            ),
            PlacementError::NoEntry {
                local_rank,
                entries,
            } => write!(
                f,
                "{SYMM_DEVICES} has {entries} entries; local rank {local_rank} needs one"
            ),
            PlacementError::NotVisible {
                local_rank,
                ordinal,
                visible,
            } => write!(
                f,
                "{SYMM_DEVICES} puts local rank {local_rank} on GPU {ordinal}, but {visible} \
                 GPU(s) are visible"
            ),
            PlacementError::NoGpu => write!(f, "no GPU is visible"),
        }
    }
}

impl std::error::Error for PlacementError {}

/// The GPU ordinal of `local_rank` among `visible` GPUs, given the environment `get` reads.
pub fn device_for(
    local_rank: u16,
    visible: i32,
    get: impl Fn(&str) -> Option<OsString>,
) -> Result<i32, PlacementError> {
    if visible <= 0 {
        return Err(PlacementError::NoGpu);
    }
    let Some(raw) = get(SYMM_DEVICES) else {
        if i32::from(local_rank) >= visible {
            return Err(PlacementError::PastVisible {
                local_rank,
                visible,
            });
        }
        return Ok(i32::from(local_rank));
    };
    let cut = |s: &str| s.chars().take(64).collect::<String>();
    let bad = |value: &str, why| PlacementError::Malformed {
        value: cut(value),
        why,
    };
    if raw.len() > MAX_TEXT {
        return Err(bad("", "longer than 32 KiB"));
    }
    let text = raw
        .to_str()
        .ok_or_else(|| bad(&raw.to_string_lossy(), "not UTF-8"))?
        .trim();
    if text == "mod" {
        return Ok(i32::from(local_rank) % visible);
    }
    if text.is_empty() {
        return Err(bad(text, "empty"));
    }
    let mut entries = 0usize;
    let mut mine = None;
    for (i, part) in text.split(',').enumerate() {
        if i >= MAX_LIST {
            return Err(bad(text, "more than 4096 entries"));
        }
        let part = part.trim();
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 9 {
            return Err(bad(text, "an entry is not a GPU ordinal"));
        }
        let ordinal: u64 = part
            .parse()
            .map_err(|_| bad(text, "an entry is not a GPU ordinal"))?;
        if i == usize::from(local_rank) {
            mine = Some(ordinal);
        }
        entries += 1;
    }
    let ordinal = mine.ok_or(PlacementError::NoEntry {
        local_rank,
        entries,
    })?;
    if ordinal >= visible as u64 {
        return Err(PlacementError::NotVisible {
            local_rank,
            ordinal,
            visible,
        });
    }
    Ok(ordinal as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(v: Option<&str>) -> impl Fn(&str) -> Option<OsString> + '_ {
        move |k| (k == SYMM_DEVICES).then(|| v.map(OsString::from)).flatten()
    }

    #[test]
    fn default_is_local_rank_and_past_the_gpus_says_how_to_share() {
        assert_eq!(device_for(1, 2, with(None)), Ok(1));
        let e = device_for(1, 1, with(None)).unwrap_err();
        assert_eq!(
            e,
            PlacementError::PastVisible {
                local_rank: 1,
                visible: 1
            }
        );
        let m = e.to_string();
        assert!(
            m.contains("1 GPU(s) visible") && m.contains("SYMM_DEVICES"),
            "{m}"
        );
        assert_eq!(device_for(0, 0, with(None)), Err(PlacementError::NoGpu));
    }

    #[test]
    fn lists_and_mod_place_ranks_on_shared_gpus() {
        assert_eq!(device_for(3, 1, with(Some("mod"))), Ok(0));
        assert_eq!(device_for(5, 2, with(Some(" mod "))), Ok(1));
        assert_eq!(device_for(0, 1, with(Some("0,0,0"))), Ok(0));
        assert_eq!(device_for(2, 2, with(Some("0, 0, 1"))), Ok(1));
    }

    #[test]
    fn hostile_values_are_typed_errors() {
        for v in [
            "",
            "-1",
            "0,,1",
            "a",
            "0x1",
            "1e3",
            "+1",
            "0;1",
            "99999999999999999999",
        ] {
            assert!(
                matches!(
                    device_for(0, 4, with(Some(v))),
                    Err(PlacementError::Malformed { .. })
                ),
                "{v:?}"
            );
        }
        assert!(matches!(
            device_for(0, 2, with(Some("7"))),
            Err(PlacementError::NotVisible { ordinal: 7, .. })
        ));
        assert!(matches!(
            device_for(3, 2, with(Some("0,1"))),
            Err(PlacementError::NoEntry { entries: 2, .. })
        ));
        let huge = "0,".repeat(MAX_LIST + 1);
        assert!(matches!(
            device_for(0, 1, with(Some(&huge))),
            Err(PlacementError::Malformed { .. })
        ));
        let long = "0".repeat(MAX_TEXT + 1);
        let e = device_for(0, 1, with(Some(&long))).unwrap_err();
        assert!(e.to_string().len() < 300, "{e}");
    }
}
