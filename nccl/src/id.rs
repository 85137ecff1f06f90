//! symm's half of `ncclUniqueId`.
//!
//! NCCL's id is 128 opaque bytes that rank 0 draws and the application hands every rank. NCCL
//! 2.x fills the first part (its bootstrap's magic and address) and leaves the tail zero. The
//! shim's `ncclGetUniqueId` draws the real id, then writes a job of its own into the tail
//! ([`TAIL`]): a magic, the job's name and its 32-byte secret. `ncclCommInitRank` reads the
//! job back, zeroes the tail again and hands the real library exactly the id it drew.
//!
//! An id whose tail is not a job (drawn by a process without the shim, or by a library that
//! uses the whole id) is not an error: that communicator runs on NCCL alone. Every rank reads
//! the same id, so every rank decides the same.

use symm_driver::bootstrap::Token;

/// Bytes of `ncclUniqueId`.
pub const ID_BYTES: usize = 128;
/// The range of the id that holds symm's job.
pub const TAIL: core::ops::Range<usize> = 64..128;
const MAGIC: [u8; 8] = *b"symmncl1";
const NAME: core::ops::Range<usize> = 8..32;
const SECRET: core::ops::Range<usize> = 32..64;
/// The job name's prefix (the rest is 16 hex digits).
const PREFIX: &str = "nccl-";

/// A job symm's ranks meet in: the bootstrap's name and secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The job's name (`nccl-` and 16 hex digits).
    pub name: String,
    /// The job's secret (32 bytes).
    pub token: Token,
}

/// Why an id's tail is not a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdError {
    /// The tail does not start with the shim's magic: not drawn by the shim.
    NotOurs,
    /// The magic is there but the name is not `nccl-` and 16 hex digits.
    BadName,
    /// The real library's id reaches into the tail: there is no room for symm's job.
    NoRoom,
}

impl core::fmt::Display for IdError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            IdError::NotOurs => "the id was not drawn by symm's NCCL shim",
            IdError::BadName => "the id names no valid job",
            IdError::NoRoom => "the real NCCL id uses the bytes symm's job needs",
        })
    }
}

impl std::error::Error for IdError {}

impl Job {
    /// A fresh job: a random name and secret from the kernel's random source.
    pub fn fresh() -> std::io::Result<Job> {
        let name = Token::random()?;
        let token = Token::random()?;
        let hex: String = name.bytes()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(Job {
            name: format!("{PREFIX}{hex}"),
            token,
        })
    }

    /// Writes this job into the tail of `id`, which must be zero there (the real library
    /// leaves it so); else [`IdError::NoRoom`] and `id` is unchanged.
    pub fn write(&self, id: &mut [u8; ID_BYTES]) -> Result<(), IdError> {
        if id[TAIL].iter().any(|&b| b != 0) {
            return Err(IdError::NoRoom);
        }
        let secret = self.token.bytes();
        if !valid_name(&self.name) || secret.len() != SECRET.len() {
            return Err(IdError::BadName);
        }
        let tail = &mut id[TAIL];
        tail[..8].copy_from_slice(&MAGIC);
        tail[NAME][..self.name.len()].copy_from_slice(self.name.as_bytes());
        tail[SECRET].copy_from_slice(secret);
        Ok(())
    }

    /// The job in the tail of `id`, and `id` with its tail zeroed (what the real library
    /// drew). Total: any 128 bytes give a job or an [`IdError`].
    pub fn read(id: &[u8; ID_BYTES]) -> (Result<Job, IdError>, [u8; ID_BYTES]) {
        let mut real = *id;
        let tail = &id[TAIL];
        if tail[..8] != MAGIC {
            return (Err(IdError::NotOurs), real);
        }
        real[TAIL].fill(0);
        let raw = &tail[NAME];
        let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let padded = raw[len..].iter().all(|&b| b == 0);
        let job = core::str::from_utf8(&raw[..len])
            .ok()
            .filter(|_| padded)
            .filter(|n| valid_name(n))
            .zip(Token::from_bytes(&tail[SECRET]))
            .map(|(name, token)| Job {
                name: name.to_string(),
                token,
            })
            .ok_or(IdError::BadName);
        (job, real)
    }
}

/// `nccl-` and 16 lowercase hex digits.
fn valid_name(n: &str) -> bool {
    n.strip_prefix(PREFIX).is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real_like() -> [u8; ID_BYTES] {
        let mut id = [0u8; ID_BYTES];
        for (i, b) in id[..40].iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        id
    }

    #[test]
    fn a_job_round_trips_and_the_real_id_comes_back_unchanged() {
        let job = Job::fresh().unwrap();
        let mut id = real_like();
        job.write(&mut id).unwrap();
        let (back, real) = Job::read(&id);
        assert_eq!(back, Ok(job));
        assert_eq!(real, real_like());
    }

    #[test]
    fn two_fresh_jobs_differ() {
        let (a, b) = (Job::fresh().unwrap(), Job::fresh().unwrap());
        assert_ne!(a.name, b.name);
        assert_ne!(a.token, b.token);
    }

    #[test]
    fn an_id_without_the_magic_is_left_to_nccl_untouched() {
        let (job, real) = Job::read(&real_like());
        assert_eq!(job, Err(IdError::NotOurs));
        assert_eq!(real, real_like());
    }

    #[test]
    fn a_real_id_that_fills_the_tail_is_not_overwritten() {
        let mut id = [7u8; ID_BYTES];
        assert_eq!(Job::fresh().unwrap().write(&mut id), Err(IdError::NoRoom));
        assert_eq!(id, [7u8; ID_BYTES]);
    }

    #[test]
    fn hostile_tails_are_refused_without_panic() {
        let mut id = real_like();
        Job::fresh().unwrap().write(&mut id).unwrap();
        for (at, v) in [
            (72, b'/'),
            (77, 0xff),
            (72 + 20, b'G'),
            (72 + 23, b'a'),
            (75, 0),
        ] {
            let mut bad = id;
            bad[at] = v;
            let (job, real) = Job::read(&bad);
            assert_eq!(job, Err(IdError::BadName), "byte {at} = {v}");
            assert!(real[TAIL].iter().all(|&b| b == 0));
        }
        // Every byte value at every tail position: a job or a typed error, never a panic.
        for at in TAIL {
            for v in [0u8, 1, b'0', b'f', 0x80, 0xff] {
                let mut any = id;
                any[at] = v;
                let _ = Job::read(&any);
            }
        }
    }
}
