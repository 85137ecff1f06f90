use super::*;
use std::cell::Cell;
use std::os::unix::fs::PermissionsExt;

/// A fresh folder under the temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "symm-kc-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        DirBuilder::new().mode(0o700).create(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn me() -> u32 {
    euid().unwrap()
}

#[test]
fn euid_parses_the_effective_field() {
    let status = "Name:\tx\nUmask:\t0022\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\n";
    assert_eq!(parse_euid(status), Some(1001));
    assert_eq!(parse_euid("Name:\tx\n"), None);
    assert!(euid().is_ok());
}

#[test]
fn folder_choice_prefers_explicit_then_xdg_then_home_then_a_per_user_temp_folder() {
    let p = |s: &str| Some(PathBuf::from(s));
    let tmp = PathBuf::from("/tmp");
    assert_eq!(
        choose_dir(p("/c"), p("/x"), p("/h"), tmp.clone(), 7),
        PathBuf::from("/c")
    );
    assert_eq!(
        choose_dir(None, p("/x"), p("/h"), tmp.clone(), 7),
        PathBuf::from("/x/symm/kernels")
    );
    assert_eq!(
        choose_dir(None, p("rel"), p("/h"), tmp.clone(), 7),
        PathBuf::from("/h/.cache/symm/kernels")
    );
    assert_eq!(
        choose_dir(None, None, p(""), tmp.clone(), 7),
        PathBuf::from("/tmp/symm-kernels-7")
    );
}

#[test]
fn a_missing_folder_is_created_private() {
    let s = Scratch::new("create");
    let dir = s.0.join("a/b/kernels");
    let c = KernelCache::open(&dir).unwrap();
    for d in [s.0.join("a"), s.0.join("a/b"), dir.clone()] {
        let mode = std::fs::metadata(&d).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", d.display());
    }
    assert_eq!(c.dir(), std::fs::canonicalize(&dir).unwrap());
}

#[test]
fn a_world_writable_folder_is_refused() {
    let s = Scratch::new("0777");
    let dir = s.0.join("kernels");
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o777);
    let e = KernelCache::open(&dir).unwrap_err();
    assert!(
        matches!(e, CacheError::Writable { ref path, mode: 0o777 } if path.ends_with("kernels")),
        "{e}"
    );
    chmod(&dir, 0o770);
    assert!(matches!(
        KernelCache::open(&dir),
        Err(CacheError::Writable { .. })
    ));
    chmod(&dir, 0o700);
    assert!(KernelCache::open(&dir).is_ok());
}

#[test]
fn a_writable_folder_above_is_refused_unless_sticky() {
    let s = Scratch::new("parent");
    let parent = s.0.join("shared");
    let dir = parent.join("kernels");
    std::fs::create_dir_all(&dir).unwrap();
    chmod(&dir, 0o700);
    chmod(&parent, 0o777);
    let e = KernelCache::open(&dir).unwrap_err();
    assert!(
        matches!(e, CacheError::Writable { ref path, .. } if path.ends_with("shared")),
        "{e}"
    );
    chmod(&parent, 0o1777);
    assert!(KernelCache::open(&dir).is_ok());
}

#[test]
fn a_folder_of_another_user_is_refused() {
    let s = Scratch::new("owner");
    let dir = s.0.join("kernels");
    let other = me().wrapping_add(4242);
    let e = KernelCache::open_as(&dir, other).unwrap_err();
    assert!(
        matches!(e, CacheError::NotOwned { owner, uid, .. } if owner == me() && uid == other),
        "{e}"
    );
}

#[test]
fn a_symlink_is_resolved_and_its_target_checked() {
    let s = Scratch::new("link");
    let open = s.0.join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let link = s.0.join("kernels");
    std::os::unix::fs::symlink(&open, &link).unwrap();
    assert!(matches!(
        KernelCache::open(&link),
        Err(CacheError::Writable { .. })
    ));
    chmod(&open, 0o700);
    let c = KernelCache::open(&link).unwrap();
    assert_eq!(c.dir(), std::fs::canonicalize(&open).unwrap());
}

#[test]
fn a_file_is_not_a_folder() {
    let s = Scratch::new("file");
    let f = s.0.join("kernels");
    std::fs::write(&f, b"x").unwrap();
    assert!(KernelCache::open(&f).is_err());
}

#[test]
fn encode_decode_round_trip_and_reject_changes() {
    let kernel = b"\x7fELF pretend cubin".to_vec();
    let file = encode("k.cubin", &kernel);
    assert_eq!(decode("k.cubin", &file), Some(&kernel[..]));
    // Another key (a renamed file) does not match.
    assert_eq!(decode("other.cubin", &file), None);
    // Any flipped byte, in the magic, the hash or the kernel, is caught.
    for i in 0..file.len() {
        let mut bad = file.clone();
        bad[i] ^= 1;
        assert_eq!(decode("k.cubin", &bad), None, "byte {i}");
    }
    // Truncations and a bare kernel without the header are caught.
    for n in 0..file.len() {
        assert_eq!(decode("k.cubin", &file[..n]), None, "length {n}");
    }
    assert_eq!(decode("k.cubin", &kernel), None);
}

#[test]
fn store_writes_a_private_file_and_load_reads_it_back() {
    let s = Scratch::new("store");
    let c = KernelCache::open(&s.0.join("k")).unwrap();
    c.store("a.cubin", b"kernel bytes").unwrap();
    let m = std::fs::metadata(c.dir().join("a.cubin")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(c.load("a.cubin").as_deref(), Some(&b"kernel bytes"[..]));
    assert_eq!(c.load("missing.cubin"), None);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(c.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("a.cubin")]);
}

#[test]
fn keys_must_be_plain_file_names() {
    let s = Scratch::new("keys");
    let c = KernelCache::open(&s.0.join("k")).unwrap();
    for key in ["", "../x", "a/b", ".hidden", "a\0b", "a b"] {
        assert!(
            matches!(c.store(key, b"x"), Err(CacheError::BadKey(_))),
            "{key:?}"
        );
        assert_eq!(c.load(key), None);
    }
}

#[test]
fn a_planted_or_altered_file_is_not_loaded() {
    let s = Scratch::new("plant");
    let c = KernelCache::open(&s.0.join("k")).unwrap();
    let path = c.dir().join("a.cubin");
    // A raw cubin without the header (what an older cache or another program would leave).
    std::fs::write(&path, b"\x7fELF planted").unwrap();
    assert_eq!(c.load("a.cubin"), None);
    assert!(!path.exists(), "the bad file is removed");
    // A good file made writable by others is not trusted.
    c.store("a.cubin", b"good").unwrap();
    chmod(&path, 0o666);
    assert_eq!(c.load("a.cubin"), None);
    chmod(&path, 0o600);
    assert_eq!(c.load("a.cubin").as_deref(), Some(&b"good"[..]));
    // A file of another user is not trusted.
    let other = KernelCache {
        dir: c.dir().into(),
        uid: me().wrapping_add(4242),
    };
    assert_eq!(other.load("a.cubin"), None);
}

#[test]
fn fetch_builds_once_then_loads_and_rebuilds_on_a_hash_mismatch() {
    let s = Scratch::new("fetch");
    let c = KernelCache::open(&s.0.join("k")).unwrap();
    let builds = Cell::new(0);
    let build = || -> Result<Vec<u8>, String> {
        builds.set(builds.get() + 1);
        Ok(b"\x7fELF compiled".to_vec())
    };
    let (k, o) = fetch(Ok(&c), "v.cubin", build).unwrap();
    assert_eq!(
        (k.as_slice(), o, builds.get()),
        (&b"\x7fELF compiled"[..], Origin::Built, 1)
    );
    let (k, o) = fetch(Ok(&c), "v.cubin", build).unwrap();
    assert_eq!(
        (k.as_slice(), o, builds.get()),
        (&b"\x7fELF compiled"[..], Origin::Cache, 1)
    );

    // Change one byte of the stored kernel: it is not loaded, the kernel is rebuilt and stored.
    let path = c.dir().join("v.cubin");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let (k, o) = fetch(Ok(&c), "v.cubin", build).unwrap();
    assert_eq!(
        (k.as_slice(), o, builds.get()),
        (&b"\x7fELF compiled"[..], Origin::Built, 2)
    );
    let (_, o) = fetch(Ok(&c), "v.cubin", build).unwrap();
    assert_eq!((o, builds.get()), (Origin::Cache, 2));
}

#[test]
fn fetch_without_a_cache_builds_and_says_why() {
    let refused = CacheError::Writable {
        path: "/x".into(),
        mode: 0o777,
    };
    let (k, o) = fetch(Err(&refused), "v.cubin", || Ok::<_, String>(b"k".to_vec())).unwrap();
    assert_eq!((k.as_slice(), o), (&b"k"[..], Origin::Uncached(refused)));
    let e = fetch(Err(&CacheError::NoUid("x".into())), "v.cubin", || {
        Err::<Vec<u8>, _>("compile failed")
    });
    assert_eq!(e, Err("compile failed"));
}
