//! Names: how users and bindings spell collectives, algorithms, element types, reduction
//! operators and topologies, and the one way a name becomes its value again.
//!
//! Every kind has an `ALL` list and a `name()`; its `parse` finds the entry of `ALL` whose name
//! is the text, exactly (no case folding, no aliases), or returns [`UnknownName`], whose message
//! lists the valid names. Bindings (Python, C, the command lines) call these and never keep a
//! list of names of their own.
//!
//! ```
//! use symm_core::dtype::DType;
//! use symm_core::name::Named;
//! use symm_core::sched::Collective;
//!
//! assert_eq!(Collective::parse("broadcast"), Ok(Collective::Broadcast { root: 0 }));
//! assert_eq!(DType::parse("bf16"), Ok(DType::Bf16));
//! let e = DType::parse("float33").unwrap_err();
//! assert_eq!(e.kind, Named::DType);
//! assert!(e.to_string().contains("valid: f32, f16, bf16"));
//! ```

use core::fmt;

use crate::cost::Topology;
use crate::dtype::{DType, ReduceOp};
use crate::sched::{Algorithm, Collective};

/// The longest part of an unknown name kept in [`UnknownName`] (longer text is cut).
pub const MAX_NAME: usize = 32;

/// A kind of named value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Named {
    /// A [`Collective`].
    Collective,
    /// An [`Algorithm`].
    Algorithm,
    /// A [`DType`].
    DType,
    /// A [`ReduceOp`].
    ReduceOp,
    /// A [`Topology`].
    Topology,
}

impl Named {
    /// What the kind is called in messages.
    pub fn what(self) -> &'static str {
        match self {
            Named::Collective => "collective",
            Named::Algorithm => "algorithm",
            Named::DType => "dtype",
            Named::ReduceOp => "op",
            Named::Topology => "topology",
        }
    }

    /// Calls `f` with every valid name of the kind, in `ALL`'s order.
    pub fn for_each_name(self, mut f: impl FnMut(&'static str)) {
        match self {
            Named::Collective => Collective::ALL.iter().for_each(|c| f(c.name())),
            Named::Algorithm => Algorithm::ALL.iter().for_each(|a| f(a.name())),
            Named::DType => DType::ALL.iter().for_each(|d| f(d.name())),
            Named::ReduceOp => ReduceOp::ALL.iter().for_each(|o| f(o.name())),
            Named::Topology => Topology::ALL.iter().for_each(|t| f(t.name())),
        }
    }
}

/// A name that no value of its kind has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownName {
    /// The kind of value asked for.
    pub kind: Named,
    /// The name given (its first [`MAX_NAME`] bytes, cut at a character boundary).
    pub got: heapless::String<MAX_NAME>,
}

impl UnknownName {
    /// The error for `got` as a name of `kind`.
    pub fn new(kind: Named, got: &str) -> UnknownName {
        let mut kept = heapless::String::new();
        for ch in got.chars() {
            if kept.push(ch).is_err() {
                break;
            }
        }
        UnknownName { kind, got: kept }
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?}; valid: ",
            self.kind.what(),
            self.got.as_str()
        )?;
        let mut first = true;
        let mut r = Ok(());
        self.kind.for_each_name(|n| {
            if r.is_ok() {
                r = if first {
                    f.write_str(n)
                } else {
                    write!(f, ", {n}")
                };
            }
            first = false;
        });
        r
    }
}

impl core::error::Error for UnknownName {}

/// The entry of `all` whose `name_of` is `name`.
pub(crate) fn find<T: Copy>(
    kind: Named,
    name: &str,
    all: &[T],
    name_of: impl Fn(&T) -> &'static str,
) -> Result<T, UnknownName> {
    all.iter()
        .find(|x| name_of(x) == name)
        .copied()
        .ok_or_else(|| UnknownName::new(kind, name))
}

impl Collective {
    /// The collective named `name` ([`Collective::name`]); a rooted collective comes with root
    /// 0 and send-receive with source and destination 0 ([`Collective::with_root`] sets them).
    pub fn parse(name: &str) -> Result<Collective, UnknownName> {
        find(Named::Collective, name, &Collective::ALL, |c| c.name())
    }
}

impl Algorithm {
    /// The algorithm named `name` ([`Algorithm::name`]).
    pub fn parse(name: &str) -> Result<Algorithm, UnknownName> {
        find(Named::Algorithm, name, &Algorithm::ALL, |a| a.name())
    }
}

impl DType {
    /// The element type named `name` ([`DType::name`]).
    pub fn parse(name: &str) -> Result<DType, UnknownName> {
        find(Named::DType, name, &DType::ALL, |d| d.name())
    }
}

impl ReduceOp {
    /// The operator named `name` ([`ReduceOp::name`]).
    pub fn parse(name: &str) -> Result<ReduceOp, UnknownName> {
        find(Named::ReduceOp, name, &ReduceOp::ALL, |o| o.name())
    }
}

impl Topology {
    /// The topology named `name` ([`Topology::name`]).
    pub fn parse(name: &str) -> Result<Topology, UnknownName> {
        find(Named::Topology, name, &Topology::ALL, |t| t.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    /// Every value of every kind parses back from its name, and names are unique per kind.
    #[test]
    fn every_name_round_trips() {
        for c in Collective::ALL {
            assert_eq!(Collective::parse(c.name()), Ok(c));
        }
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Ok(a));
        }
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Ok(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::parse(o.name()), Ok(o));
        }
        for t in Topology::ALL {
            assert_eq!(Topology::parse(t.name()), Ok(t));
        }
    }

    /// An unknown name is a typed error naming its kind, what was given (cut to a bound) and
    /// every valid name.
    #[test]
    fn unknown_names_list_the_valid_ones() {
        let e = Collective::parse("allreduce").unwrap_err();
        assert_eq!(e.kind, Named::Collective);
        assert_eq!(e.got.as_str(), "allreduce");
        let msg = e.to_string();
        assert!(msg.starts_with("unknown collective \"allreduce\"; valid: all_reduce, "));
        assert!(msg.ends_with("all_to_allv, send_recv"), "{msg}");
        assert_eq!(Algorithm::parse("Ring").unwrap_err().kind, Named::Algorithm);
        assert_eq!(ReduceOp::parse("plus").unwrap_err().kind, Named::ReduceOp);
        assert!(Topology::parse("pcie")
            .unwrap_err()
            .to_string()
            .ends_with("valid: nvlink, shared_device"));
        let long = "é".repeat(100);
        let e = DType::parse(&long).unwrap_err();
        assert!(e.got.len() <= MAX_NAME && long.starts_with(e.got.as_str()));
        assert_eq!(DType::parse("").unwrap_err().got.as_str(), "");
    }
}
