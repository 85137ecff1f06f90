//! Mutual proof of the job's token at the rendezvous.
//!
//! The token never travels. Each side sends a fresh 32-byte nonce (`getrandom`) and proves
//! that it knows the token with an HMAC-SHA256, keyed by the token, over
//!
//! ```text
//! "symm-bootstrap-v2" | role (1 root, 2 rank) | len(job) as u8 | job
//!   | rank u16 | world u16 | local rank u16 | rank's nonce | root's nonce
//! ```
//!
//! (integers little-endian). The root proves first, in its challenge, so that a rank sends
//! nothing derived from the token to a process that has not shown it knows it; the rank then
//! proves in its own turn. The role byte keeps one side's proof from being reflected as the
//! other's, the nonces keep an old proof from being replayed, and the rank, world and job bind
//! the proof to the claims it is made for. Proofs are checked in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::env::Token;
use super::sys;

/// Bytes of a nonce.
pub(crate) const NONCE: usize = 32;
/// Bytes of a proof (HMAC-SHA256).
pub(crate) const PROOF: usize = 32;

const CONTEXT: &[u8] = b"symm-bootstrap-v2";

/// Which side a proof speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Rank 0, which listens.
    Root = 1,
    /// Any other rank, which connects.
    Rank = 2,
}

/// What one rendezvous's proofs are made over: the rank's claims and both nonces.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transcript<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The rank the connecting process claims.
    pub rank: u16,
    /// Its world size.
    pub world: u16,
    /// Its local rank.
    pub local: u16,
    /// The connecting rank's nonce.
    pub rank_nonce: [u8; NONCE],
    /// The root's nonce.
    pub root_nonce: [u8; NONCE],
}

impl Transcript<'_> {
    fn mac(&self, token: &Token, role: Role) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; a token is 16 to 64 bytes.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token.bytes())
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(CONTEXT);
        m.update(&[role as u8]);
        // Job names are at most 64 bytes (`env::MAX_JOB`); the length keeps the fields apart.
        let job = self.job.as_bytes();
        m.update(&[job.len().min(255) as u8]);
        m.update(&job[..job.len().min(255)]);
        m.update(&self.rank.to_le_bytes());
        m.update(&self.world.to_le_bytes());
        m.update(&self.local.to_le_bytes());
        m.update(&self.rank_nonce);
        m.update(&self.root_nonce);
        m
    }

    /// `role`'s proof that it knows `token`.
    pub fn prove(&self, token: &Token, role: Role) -> [u8; PROOF] {
        self.mac(token, role).finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof for this transcript under `token` (constant time).
    pub fn verify(&self, token: &Token, role: Role, proof: &[u8]) -> bool {
        self.mac(token, role).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce from the kernel's random source.
pub(crate) fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    sys::random(&mut n)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(job: &str) -> Transcript<'_> {
        Transcript {
            job,
            rank: 3,
            world: 4,
            local: 3,
            rank_nonce: [1; NONCE],
            root_nonce: [2; NONCE],
        }
    }

    #[test]
    fn a_proof_holds_only_for_its_token_role_claims_and_nonces() {
        let token = Token::from_bytes(&[9; 32]).unwrap();
        let other = Token::from_bytes(&[8; 32]).unwrap();
        let base = t("job");
        let p = base.prove(&token, Role::Rank);
        assert!(base.verify(&token, Role::Rank, &p));
        // Another token, the other role (no reflection), a cut proof.
        assert!(!base.verify(&other, Role::Rank, &p));
        assert!(!base.verify(&token, Role::Root, &p));
        assert!(!base.verify(&token, Role::Rank, &p[..31]));
        assert!(!base.verify(&token, Role::Rank, &[]));
        // Any changed claim or nonce (no replay into another rendezvous).
        let changed = [
            Transcript { rank: 2, ..base },
            Transcript { world: 5, ..base },
            Transcript { local: 0, ..base },
            Transcript {
                rank_nonce: [3; NONCE],
                ..base
            },
            Transcript {
                root_nonce: [3; NONCE],
                ..base
            },
            t("jo"),
        ];
        for c in &changed {
            assert!(!c.verify(&token, Role::Rank, &p), "{c:?}");
        }
    }

    #[test]
    fn nonces_are_fresh() {
        let a = nonce().unwrap();
        let b = nonce().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, [0; NONCE]);
    }
}
