//! Header shapes of older format versions, converted to today's [`Header`].
//!
//! Versions 1 and 2 have no team tag ([`HeaderV2`]). Early version 1 traces also number the
//! collectives without `AllToAllV` (added before `SendRecv` while the format was at version 1),
//! so their `SendRecv` has tag 8, today's `AllToAllV` ([`HeaderV1Early`]).

use super::{Header, Source};
use crate::dtype::{DType, ReduceOp};
use crate::sched::{Algorithm, Collective, Request};
use serde::{Deserialize, Serialize};

/// The header of versions 1 and 2 (no team).
#[derive(Serialize, Deserialize)]
pub(crate) struct HeaderV2 {
    pub(crate) world: u16,
    pub(crate) channels: u16,
    pub(crate) request: Request,
    pub(crate) source: Source,
    pub(crate) time_unit_ns: u32,
}

impl From<HeaderV2> for Header {
    fn from(h: HeaderV2) -> Header {
        Header {
            world: h.world,
            channels: h.channels,
            request: h.request,
            source: h.source,
            time_unit_ns: h.time_unit_ns,
            team: None,
        }
    }
}

/// The collectives of early version 1 traces, in their order then.
#[derive(Clone, Copy, Serialize, Deserialize)]
pub(crate) enum CollectiveV1Early {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast { root: u16 },
    Reduce { root: u16 },
    Scatter { root: u16 },
    Gather { root: u16 },
    AllToAll,
    SendRecv { src: u16, dst: u16 },
}

impl From<CollectiveV1Early> for Collective {
    fn from(c: CollectiveV1Early) -> Collective {
        use CollectiveV1Early as C;
        match c {
            C::AllReduce => Collective::AllReduce,
            C::ReduceScatter => Collective::ReduceScatter,
            C::AllGather => Collective::AllGather,
            C::Broadcast { root } => Collective::Broadcast { root },
            C::Reduce { root } => Collective::Reduce { root },
            C::Scatter { root } => Collective::Scatter { root },
            C::Gather { root } => Collective::Gather { root },
            C::AllToAll => Collective::AllToAll,
            C::SendRecv { src, dst } => Collective::SendRecv { src, dst },
        }
    }
}

/// The header of early version 1 traces: [`HeaderV2`] with [`CollectiveV1Early`].
#[derive(Serialize, Deserialize)]
pub(crate) struct HeaderV1Early {
    pub(crate) world: u16,
    pub(crate) channels: u16,
    pub(crate) collective: CollectiveV1Early,
    pub(crate) algorithm: Algorithm,
    pub(crate) req_world: u16,
    pub(crate) req_channels: u16,
    pub(crate) bytes: u64,
    pub(crate) dtype: DType,
    pub(crate) op: ReduceOp,
    pub(crate) chunk_bytes: u64,
    pub(crate) slots: u8,
    pub(crate) source: Source,
    pub(crate) time_unit_ns: u32,
}

impl From<HeaderV1Early> for Header {
    fn from(h: HeaderV1Early) -> Header {
        let mut request = Request::new(
            h.collective.into(),
            h.algorithm,
            h.req_world,
            h.bytes,
            h.dtype,
            h.op,
        );
        request.channels = h.req_channels;
        request.chunk_bytes = h.chunk_bytes;
        request.slots = h.slots;
        Header {
            world: h.world,
            channels: h.channels,
            request,
            source: h.source,
            time_unit_ns: h.time_unit_ns,
            team: None,
        }
    }
}

/// The header in `bytes` of a version 1 trace: today's shape when it decodes exactly and
/// validates, else the early shape when that does, else today's (for its error).
pub(crate) fn header_v1(bytes: &[u8]) -> Option<Header> {
    let now = exact::<HeaderV2>(bytes).map(Header::from);
    if now.as_ref().is_some_and(|h| h.validate().is_ok()) {
        return now;
    }
    exact::<HeaderV1Early>(bytes)
        .map(Header::from)
        .filter(|h| h.validate().is_ok())
        .or(now)
}

/// `T` when `bytes` is exactly one encoded `T`.
pub(crate) fn exact<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((v, [])) => Some(v),
        _ => None,
    }
}
