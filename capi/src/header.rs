//! The generator of `include/symm.h`.
//!
//! Everything in the header comes from this crate's definitions: the enumerations from
//! [`crate::types::codes`] (symm-core's own lists), the structs from the descriptions that
//! `c_struct!` records where it declares them (so the header's fields are the compiled ones, and
//! the header asserts the compiled sizes and offsets to the C compiler), and the functions from
//! [`FUNCTIONS`], each checked at compile time to have exactly the exported function's signature.
//! A test fails when the committed header differs from [`generate`]'s text; regenerate it with
//! `cargo run -p symm-capi --bin symm-capi-header > capi/include/symm.h`.

use std::fmt::Write as _;

use symm_core::plan::OP_BYTES;
use symm_core::sched::{MAX_CHANNELS, MAX_WORLD};
use symm_core::trace::MAGIC;

use crate::api::{ABI_VERSION, TRACE_MAX_EVENTS};
use crate::types::{codes, CTy, CType, OPAQUE, STRUCTS};

/// The command that regenerates the header, from the workspace root.
pub const REGENERATE: &str = "cargo run -p symm-capi --bin symm-capi-header > capi/include/symm.h";

/// An exported function as the header declares it.
pub struct CFn {
    /// Name.
    pub name: &'static str,
    /// Parameters: name and type.
    pub args: &'static [(&'static str, CTy)],
    /// Return type.
    pub ret: CTy,
    /// Doc lines.
    pub doc: &'static [&'static str],
}

/// A [`CFn`], and a compile-time check that `crate::ffi::$name` has exactly this signature.
macro_rules! c_fn {
    ($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, [$($doc:literal),* $(,)?]) => {{
        const _: unsafe extern "C" fn($($ty),*) -> $ret = crate::ffi::$name;
        CFn {
            name: stringify!($name),
            args: &[$((stringify!($arg), <$ty as CType>::TY)),*],
            ret: <$ret as CType>::TY,
            doc: &[$($doc),*],
        }
    }};
}

use crate::types::{
    symm_buffer_sizes as Sizes, symm_buffers as Bufs, symm_comm as Comm,
    symm_comm_options as CommOpts, symm_event as Event, symm_link as Link, symm_op as Op,
    symm_request as Req, symm_schedule as Sched, symm_trace_writer as Writer,
};
use std::os::raw::{c_char, c_int};

/// Every exported function, in the header's order.
pub const FUNCTIONS: [CFn; 31] = [
    c_fn!(symm_last_error(buf: *mut c_char, len: usize) -> usize, [
        "Copies the message of this thread's last failed call into buf (at most len - 1 bytes",
        "and a NUL; nothing when buf is NULL or len is 0) and returns the message's full length,",
        "0 when the last call succeeded.",
    ]),
    c_fn!(symm_status_name(status: c_int) -> *const c_char, [
        "The name of a status (\"SYMM_OK\", ...) or \"SYMM_UNKNOWN_STATUS\"; static, never freed.",
    ]),
    c_fn!(symm_abi_version() -> u32, [
        "The ABI version of the library; equal to SYMM_ABI_VERSION of a matching header.",
    ]),
    c_fn!(symm_request_validate(req: *const Req) -> c_int, [
        "SYMM_OK when the request can be scheduled, else SYMM_ERR_INVALID (symm_last_error",
        "says why).",
    ]),
    c_fn!(symm_request_buffer_sizes(req: *const Req, out: *mut Sizes) -> c_int, [
        "Writes the input, output and scratch bytes each rank needs for a valid request.",
    ]),
    c_fn!(symm_schedule_new(
        req: *const Req, rank: u16, channel: u16, out: *mut *mut Sched
    ) -> c_int, [
        "Starts iterating the ops of (rank, channel) of a valid request; *out receives a",
        "schedule to free with symm_schedule_free. It allocates once and holds O(1) state.",
        "SYMM_COLL_ALL_TO_ALLV needs per-pair counts and is refused.",
    ]),
    c_fn!(symm_schedule_next(s: *mut Sched, out: *mut Op) -> c_int, [
        "Writes the next op to *out and returns 1; returns 0 at the end (out untouched), or a",
        "negative status. A schedule must not be used by two threads at once.",
    ]),
    c_fn!(symm_schedule_count(s: *const Sched, out: *mut u64) -> c_int, [
        "Writes the schedule's total number of ops (from its start, whatever was iterated);",
        "time linear in the count, no memory.",
    ]),
    c_fn!(symm_schedule_free(s: *mut Sched) -> (), [
        "Frees a schedule; NULL is ignored.",
    ]),
    c_fn!(symm_op_encode(op: *const Op, out: *mut u8, len: usize) -> c_int, [
        "Writes the SYMM_PLAN_OP_BYTES-byte plan encoding of an op (what the GPU interpreter",
        "reads: little-endian, the layout of kernels/symm/plan.cuh) to out, which holds len",
        "bytes (SYMM_ERR_TOO_SMALL below SYMM_PLAN_OP_BYTES).",
    ]),
    c_fn!(symm_op_decode(bytes: *const u8, len: usize, out: *mut Op) -> c_int, [
        "Reads an op from its plan encoding (len bytes; only the first SYMM_PLAN_OP_BYTES are",
        "read).",
    ]),
    c_fn!(symm_link_preset(preset: u32, out: *mut Link) -> c_int, [
        "Fills *out with a named link (SYMM_LINK_*).",
    ]),
    c_fn!(symm_cost_predict(req: *const Req, link: *const Link, us_out: *mut f64) -> c_int, [
        "Writes the cost model's prediction for a valid request on link, in microseconds,",
        "launch included.",
    ]),
    c_fn!(symm_cost_select(
        req: *const Req, link: *const Link, multicast: c_int, algorithm_out: *mut u32
    ) -> c_int, [
        "Writes the algorithm (SYMM_ALG_*) predicted fastest for the request on link (its own",
        "algorithm is ignored); multicast is considered only when multicast is nonzero; with",
        "SYMM_REQUEST_DETERMINISTIC, only algorithms that honour deterministic mode.",
    ]),
    c_fn!(symm_trace_writer_new(
        req: *const Req, source: u32, time_unit_ns: u32, max_events: u64, out: *mut *mut Writer
    ) -> c_int, [
        "Starts a trace of a valid request recorded on source (SYMM_SOURCE_*), time_unit_ns",
        "nanoseconds per time unit (nonzero), holding at most max_events events",
        "(1..=SYMM_TRACE_MAX_EVENTS; the writer keeps about 120 bytes an event, never room for",
        "more than max_events); *out receives the writer.",
    ]),
    c_fn!(symm_trace_writer_event(w: *mut Writer, event: *const Event) -> c_int, [
        "Adds an event, in any order (the trace is sorted when finished); its rank and channel",
        "must be inside the request. SYMM_ERR_LIMIT once the writer holds max_events.",
    ]),
    c_fn!(symm_trace_writer_finish(w: *mut Writer, bytes: *mut *mut u8, len: *mut usize) -> c_int, [
        "Ends a trace: frees the writer whatever the outcome (unless it is NULL) and on success",
        "stores the trace (it starts with SYMM_TRACE_MAGIC) in *bytes and its length in *len;",
        "free them with symm_bytes_free.",
    ]),
    c_fn!(symm_trace_writer_free(w: *mut Writer) -> (), [
        "Frees a writer without finishing its trace; NULL is ignored.",
    ]),
    c_fn!(symm_bytes_free(bytes: *mut u8, len: usize) -> (), [
        "Frees bytes returned by symm_trace_writer_finish (pass the same pointer and length);",
        "NULL is ignored.",
    ]),
    c_fn!(symm_comm_from_env(opts: *const CommOpts, out: *mut *mut Comm) -> c_int, [
        "Collective: joins the job its environment describes (WORLD_SIZE, RANK, SYMM_JOB,",
        "LOCAL_RANK) as one rank on its GPU; *out receives the communicator. opts NULL takes the",
        "defaults. Without the job's environment, or when the CUDA libraries cannot be loaded,",
        "it returns SYMM_ERR_UNAVAILABLE and symm_last_error names what is missing.",
    ]),
    c_fn!(symm_comm_finish(comm: *mut Comm) -> c_int, [
        "Ends this rank's part in the job in order (waits for its device, then for every rank)",
        "and frees the communicator whatever the outcome (unless it is NULL).",
    ]),
    c_fn!(symm_comm_free(comm: *mut Comm) -> (), [
        "Frees a communicator without finishing (the other ranks see this rank as lost); NULL",
        "is ignored.",
    ]),
    c_fn!(symm_comm_rank(comm: *mut Comm, out: *mut u16) -> c_int, [
        "Writes this rank to *out.",
    ]),
    c_fn!(symm_comm_world(comm: *mut Comm, out: *mut u16) -> c_int, [
        "Writes the number of ranks in the job to *out.",
    ]),
    c_fn!(symm_comm_alloc(comm: *mut Comm, req: *const Req, out: *mut Bufs) -> c_int, [
        "Collective: places buffers for a valid request in the symmetric heap, at the same",
        "offsets on every rank, and writes them to *out.",
    ]),
    c_fn!(symm_comm_free_buffers(comm: *mut Comm, buffers: *const Bufs) -> c_int, [
        "Collective: returns buffers of symm_comm_alloc to the heap after this rank's device",
        "finished its work; every offset is checked first, so a bad set frees nothing.",
    ]),
    c_fn!(symm_comm_ptr(comm: *mut Comm, peer: u16, offset: u64, out: *mut u64) -> c_int, [
        "Writes the device address of heap offset offset of rank peer, through this rank's",
        "mapping, to *out.",
    ]),
    c_fn!(symm_comm_enqueue(
        comm: *mut Comm, req: *const Req, buffers: *const Bufs, stream: *mut ()
    ) -> c_int, [
        "Enqueues a valid request's collective on buffers of symm_comm_alloc on the caller's",
        "CUstream and returns without waiting. stream is NULL (the legacy default stream) or a",
        "valid stream of the communicator's device (its primary context) that stays valid until",
        "the enqueued work has finished. Errors of the work surface in symm_comm_check.",
    ]),
    c_fn!(symm_comm_check(comm: *mut Comm) -> c_int, [
        "Reports asynchronous errors of the collectives enqueued so far without waiting:",
        "SYMM_ERR_TIMEOUT (a device wait), SYMM_ERR_PEER_LOST, then SYMM_ERR_POISONED until",
        "symm_comm_reset.",
    ]),
    c_fn!(symm_comm_synchronize(comm: *mut Comm, stream: *mut ()) -> c_int, [
        "Waits for the caller's CUstream (NULL: the legacy default stream; valid during the",
        "call), then checks as symm_comm_check does.",
    ]),
    c_fn!(symm_comm_reset(comm: *mut Comm) -> c_int, [
        "Collective: after a failure, waits for this rank's device, brings the bootstrap back",
        "(ranks left in different exchanges meet again), clears the signal state between two",
        "barriers of every rank and lifts the poison. Fails (and stays poisoned) when a peer was",
        "lost.",
    ]),
];

fn doc(w: &mut String, indent: &str, lines: &[&str]) {
    for l in lines {
        let l = l.trim();
        if l.is_empty() {
            let _ = writeln!(w, "{indent}//");
        } else {
            let _ = writeln!(w, "{indent}// {l}");
        }
    }
}

/// Rust doc lines as header comment lines: backticks dropped, lines re-wrapped at 96 columns.
fn rewrap(lines: &[&str]) -> Vec<String> {
    let text = lines.join(" ").replace('`', "");
    let mut out = vec![String::new()];
    for word in text.split_whitespace() {
        let cur = out.last_mut().expect("never empty");
        if !cur.is_empty() && cur.len() + 1 + word.len() > 92 {
            out.push(word.to_string());
        } else {
            if !cur.is_empty() {
                cur.push(' ');
            }
            cur.push_str(word);
        }
    }
    out
}

fn signature(f: &CFn) -> String {
    let head = format!("{} {}(", f.ret.spell(), f.name);
    let args: Vec<String> = f
        .args
        .iter()
        .map(|(n, t)| format!("{} {n}", t.spell()))
        .collect();
    let one = format!("{head}{});", args.join(", "));
    if args.is_empty() {
        format!("{head}void);")
    } else if one.len() <= 100 {
        one
    } else {
        format!("{head}\n    {});", args.join(",\n    "))
    }
}

/// The header text.
pub fn generate() -> String {
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "// GENERATED by `{REGENERATE}`");
    let _ = writeln!(w, "// from the symm-capi crate (capi/src). Do not edit.");
    let _ = writeln!(w, "//");
    doc(
        w,
        "",
        &[
            "symm's C ABI: request validation, schedule iteration into plan ops, the cost model,",
            "trace writing and the GPU runtime (a communicator, symmetric buffers, collectives on",
            "a CUstream; the CUDA libraries are loaded at run time). Link libsymm.a (with",
            "-lpthread -ldl -lm) or libsymm.so.",
            "Every function checks its pointers for null and returns a symm_status (or a count);",
            "symm_last_error says why the calling thread's last call failed.",
        ],
    );
    let _ = writeln!(w, "#ifndef SYMM_H\n#define SYMM_H\n");
    let _ = writeln!(w, "#include <stddef.h>\n#include <stdint.h>\n");
    let _ = writeln!(w, "#ifdef __cplusplus\nextern \"C\" {{\n#endif\n");

    let magic = String::from_utf8_lossy(&MAGIC).into_owned();
    let defines: [(&str, String, &str); 6] = [
        (
            "SYMM_ABI_VERSION",
            format!("{ABI_VERSION}u"),
            "The ABI version of this header.",
        ),
        (
            "SYMM_PLAN_OP_BYTES",
            OP_BYTES.to_string(),
            "Bytes of one encoded plan op.",
        ),
        (
            "SYMM_MAX_WORLD",
            MAX_WORLD.to_string(),
            "Largest world a request may name.",
        ),
        (
            "SYMM_MAX_CHANNELS",
            MAX_CHANNELS.to_string(),
            "Most channels a request may use.",
        ),
        (
            "SYMM_TRACE_MAX_EVENTS",
            format!("{TRACE_MAX_EVENTS}ull"),
            "Most events a trace writer may hold.",
        ),
        (
            "SYMM_TRACE_MAGIC",
            format!("\"{magic}\""),
            "The first 8 bytes of every trace.",
        ),
    ];
    for (name, value, d) in &defines {
        doc(w, "", &[d]);
        let _ = writeln!(w, "#define {name} {value}");
    }
    let _ = writeln!(w);

    for e in codes::enums() {
        doc(w, "", &[e.doc]);
        let _ = writeln!(w, "typedef enum {} {{", e.name);
        for v in &e.values {
            doc(w, "    ", &[&v.doc]);
            let _ = writeln!(w, "    {}{} = {},", e.prefix, v.name, v.value);
        }
        let _ = writeln!(w, "}} {};\n", e.name);
    }

    for (name, d) in OPAQUE {
        let lines = rewrap(&[d]);
        doc(w, "", &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let _ = writeln!(w, "typedef struct {name} {name};\n");
    }

    for st in STRUCTS {
        let lines = rewrap(st.doc);
        doc(w, "", &lines.iter().map(String::as_str).collect::<Vec<_>>());
        let _ = writeln!(w, "typedef struct {} {{", st.name);
        for f in st.fields {
            let lines = rewrap(f.doc);
            doc(
                w,
                "    ",
                &lines.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            let _ = writeln!(w, "    {} {};", f.ty.spell(), f.name);
        }
        let _ = writeln!(w, "}} {};\n", st.name);
    }

    for f in &FUNCTIONS {
        doc(w, "", f.doc);
        let _ = writeln!(w, "{}\n", signature(f));
    }

    doc(
        w,
        "",
        &["The layouts above as the library was compiled (checked from C11 and C++11)."],
    );
    let _ = writeln!(w, "#if defined(__cplusplus)");
    let _ = writeln!(w, "#define SYMM_STATIC_ASSERT(c, m) static_assert(c, m)");
    let _ = writeln!(
        w,
        "#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L"
    );
    let _ = writeln!(w, "#define SYMM_STATIC_ASSERT(c, m) _Static_assert(c, m)");
    let _ = writeln!(w, "#else\n#define SYMM_STATIC_ASSERT(c, m)\n#endif");
    for st in STRUCTS {
        let _ = writeln!(
            w,
            "SYMM_STATIC_ASSERT(sizeof({0}) == {1}, \"{0}: size\");",
            st.name, st.size
        );
        for f in st.fields {
            let _ = writeln!(
                w,
                "SYMM_STATIC_ASSERT(offsetof({0}, {1}) == {2}, \"{0}.{1}: offset\");",
                st.name, f.name, f.offset
            );
        }
    }
    let _ = writeln!(w, "\n#ifdef __cplusplus\n}}\n#endif\n\n#endif // SYMM_H");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_header_is_fresh() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/symm.h");
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == generate(),
            "capi/include/symm.h is stale: run `{REGENERATE}` from the workspace root and commit \
             the result"
        );
    }

    #[test]
    fn types_spell_as_c() {
        type P = *mut *mut u8;
        assert_eq!(<*const Req as CType>::TY.spell(), "const symm_request*");
        assert_eq!(<P as CType>::TY.spell(), "uint8_t**");
        assert_eq!(<() as CType>::TY.spell(), "void");
    }

    #[test]
    fn every_export_is_declared_once() {
        let mut names: Vec<_> = FUNCTIONS.iter().map(|f| f.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FUNCTIONS.len());
        let src = [include_str!("ffi/mod.rs"), include_str!("ffi/comm.rs")].concat();
        let exported = src.matches("#[no_mangle]").count();
        assert_eq!(
            exported,
            FUNCTIONS.len(),
            "an export is missing from FUNCTIONS"
        );
        for f in &FUNCTIONS {
            assert!(src.contains(&format!("extern \"C\" fn {}(", f.name)));
        }
    }
}
