//! The job environment: who this process is in which job, read from variables.
//!
//! | variable | meaning | accepted |
//! |---|---|---|
//! | `RANK` | this process's rank | decimal, no sign or leading zero, below `WORLD_SIZE` |
//! | `WORLD_SIZE` | ranks in the job | decimal, 1 ..= [`MAX_WORLD`] |
//! | `LOCAL_RANK` | rank on this host (picks the GPU); `RANK` when unset | as `RANK` |
//! | `SYMM_JOB` | names the job (and its socket) | 1 to 64 of `A-Z a-z 0-9 . _ -` |
//! | `SYMM_TOKEN` | the job's secret | 32 to 128 hex digits (16 to 64 bytes) |
//!
//! torchrun sets the first three; `symm-run` sets all five. [`JobEnv::from_env`] removes
//! `SYMM_TOKEN` from the process's environment once it has read it. Under another launcher export a
//! unique `SYMM_JOB` and a fresh token (`od -An -tx1 -N32 /dev/urandom | tr -d ' \n'`) before it
//! starts the ranks. Every value is untrusted: anything else is a typed [`EnvError`] naming the
//! variable and showing at most [`SHOWN`] characters of the value, escaped.

use std::ffi::OsString;
use std::fmt;

use subtle::ConstantTimeEq;
use zeroize::Zeroize;

/// This process's rank.
pub const RANK: &str = "RANK";
/// Ranks in the job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// This process's rank on its host.
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// The job's name.
pub const SYMM_JOB: &str = "SYMM_JOB";
/// The job's secret token, in hex.
pub const SYMM_TOKEN: &str = "SYMM_TOKEN";

/// Largest world the bootstrap accepts (the schedules' limit).
pub const MAX_WORLD: u16 = symm_core::sched::MAX_WORLD;
/// Longest job name.
pub const MAX_JOB: usize = 64;
/// Shortest token, in bytes.
pub const MIN_TOKEN: usize = 16;
/// Longest token, in bytes.
pub const MAX_TOKEN: usize = 64;
/// Characters of a bad value an error shows.
pub const SHOWN: usize = 64;

/// Why the job environment cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EnvError {
    /// A required variable is not set.
    Missing {
        /// The variable.
        var: &'static str,
    },
    /// A variable holds something that does not parse.
    Malformed {
        /// The variable.
        var: &'static str,
        /// Its value, cut to [`SHOWN`] characters (not shown for the token).
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// `WORLD_SIZE` is 0 or above [`MAX_WORLD`].
    World {
        /// The value.
        value: u32,
    },
    /// `RANK` or `LOCAL_RANK` is not below `WORLD_SIZE`.
    Rank {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: u32,
        /// `WORLD_SIZE`.
        world: u16,
    },
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvError::Missing { var } => write!(f, "{var} is not set"),
            EnvError::Malformed {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?} is not {expected}"),
            EnvError::World { value } => {
                write!(f, "{WORLD_SIZE}={value} is not in 1..={MAX_WORLD}")
            }
            EnvError::Rank { var, value, world } => {
                write!(f, "{var}={value} is not below {WORLD_SIZE}={world}")
            }
        }
    }
}

impl std::error::Error for EnvError {}

/// At most [`SHOWN`] characters of a value, lossily decoded.
fn shown(value: &OsString) -> String {
    value.to_string_lossy().chars().take(SHOWN).collect()
}

/// A strict decimal: 1 to 5 ASCII digits, no sign, no spaces, no leading zero.
fn parse_count(var: &'static str, value: &OsString) -> Result<u32, EnvError> {
    let bad = || EnvError::Malformed {
        var,
        value: shown(value),
        expected: "a decimal number (digits only, no leading zero)",
    };
    let s = value.to_str().ok_or_else(bad)?;
    let b = s.as_bytes();
    if b.is_empty()
        || b.len() > 5
        || !b.iter().all(u8::is_ascii_digit)
        || (b.len() > 1 && b[0] == b'0')
    {
        return Err(bad());
    }
    s.parse().map_err(|_| bad())
}

/// A job name: 1 to [`MAX_JOB`] of `A-Z a-z 0-9 . _ -`.
pub fn parse_job(value: &OsString) -> Result<String, EnvError> {
    let s = value.to_str().unwrap_or("");
    let ok = !s.is_empty()
        && s.len() <= MAX_JOB
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(EnvError::Malformed {
            var: SYMM_JOB,
            value: shown(value),
            expected: "1 to 64 of A-Z a-z 0-9 . _ -",
        })
    }
}

/// A job's secret: never printed, never sent (the rendezvous proves knowledge of it with an
/// HMAC, see the bootstrap's `auth` module), compared in constant time, and wiped from memory on drop.
///
/// The bytes live in a fixed buffer of [`MAX_TOKEN`] bytes, so that a comparison runs over the
/// same bytes whatever the token's length.
#[derive(Clone)]
pub struct Token {
    buf: [u8; MAX_TOKEN],
    len: usize,
}

impl Drop for Token {
    fn drop(&mut self) {
        self.buf.zeroize();
        self.len.zeroize();
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({} bytes)", self.len)
    }
}

/// Constant time, as [`Token::matches`].
impl PartialEq for Token {
    fn eq(&self, other: &Token) -> bool {
        self.matches(other.bytes())
    }
}

impl Eq for Token {}

impl Token {
    /// A token from its hex form (`MIN_TOKEN..=MAX_TOKEN` bytes).
    pub fn from_hex(value: &OsString) -> Result<Token, EnvError> {
        let bad = || EnvError::Malformed {
            var: SYMM_TOKEN,
            // A near-miss secret is still a secret: never echoed.
            value: String::from("(hidden)"),
            expected: "32 to 128 hex digits",
        };
        let b = value.to_str().ok_or_else(bad)?.as_bytes();
        if !b.len().is_multiple_of(2) || b.len() < 2 * MIN_TOKEN || b.len() > 2 * MAX_TOKEN {
            return Err(bad());
        }
        let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut t = Token {
            buf: [0; MAX_TOKEN],
            len: b.len() / 2,
        };
        for (dst, p) in t.buf.iter_mut().zip(b.chunks_exact(2)) {
            *dst = digit(p[0])
                .zip(digit(p[1]))
                .map(|(hi, lo)| hi << 4 | lo)
                .ok_or_else(bad)?;
        }
        Ok(t)
    }

    /// A token from raw bytes; `None` unless `MIN_TOKEN..=MAX_TOKEN` long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Token> {
        if !(MIN_TOKEN..=MAX_TOKEN).contains(&bytes.len()) {
            return None;
        }
        let mut t = Token {
            buf: [0; MAX_TOKEN],
            len: bytes.len(),
        };
        t.buf[..bytes.len()].copy_from_slice(bytes);
        Some(t)
    }

    /// 32 fresh bytes from the kernel's random source.
    pub fn random() -> std::io::Result<Token> {
        let mut t = Token {
            buf: [0; MAX_TOKEN],
            len: 32,
        };
        super::sys::random(&mut t.buf[..32])?;
        Ok(t)
    }

    /// The hex form (what `SYMM_TOKEN` holds). The string is a copy the caller should keep short.
    pub fn to_hex(&self) -> String {
        self.bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Whether `other` equals this token, lengths included, in time independent of the token's
    /// bytes and length and of where they differ (it depends only on `other`'s length).
    pub fn matches(&self, other: &[u8]) -> bool {
        if other.len() > MAX_TOKEN {
            return false;
        }
        let mut same = self.len.ct_eq(&other.len());
        for (i, &a) in self.buf.iter().enumerate() {
            // Past `other`'s end, compare with zero; the length check above decides then.
            let b = other.get(i).copied().unwrap_or(0);
            same &= a.ct_eq(&b);
        }
        same.into()
    }
}

/// Who this process is in which job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEnv {
    /// This process's rank.
    pub rank: u16,
    /// Ranks in the job.
    pub world: u16,
    /// Rank on this host.
    pub local_rank: u16,
    /// The job's name.
    pub job: String,
    /// The job's secret.
    pub token: Token,
}

impl JobEnv {
    /// Reads the process environment, then removes `SYMM_TOKEN` from it (whether or not the
    /// environment parsed), so that the programs this process starts do not inherit the job's
    /// secret. The other variables stay.
    ///
    /// Rust's own environment accesses are serialised by the standard library, so removing a
    /// variable is safe against them; it is not against C code that reads the environment on
    /// another thread at the same moment (`getenv` in a native library). Call this at the
    /// start of a rank, before such threads run, as `SocketBootstrap::from_env` and the CUDA
    /// `Comm::from_env` (which joins before it touches the driver) do. The launcher's copy of
    /// the token, and `/proc/<pid>/environ` (the environment as the process started), are not
    /// affected.
    pub fn from_env() -> Result<JobEnv, EnvError> {
        let job = Self::from_vars(|k| std::env::var_os(k));
        std::env::remove_var(SYMM_TOKEN);
        job
    }

    /// Reads variables through `get` (tests pass a map).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Result<JobEnv, EnvError> {
        let need = |var: &'static str| get(var).ok_or(EnvError::Missing { var });
        let world = parse_count(WORLD_SIZE, &need(WORLD_SIZE)?)?;
        if world == 0 || world > MAX_WORLD as u32 {
            return Err(EnvError::World { value: world });
        }
        let world = world as u16;
        let rank_of = |var: &'static str, value: &OsString| {
            let r = parse_count(var, value)?;
            if r >= world as u32 {
                return Err(EnvError::Rank {
                    var,
                    value: r,
                    world,
                });
            }
            Ok(r as u16)
        };
        let rank = rank_of(RANK, &need(RANK)?)?;
        let local_rank = match get(LOCAL_RANK) {
            Some(v) => rank_of(LOCAL_RANK, &v)?,
            None => rank,
        };
        let job = parse_job(&need(SYMM_JOB)?)?;
        let token = Token::from_hex(&need(SYMM_TOKEN)?)?;
        Ok(JobEnv {
            rank,
            world,
            local_rank,
            job,
            token,
        })
    }

    /// The root's socket name in the abstract namespace: `symm-<job>-<uid>`.
    pub fn socket_name(&self, uid: u32) -> String {
        socket_name(&self.job, uid)
    }
}

/// The root's socket name for `job` run by `uid`.
pub fn socket_name(job: &str, uid: u32) -> String {
    format!("symm-{job}-{uid}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const TOKEN: &str = "00112233445566778899aabbccddeeff";

    fn env(pairs: &[(&str, &str)]) -> Result<JobEnv, EnvError> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        JobEnv::from_vars(|k| m.get(k).cloned())
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            (RANK, "2"),
            (WORLD_SIZE, "4"),
            (LOCAL_RANK, "1"),
            (SYMM_JOB, "train-7.a_b"),
            (SYMM_TOKEN, TOKEN),
        ]
    }

    fn with(var: &'static str, value: &str) -> Result<JobEnv, EnvError> {
        let value: &'static str = Box::leak(value.to_string().into_boxed_str());
        let mut v = base();
        v.retain(|(k, _)| *k != var);
        v.push((var, value));
        env(&v)
    }

    fn without(var: &'static str) -> Result<JobEnv, EnvError> {
        let mut v = base();
        v.retain(|(k, _)| *k != var);
        env(&v)
    }

    #[test]
    fn a_good_environment_parses() {
        let j = env(&base()).unwrap();
        assert_eq!((j.rank, j.world, j.local_rank), (2, 4, 1));
        assert_eq!(j.job, "train-7.a_b");
        assert_eq!(j.token.to_hex(), TOKEN);
        assert_eq!(j.socket_name(1000), "symm-train-7.a_b-1000");
        assert_eq!(format!("{:?}", j.token), "Token(16 bytes)");
        assert_eq!(without(LOCAL_RANK).unwrap().local_rank, 2);
        assert_eq!(with(WORLD_SIZE, "1024").unwrap().world, 1024);
        assert_eq!(with(RANK, "0").unwrap().rank, 0);
    }

    #[test]
    fn missing_variables_are_named() {
        for var in [RANK, WORLD_SIZE, SYMM_JOB, SYMM_TOKEN] {
            assert_eq!(without(var), Err(EnvError::Missing { var }), "{var}");
        }
    }

    #[test]
    fn numbers_are_strict() {
        for bad in [
            "", "-1", "+1", " 1", "1 ", "01", "1e2", "0x1", "123456", "½", "1\n",
        ] {
            let e = with(RANK, bad).unwrap_err();
            assert!(
                matches!(e, EnvError::Malformed { var: RANK, .. }),
                "{bad:?}: {e:?}"
            );
        }
        assert_eq!(with(WORLD_SIZE, "0"), Err(EnvError::World { value: 0 }));
        assert_eq!(
            with(WORLD_SIZE, "1025"),
            Err(EnvError::World { value: 1025 })
        );
        assert_eq!(
            with(RANK, "4"),
            Err(EnvError::Rank {
                var: RANK,
                value: 4,
                world: 4
            })
        );
        assert_eq!(
            with(LOCAL_RANK, "9"),
            Err(EnvError::Rank {
                var: LOCAL_RANK,
                value: 9,
                world: 4
            })
        );
    }

    #[test]
    fn bad_values_are_cut_and_escaped() {
        let e = with(RANK, &"x".repeat(10_000)).unwrap_err();
        let text = e.to_string();
        assert!(text.len() < 200, "{text}");
        let e = with(SYMM_JOB, "a/b\u{1b}[31m").unwrap_err();
        assert!(e.to_string().contains("\\u{1b}"), "{e}");
        for bad in ["", "a b", "../x", "a/b", "é"] {
            assert!(matches!(
                with(SYMM_JOB, bad),
                Err(EnvError::Malformed { var: SYMM_JOB, .. })
            ));
        }
        assert!(with(SYMM_JOB, &"j".repeat(64)).is_ok());
        assert!(with(SYMM_JOB, &"j".repeat(65)).is_err());
    }

    #[test]
    fn tokens_are_hex_of_bounded_length_and_never_shown() {
        for bad in [
            "",
            "0011",
            &TOKEN[1..],
            "zz112233445566778899aabbccddeeff",
            &"ab".repeat(65),
        ] {
            let e = with(SYMM_TOKEN, bad).unwrap_err();
            assert!(matches!(
                e,
                EnvError::Malformed {
                    var: SYMM_TOKEN,
                    ..
                }
            ));
            assert!(!e.to_string().contains("0011"), "{e}");
        }
        assert!(with(SYMM_TOKEN, "AABBCCDDEEFF00112233445566778899").is_ok());
        let t = Token::random().unwrap();
        assert_eq!(Token::from_hex(&t.to_hex().into()).unwrap(), t);
        assert!(t.matches(t.bytes()));
        let mut other = t.bytes().to_vec();
        other[31] ^= 1;
        assert!(!t.matches(&other));
        assert!(!t.matches(&other[..16]));
        assert!(Token::from_bytes(&[0; 15]).is_none());
        // Lengths count: a prefix, a zero-padded extension, or more than the largest token.
        let short = Token::from_bytes(&[5; 16]).unwrap();
        assert!(!short.matches(&[5; 17]));
        assert!(!short.matches(&[5; 15]));
        let mut padded = vec![5u8; 16];
        padded.push(0);
        assert!(!short.matches(&padded));
        assert!(!short.matches(&[5; 200]));
        assert_ne!(short, Token::from_bytes(&padded).unwrap());
        assert_eq!(short.clone(), short);
        assert_eq!(Token::from_hex(&"05".repeat(16).into()).unwrap(), short);
    }
}
