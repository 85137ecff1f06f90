//! The lost-peer arm: how a watcher thread raises an abort word that its owner may free.
//!
//! When a peer's process dies, the bootstrap's watcher thread raises this rank's abort word, a
//! word of host-mapped memory that every device wait polls, so kernels stop at their next wait.
//! The word belongs to the `Comm`, which may be dropping at that moment. [`Arm`] makes the two
//! meet safely:
//!
//! * the watcher's callback raises the target while holding the arm's lock, and only while the
//!   arm still holds the target;
//! * the owner's [`Arm::disarm`] takes the target out under the same lock.
//!
//! So once `disarm` returns, no raise is running or will start, and the arm holds no reference
//! that could keep the target (and the context it was allocated in) alive past its owner. The
//! raise itself is an atomic store. `driver/tests/loom.rs` checks this under every interleaving.

use crate::sync::{Arc, Mutex};

/// Something a watcher raises (the abort word).
pub trait Raise: Send + Sync {
    /// Raises it.
    fn raise(&self);
}

/// The shared slot between an owner and the watcher's callback.
pub struct Arm<T: Raise> {
    slot: Arc<Mutex<Option<Arc<T>>>>,
}

impl<T: Raise + 'static> Arm<T> {
    /// An arm holding `target`.
    pub fn new(target: Arc<T>) -> Arm<T> {
        Arm {
            slot: Arc::new(Mutex::new(Some(target))),
        }
    }

    /// The callback to give the watcher: raises the target while the arm holds it.
    pub fn callback(&self) -> impl Fn(u16) + Send + Sync + 'static {
        let slot = self.slot.clone();
        move |_lost| {
            let held = slot.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = held.as_ref() {
                t.raise();
            }
        }
    }

    /// Takes the target out: after this returns no raise runs, and the arm keeps no reference.
    pub fn disarm(&self) {
        let mut held = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        *held = None;
    }
}

impl<T: Raise> Drop for Arm<T> {
    fn drop(&mut self) {
        let mut held = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        *held = None;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    struct Word {
        raised: AtomicU32,
        freed: Arc<AtomicBool>,
    }

    impl Raise for Word {
        fn raise(&self) {
            assert!(
                !self.freed.load(Ordering::SeqCst),
                "raised after it was freed"
            );
            self.raised.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Drop for Word {
        fn drop(&mut self) {
            self.freed.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn no_raise_after_disarm_and_the_target_goes_with_its_owner() {
        for _ in 0..200 {
            let freed = Arc::new(AtomicBool::new(false));
            let word = Arc::new(Word {
                raised: AtomicU32::new(0),
                freed: freed.clone(),
            });
            let arm = Arm::new(word.clone());
            let cb = arm.callback();
            let watcher = std::thread::spawn(move || {
                for _ in 0..100 {
                    cb(1);
                }
            });
            assert!(word.raised.load(Ordering::SeqCst) <= 100);
            arm.disarm();
            // The owner drops its word: the arm held the only other reference.
            drop(word);
            assert!(freed.load(Ordering::SeqCst), "the arm kept the word alive");
            watcher.join().unwrap();
        }
    }
}
