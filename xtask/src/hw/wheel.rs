//! NVRTC for the kernel check: the pinned `nvidia-cuda-nvrtc-cu12` wheel, checked by SHA-256.
//!
//! The wheel is fetched with pip (`pip download`, no dependencies, binary only), else with
//! Python's standard library from the simple index (`$PIP_INDEX_URL`, default PyPI). Either way
//! the file must be the pinned one and its SHA-256 must match [`PIN`] before it is unzipped into
//! `target/nvrtc-wheel`; a mismatch is refused and the file removed. A stamp holding the hash
//! marks a finished install, so a folder from an older, unchecked install is replaced.

use std::path::{Path, PathBuf};
use symm_driver::safety_env;

use sha2::{Digest, Sha256};

use crate::util;

/// A wheel pinned by file name and SHA-256.
pub struct Pin {
    /// The distribution name.
    pub name: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The wheel's file name.
    pub file: &'static str,
    /// Lower-case hex SHA-256 of the wheel.
    pub sha256: &'static str,
}

/// The NVRTC wheel CI compiles with (known to work on a CPU machine), linux x86-64.
pub const PIN: Pin = Pin {
    name: "nvidia-cuda-nvrtc-cu12",
    version: "12.9.86",
    file: "nvidia_cuda_nvrtc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl",
    sha256: "210cf05005a447e29214e9ce50851e83fc5f4358df8b453155d5e1918094dcb4",
};

/// Downloads the file named `argv[3]` of distribution `argv[1]` (version `argv[2]`) from the
/// simple index to the path `argv[4]`, with the standard library alone.
const FETCH_PY: &str = r##"
import os, re, ssl, sys, urllib.parse, urllib.request
name, version, file, dest = sys.argv[1:5]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
cafile = os.environ.get("PIP_CERT")
ctx = ssl.create_default_context(cafile=cafile) if cafile else None
page_url = f"{index}/{name}/"
page = urllib.request.urlopen(page_url, timeout=60, context=ctx).read().decode()
links = [h.split("#")[0] for h in re.findall(r'href="([^"]+)"', page)]
links = [h for h in links if urllib.parse.unquote(h.rsplit("/", 1)[-1]) == file]
if not links:
    sys.exit(f"no {file} at {page_url}")
url = urllib.parse.urljoin(page_url, links[0])
with urllib.request.urlopen(url, timeout=300, context=ctx) as r, open(dest, "wb") as f:
    while True:
        block = r.read(1 << 20)
        if not block:
            break
        f.write(block)
"##;

/// The lower-case hex SHA-256 of a file.
pub fn file_sha256(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            return Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect());
        }
        h.update(&buf[..n]);
    }
}

/// Accepts `path` only when its SHA-256 is `expected`; a mismatching file is removed.
pub fn verify(path: &Path, expected: &str) -> Result<(), String> {
    let got = file_sha256(path)?;
    // The pin is public: a plain comparison.
    if got == expected.to_ascii_lowercase() {
        return Ok(());
    }
    let _ = std::fs::remove_file(path);
    Err(format!(
        "{}: SHA-256 {got} does not match the pinned {expected}; refused and removed",
        path.display()
    ))
}

/// Checks `wheel` against `pin`, then unzips it with `python` into `dir` (replacing it) and
/// writes the stamp. Nothing is unzipped when the hash does not match.
pub fn install(python: &str, wheel: &Path, pin: &Pin, dir: &Path) -> Result<(), String> {
    if wheel.file_name().and_then(|n| n.to_str()) != Some(pin.file) {
        return Err(format!("{} is not {}", wheel.display(), pin.file));
    }
    verify(wheel, pin.sha256)?;
    let staging = dir.with_extension("staging");
    let _ = std::fs::remove_dir_all(&staging);
    let out = safety_env::command(python)
        .args(["-m", "zipfile", "-e"])
        .arg(wheel)
        .arg(&staging)
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{python} -m zipfile: {}", stderr(&out)));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&staging, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(stamp(dir), pin.sha256).map_err(|e| format!("{}: {e}", dir.display()))
}

fn stamp(dir: &Path) -> PathBuf {
    dir.join(".wheel-sha256")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

/// Removes the downloaded wheel once it is unpacked.
fn finished(downloads: &Path, lib: PathBuf) -> Result<PathBuf, String> {
    let _ = std::fs::remove_dir_all(downloads);
    Ok(lib)
}

/// libnvrtc.so.12 from the pinned wheel, installed into target/nvrtc-wheel when missing.
pub fn nvrtc() -> Result<PathBuf, String> {
    let dir = util::target_dir().join("nvrtc-wheel");
    let lib = dir.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    let stamped = std::fs::read_to_string(stamp(&dir)).is_ok_and(|s| s.trim() == PIN.sha256);
    if stamped && lib.exists() {
        return Ok(lib);
    }
    if !(cfg!(target_os = "linux") && cfg!(target_arch = "x86_64")) {
        return Err(format!(
            "{} is pinned for linux x86-64 only; point the kernel check at an NVRTC by hand",
            PIN.file
        ));
    }
    let downloads = util::target_dir().join("nvrtc-wheel.download");
    let _ = std::fs::remove_dir_all(&downloads);
    std::fs::create_dir_all(&downloads).map_err(|e| format!("{}: {e}", downloads.display()))?;
    let wheel = downloads.join(PIN.file);
    let spec = format!("{}=={}", PIN.name, PIN.version);
    let mut tried = Vec::new();
    for py in ["python3", "python"] {
        let pip = safety_env::command(py)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-deps", "--only-binary=:all:", "--dest"])
            .arg(&downloads)
            .arg(&spec)
            .output();
        match pip {
            Ok(o) if o.status.success() && wheel.exists() => {
                match install(py, &wheel, &PIN, &dir) {
                    Ok(()) if lib.exists() => return finished(&downloads, lib),
                    Ok(()) => tried.push(format!("{py} -m pip: no {}", lib.display())),
                    Err(e) => tried.push(format!("{py} -m pip: {e}")),
                }
            }
            Ok(o) if o.status.success() => {
                tried.push(format!("{py} -m pip: did not fetch {}", PIN.file))
            }
            Ok(o) => tried.push(format!("{py} -m pip: {}", stderr(&o))),
            Err(e) => tried.push(format!("{py}: {e}")),
        }
        let _ = std::fs::remove_file(&wheel);
        let fetch = safety_env::command(py)
            .args(["-c", FETCH_PY, PIN.name, PIN.version, PIN.file])
            .arg(&wheel)
            .output();
        match fetch {
            Ok(o) if o.status.success() => match install(py, &wheel, &PIN, &dir) {
                Ok(()) if lib.exists() => return finished(&downloads, lib),
                Ok(()) => tried.push(format!("{py} download: no {}", lib.display())),
                Err(e) => tried.push(format!("{py} download: {e}")),
            },
            Ok(o) => tried.push(format!("{py} download: {}", stderr(&o))),
            Err(e) => tried.push(format!("{py}: {e}")),
        }
    }
    Err(format!(
        "could not install {spec} for the kernel check:\n  {}",
        tried.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("symm-wheel-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_pin_is_a_well_formed_digest_of_a_linux_x86_64_wheel() {
        assert_eq!(PIN.sha256.len(), 64);
        assert!(PIN.sha256.bytes().all(|b| b"0123456789abcdef".contains(&b)));
        assert!(PIN.file.ends_with("_x86_64.whl"));
        assert!(PIN
            .file
            .starts_with(&format!("{}-{}-", PIN.name.replace('-', "_"), PIN.version)));
    }

    #[test]
    fn a_file_with_the_pinned_hash_is_accepted_and_any_other_refused_and_removed() {
        let d = scratch("verify");
        let f = d.join("x.whl");
        std::fs::write(&f, b"abc").unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(file_sha256(&f).unwrap(), abc);
        verify(&f, abc).unwrap();
        verify(&f, &abc.to_ascii_uppercase()).unwrap();
        let e = verify(&f, PIN.sha256).unwrap_err();
        assert!(e.contains("does not match"), "{e}");
        assert!(!f.exists(), "a mismatching download is removed");
        assert!(verify(&d.join("missing.whl"), abc).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_fake_wheel_under_the_pinned_name_is_not_installed() {
        let d = scratch("install");
        let wheel = d.join(PIN.file);
        std::fs::write(&wheel, b"PK\x03\x04 not the real wheel").unwrap();
        let dir = d.join("nvrtc-wheel");
        let e = install("python3", &wheel, &PIN, &dir).unwrap_err();
        assert!(e.contains("does not match the pinned"), "{e}");
        assert!(!dir.exists() && !stamp(&dir).exists() && !wheel.exists());
        // A file under another name is refused before it is even read.
        let other = d.join("other.whl");
        std::fs::write(&other, b"x").unwrap();
        assert!(install("python3", &other, &PIN, &dir).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
