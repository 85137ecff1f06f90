//! The multicast budget: how many multicast objects, and how many bytes of them, this process
//! may hold.
//!
//! Multicast objects live in the NVSwitches, which have room for few of them; running out has
//! crashed other libraries. Every object holds a reservation against the process's ledger from
//! before its first driver call until its release succeeded, so exceeding the budget is a typed
//! error before the driver is asked for anything, and a released object returns what it held.
//!
//! The process's budget is [`McBudget::DEFAULT`], or `SYMM_MULTICAST_MAX_OBJECTS` /
//! `SYMM_MULTICAST_MAX_BYTES` (plain decimal numbers; anything else refuses every creation with
//! [`McError::BadSetting`]), or what the program sets with [`set_budget`], which wins.

use std::ffi::OsString;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::error::McError;

/// The variable that sets [`McBudget::max_objects`].
pub const ENV_MAX_OBJECTS: &str = "SYMM_MULTICAST_MAX_OBJECTS";
/// The variable that sets [`McBudget::max_bytes`].
pub const ENV_MAX_BYTES: &str = "SYMM_MULTICAST_MAX_BYTES";

/// How many multicast objects, and how many bytes of them, a process may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McBudget {
    /// Objects held at once.
    pub max_objects: u32,
    /// Bytes held at once (the sum of the objects' sizes).
    pub max_bytes: u64,
}

impl McBudget {
    /// The default: one object of at most 1 GiB.
    pub const DEFAULT: McBudget = McBudget {
        max_objects: 1,
        max_bytes: 1 << 30,
    };

    /// The default, overridden by `SYMM_MULTICAST_MAX_OBJECTS` / `SYMM_MULTICAST_MAX_BYTES`.
    pub fn from_env() -> Result<McBudget, McError> {
        Self::from_env_with(|k| std::env::var_os(k))
    }

    /// [`McBudget::from_env`] over an arbitrary environment lookup. A value that is not UTF-8
    /// is a bad setting like any other, never an unset variable.
    pub fn from_env_with(env: impl Fn(&str) -> Option<OsString>) -> Result<McBudget, McError> {
        let mut b = McBudget::DEFAULT;
        if let Some(v) = env(ENV_MAX_OBJECTS) {
            b.max_objects = parse(ENV_MAX_OBJECTS, &v.to_string_lossy())?;
        }
        if let Some(v) = env(ENV_MAX_BYTES) {
            b.max_bytes = parse(ENV_MAX_BYTES, &v.to_string_lossy())?;
        }
        Ok(b)
    }
}

impl Default for McBudget {
    fn default() -> McBudget {
        McBudget::DEFAULT
    }
}

/// A plain decimal number: ASCII digits only (no sign, space, underscore or suffix), in range.
fn parse<T: core::str::FromStr>(var: &'static str, v: &str) -> Result<T, McError> {
    let bad = || McError::BadSetting {
        var,
        value: v.chars().take(32).flat_map(char::escape_debug).collect(),
    };
    if v.is_empty() || !v.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    v.parse().map_err(|_| bad())
}

#[derive(Debug)]
struct Held {
    budget: Result<McBudget, McError>,
    objects: u32,
    bytes: u64,
}

/// A budget and what is held against it.
#[derive(Debug)]
pub(crate) struct Ledger {
    held: Mutex<Held>,
}

impl Ledger {
    /// A ledger with nothing held.
    pub(crate) fn new(budget: Result<McBudget, McError>) -> Arc<Ledger> {
        Arc::new(Ledger {
            held: Mutex::new(Held {
                budget,
                objects: 0,
                bytes: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // The counts are updated in single statements, so a panic elsewhere cannot leave them
        // half-written: a poisoned lock is still consistent.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_budget(&self, b: McBudget) {
        self.lock().budget = Ok(b);
    }

    pub(crate) fn budget(&self) -> Result<McBudget, McError> {
        self.lock().budget.clone()
    }

    /// (objects, bytes) held.
    pub(crate) fn held(&self) -> (u32, u64) {
        let h = self.lock();
        (h.objects, h.bytes)
    }

    /// Reserves one object of `bytes`, or says which limit it would exceed.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, McError> {
        let mut h = self.lock();
        let b = h.budget.clone()?;
        if h.objects >= b.max_objects {
            return Err(McError::TooManyObjects {
                held: h.objects,
                max: b.max_objects,
            });
        }
        match h.bytes.checked_add(bytes) {
            Some(total) if total <= b.max_bytes => {
                h.objects += 1;
                h.bytes = total;
                Ok(Reservation {
                    ledger: self.clone(),
                    bytes,
                })
            }
            _ => Err(McError::TooManyBytes {
                held: h.bytes,
                requested: bytes,
                max: b.max_bytes,
            }),
        }
    }
}

/// One object's share of the budget, returned on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    ledger: Arc<Ledger>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut h = self.ledger.lock();
        h.objects = h.objects.saturating_sub(1);
        h.bytes = h.bytes.saturating_sub(self.bytes);
    }
}

/// The process's ledger (its budget from the environment until [`set_budget`]).
pub(crate) fn process() -> &'static Arc<Ledger> {
    static P: OnceLock<Arc<Ledger>> = OnceLock::new();
    P.get_or_init(|| Ledger::new(McBudget::from_env()))
}

/// Sets the process's budget (it replaces the default and the environment's). Objects held
/// already stay; a lower budget refuses new ones until enough are released.
pub fn set_budget(b: McBudget) {
    process().set_budget(b);
}

/// The process's budget, or why the environment's is refused.
pub fn budget() -> Result<McBudget, McError> {
    process().budget()
}

/// (objects, bytes) the process holds.
pub fn held() -> (u32, u64) {
    process().held()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(kv: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.into())
    }

    #[test]
    fn the_environment_is_parsed_strictly() {
        assert_eq!(McBudget::from_env_with(env(&[])), Ok(McBudget::DEFAULT));
        assert_eq!(
            McBudget::from_env_with(env(&[(ENV_MAX_OBJECTS, "3"), (ENV_MAX_BYTES, "4096")])),
            Ok(McBudget {
                max_objects: 3,
                max_bytes: 4096
            })
        );
        for (var, v) in [
            (ENV_MAX_OBJECTS, ""),
            (ENV_MAX_OBJECTS, "-1"),
            (ENV_MAX_OBJECTS, "+1"),
            (ENV_MAX_OBJECTS, " 1"),
            (ENV_MAX_OBJECTS, "1_000"),
            (ENV_MAX_OBJECTS, "4294967296"),
            (ENV_MAX_BYTES, "1G"),
            (ENV_MAX_BYTES, "0x10"),
            (ENV_MAX_BYTES, "18446744073709551616"),
            (ENV_MAX_BYTES, "\u{0}\n"),
        ] {
            match McBudget::from_env_with(env(&[(var, v)])) {
                Err(McError::BadSetting { var: got, value }) => {
                    assert_eq!(got, var);
                    assert!(!value.contains('\n'), "{value:?}");
                }
                other => panic!("{var}={v:?}: {other:?}"),
            }
        }
        use std::os::unix::ffi::OsStringExt;
        let not_utf8 =
            |k: &str| (k == ENV_MAX_OBJECTS).then(|| OsString::from_vec(vec![b'1', 0xff]));
        match McBudget::from_env_with(not_utf8) {
            Err(McError::BadSetting { var, .. }) => assert_eq!(var, ENV_MAX_OBJECTS),
            other => panic!("{other:?}"),
        }
        let long = "9".repeat(100);
        match McBudget::from_env_with(env(&[(ENV_MAX_BYTES, &long)])) {
            Err(McError::BadSetting { value, .. }) => assert_eq!(value.len(), 32),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reservations_count_objects_and_bytes_and_return_them() {
        let l = Ledger::new(Ok(McBudget {
            max_objects: 2,
            max_bytes: 100,
        }));
        let a = l.reserve(60).unwrap();
        assert_eq!(l.held(), (1, 60));
        assert_eq!(
            l.reserve(41).unwrap_err(),
            McError::TooManyBytes {
                held: 60,
                requested: 41,
                max: 100
            }
        );
        assert_eq!(
            l.reserve(u64::MAX).unwrap_err(),
            McError::TooManyBytes {
                held: 60,
                requested: u64::MAX,
                max: 100
            }
        );
        let b = l.reserve(40).unwrap();
        assert_eq!(
            l.reserve(0).unwrap_err(),
            McError::TooManyObjects { held: 2, max: 2 }
        );
        drop(a);
        assert_eq!(l.held(), (1, 40));
        drop(b);
        assert_eq!(l.held(), (0, 0));
        l.set_budget(McBudget {
            max_objects: 0,
            max_bytes: 0,
        });
        assert_eq!(
            l.reserve(0).unwrap_err(),
            McError::TooManyObjects { held: 0, max: 0 }
        );
    }

    #[test]
    fn a_bad_setting_refuses_until_a_budget_is_set() {
        let l = Ledger::new(Err(McError::BadSetting {
            var: ENV_MAX_BYTES,
            value: "x".into(),
        }));
        assert!(matches!(l.reserve(1), Err(McError::BadSetting { .. })));
        l.set_budget(McBudget::DEFAULT);
        assert!(l.reserve(1).is_ok());
    }
}
