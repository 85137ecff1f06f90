//! The on-disk cache of compiled kernels: a private folder of the user's, one file per key.
//!
//! Kernels from this folder run on the GPU, so it is used only when nobody else can write it:
//!
//! * The folder is `$SYMM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/symm/kernels`, else
//!   `$HOME/.cache/symm/kernels`, else `symm-kernels-<uid>` under the system temp dir; missing
//!   folders are created with mode 0700.
//! * [`KernelCache::open`] refuses the folder when it is owned by another user or can be written
//!   by its group or others, and when a folder above it could let another user replace it (owned
//!   by someone other than the user or root, or group/other-writable without the sticky bit).
//! * Each file holds a magic, the SHA-256 of (key, kernel) and the kernel; [`KernelCache::load`]
//!   returns the kernel only when the file is a regular file of the user's that nobody else can
//!   write and the hash matches, so a torn, altered or renamed file is never loaded.
//! * [`KernelCache::store`] writes a 0600 temporary file and renames it into place.
//!
//! [`fetch`] ties it together for a builder closure, so the policy is tested without a GPU.
//! [`bundled`] holds the read-only kernels a package ships, consulted before compiling.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The first bytes of every cache file.
const MAGIC: &[u8; 8] = b"SYMMKC01";
/// Magic plus digest.
const HEADER: usize = MAGIC.len() + 32;
/// Mode bits that let the group or others write.
const GROUP_OTHER_WRITE: u32 = 0o022;
/// The sticky bit: only an entry's owner may rename or remove it.
const STICKY: u32 = 0o1000;

/// Why the kernel cache is not used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheError {
    /// The effective user id could not be read; the text says why.
    NoUid(String),
    /// A filesystem call failed.
    Io {
        /// The path involved.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The folder, or a folder above it, belongs to another user.
    NotOwned {
        /// The folder.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The user running symm.
        uid: u32,
    },
    /// The folder, or a folder above it without the sticky bit, is writable by group or others.
    Writable {
        /// The folder.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The path exists and is not a folder.
    NotDir(PathBuf),
    /// A key is not a plain file name (`[A-Za-z0-9._-]`, not starting with a dot).
    BadKey(String),
}

impl core::fmt::Display for CacheError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CacheError::NoUid(s) => write!(f, "cannot tell the user id: {s}"),
            CacheError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            CacheError::NotOwned { path, owner, uid } => write!(
                f,
                "{} belongs to uid {owner}, not to this user (uid {uid})",
                path.display()
            ),
            CacheError::Writable { path, mode } => write!(
                f,
                "{} is writable by group or others (mode {mode:o})",
                path.display()
            ),
            CacheError::NotDir(p) => write!(f, "{} is not a folder", p.display()),
            CacheError::BadKey(k) => write!(f, "{k:?} is not a plain file name"),
        }
    }
}

impl std::error::Error for CacheError {}

fn io(path: &Path, e: std::io::Error) -> CacheError {
    CacheError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// The effective user id, from `/proc/self/status`.
pub fn euid() -> Result<u32, CacheError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| CacheError::NoUid(format!("/proc/self/status: {e}")))?;
    parse_euid(&status).ok_or_else(|| CacheError::NoUid("no Uid line in /proc/self/status".into()))
}

/// The effective uid (second field) of a `Uid:` line of a `/proc/<pid>/status` text.
fn parse_euid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The cache folder for these environment values (each `None` when unset): an explicit folder,
/// `XDG_CACHE_HOME`, `HOME`, the temp dir, and the user id. Relative or empty XDG/HOME values
/// are ignored.
pub fn choose_dir(
    explicit: Option<PathBuf>,
    xdg: Option<PathBuf>,
    home: Option<PathBuf>,
    temp: PathBuf,
    uid: u32,
) -> PathBuf {
    if let Some(d) = explicit.filter(|d| !d.as_os_str().is_empty()) {
        return d;
    }
    if let Some(d) = xdg.filter(|d| d.is_absolute()) {
        return d.join("symm/kernels");
    }
    if let Some(d) = home.filter(|d| d.is_absolute()) {
        return d.join(".cache/symm/kernels");
    }
    temp.join(format!("symm-kernels-{uid}"))
}

/// The cache folder from this process's environment (see [`choose_dir`]).
pub fn default_dir(uid: u32) -> PathBuf {
    let var = |k| std::env::var_os(k).map(PathBuf::from);
    choose_dir(
        var("SYMM_KERNEL_CACHE"),
        var("XDG_CACHE_HOME"),
        var("HOME"),
        std::env::temp_dir(),
        uid,
    )
}

/// The bytes stored for `kernel` under `key`: magic, SHA-256 of (key, kernel), kernel.
pub fn encode(key: &str, kernel: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + kernel.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&digest(key, kernel));
    out.extend_from_slice(kernel);
    out
}

/// Largest kernel file read (cache or bundled).
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// The bytes of `path` when it is a regular file of an owner `owner_ok` accepts, that neither
/// group nor others can write, of at most [`MAX_FILE_BYTES`].
fn read_safe(path: &Path, owner_ok: impl Fn(u32) -> bool) -> Option<Vec<u8>> {
    let f = File::open(path).ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file()
        || !owner_ok(m.uid())
        || m.mode() & GROUP_OTHER_WRITE != 0
        || m.len() > MAX_FILE_BYTES
    {
        return None;
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The kernel in a cache file's bytes, when the magic and the hash for `key` match.
pub fn decode<'a>(key: &str, file: &'a [u8]) -> Option<&'a [u8]> {
    if file.len() <= HEADER || &file[..MAGIC.len()] != MAGIC {
        return None;
    }
    let kernel = &file[HEADER..];
    bool::from(file[MAGIC.len()..HEADER].ct_eq(&digest(key, kernel))).then_some(kernel)
}

fn digest(key: &str, kernel: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((key.len() as u64).to_le_bytes());
    h.update(key.as_bytes());
    h.update(kernel);
    h.finalize().into()
}

fn check_key(key: &str) -> Result<(), CacheError> {
    let plain = !key.is_empty()
        && !key.starts_with('.')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if plain {
        Ok(())
    } else {
        Err(CacheError::BadKey(key.into()))
    }
}

/// Checks that only `uid` (or root) can change what `dir` (canonical) holds.
fn check_dir(dir: &Path, uid: u32) -> Result<(), CacheError> {
    let m = std::fs::metadata(dir).map_err(|e| io(dir, e))?;
    if !m.is_dir() {
        return Err(CacheError::NotDir(dir.into()));
    }
    if m.uid() != uid {
        return Err(CacheError::NotOwned {
            path: dir.into(),
            owner: m.uid(),
            uid,
        });
    }
    if m.mode() & GROUP_OTHER_WRITE != 0 {
        return Err(CacheError::Writable {
            path: dir.into(),
            mode: m.mode() & 0o7777,
        });
    }
    for up in dir.ancestors().skip(1) {
        let m = std::fs::metadata(up).map_err(|e| io(up, e))?;
        if m.uid() != uid && m.uid() != 0 {
            return Err(CacheError::NotOwned {
                path: up.into(),
                owner: m.uid(),
                uid,
            });
        }
        if m.mode() & GROUP_OTHER_WRITE != 0 && m.mode() & STICKY == 0 {
            return Err(CacheError::Writable {
                path: up.into(),
                mode: m.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// A checked, private kernel cache folder.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: PathBuf,
    uid: u32,
}

impl KernelCache {
    /// The cache in the default folder (see [`default_dir`]).
    pub fn open_default() -> Result<KernelCache, CacheError> {
        let uid = euid()?;
        Self::open_as(&default_dir(uid), uid)
    }

    /// The cache in `dir`, created (0700) when missing, for the current user.
    pub fn open(dir: &Path) -> Result<KernelCache, CacheError> {
        Self::open_as(dir, euid()?)
    }

    /// The cache in `dir` for user `uid`: created (0700) when missing, then refused unless only
    /// `uid` (or root, for the folders above it) can change what it holds.
    pub fn open_as(dir: &Path, uid: u32) -> Result<KernelCache, CacheError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io(dir, e))?;
        // From here on the resolved path is used, so a symlink swapped later changes nothing.
        let dir = std::fs::canonicalize(dir).map_err(|e| io(dir, e))?;
        check_dir(&dir, uid)?;
        Ok(KernelCache { dir, uid })
    }

    /// The (resolved) folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kernel stored under `key`, when there is one that passes every check; a file that
    /// fails the hash is removed.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        check_key(key).ok()?;
        let path = self.dir.join(key);
        let bytes = read_safe(&path, |owner| owner == self.uid)?;
        match decode(key, &bytes) {
            Some(kernel) => Some(kernel.to_vec()),
            None => {
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `kernel` under `key`: written to a 0600 temporary file, then renamed into place.
    pub fn store(&self, key: &str, kernel: &[u8]) -> Result<(), CacheError> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        check_key(key)?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{key}.{}.{n}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&encode(key, kernel))?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.dir.join(key))
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(&tmp, e)
        })
    }
}

/// Where a kernel came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// Loaded from the cache after its hash matched.
    Cache,
    /// Built and stored in the cache.
    Built,
    /// Built without the cache, for the reason given (folder refused, or the store failed).
    Uncached(CacheError),
}

impl Origin {
    /// Why the cache was not used, for [`Origin::Uncached`].
    pub fn uncached(&self) -> Option<&CacheError> {
        match self {
            Origin::Uncached(e) => Some(e),
            _ => None,
        }
    }
}

/// The kernel under `key`: from `cache` when it holds a good copy, else from `build`, stored
/// when there is a cache. A cache that was refused (`Err`) is reported in the [`Origin`].
pub fn fetch<E>(
    cache: Result<&KernelCache, &CacheError>,
    key: &str,
    build: impl FnOnce() -> Result<Vec<u8>, E>,
) -> Result<(Vec<u8>, Origin), E> {
    let cache = match cache {
        Ok(c) => c,
        Err(e) => return Ok((build()?, Origin::Uncached(e.clone()))),
    };
    if let Some(kernel) = cache.load(key) {
        return Ok((kernel, Origin::Cache));
    }
    let kernel = build()?;
    let origin = match cache.store(key, &kernel) {
        Ok(()) => Origin::Built,
        Err(e) => Origin::Uncached(e),
    };
    Ok((kernel, origin))
}

pub mod bundled;

#[cfg(test)]
mod tests;
