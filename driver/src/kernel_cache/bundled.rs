//! Kernels shipped beside the library (the Python wheel's `symm/kernels`): compiled when the
//! package was built, so a first `Comm` on a new machine loads its interpreter instead of
//! waiting on NVRTC (tens of seconds per variant).
//!
//! The package names the folder once ([`set_dir`]); nothing from the environment does. A file
//! there is used only when it is a regular file owned by the user or root that neither group
//! nor others can write, at most [`super::MAX_FILE_BYTES`] long, and when its SHA-256 header matches its
//! key: the key holds a hash of the variant's source, headers and compile options, so a
//! kernel of another source is never loaded. Anything else is skipped and the kernel is
//! compiled as before.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{check_key, decode, read_safe};

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Names the folder of bundled kernels; the first call wins. Returns whether `dir` is now the
/// folder.
pub fn set_dir(dir: PathBuf) -> bool {
    DIR.get_or_init(|| dir.clone()) == &dir
}

/// The bundled kernel of `key`, when the folder is named and holds a good file for it.
pub fn load(key: &str) -> Option<Vec<u8>> {
    let uid = super::euid().ok()?;
    load_from(DIR.get()?, key, uid)
}

/// [`load`] from `dir` for user `uid`.
pub fn load_from(dir: &Path, key: &str, uid: u32) -> Option<Vec<u8>> {
    check_key(key).ok()?;
    let bytes = read_safe(&dir.join(key), |owner| owner == uid || owner == 0)?;
    decode(key, &bytes).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::super::encode;
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_bundled_kernel_loads_only_under_its_own_key_from_a_safe_file() {
        let dir = std::env::temp_dir().join(format!("symm-bundled-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let uid = super::super::euid().unwrap();
        let key = "interp-sm90-0123456789abcdef.cubin";
        let path = dir.join(key);
        std::fs::write(&path, encode(key, b"\x7fELF kernel")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            load_from(&dir, key, uid).as_deref(),
            Some(&b"\x7fELF kernel"[..])
        );
        // Renamed to another key: the header's hash no longer matches.
        let other = "interp-sm90-fedcba9876543210.cubin";
        std::fs::copy(&path, dir.join(other)).unwrap();
        assert_eq!(load_from(&dir, other, uid), None);
        // Writable by others, owned by another user, not a plain name, missing: skipped.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(load_from(&dir, key, uid), None);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        if uid != 0 {
            // A file of this user, read for another: refused (root's files are accepted).
            assert_eq!(load_from(&dir, key, uid + 1), None);
        }
        assert_eq!(load_from(&dir, "../etc/passwd", uid), None);
        assert_eq!(load_from(&dir, "absent.cubin", uid), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
