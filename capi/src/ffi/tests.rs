use super::*;
use crate::error::SYMM_ERR_INTERNAL;

/// A panic payload whose destructor panics too.
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        panic!("the payload's destructor panics");
    }
}

fn last() -> String {
    error::with_last(str::to_string)
}

/// Recording the outcome (formatting and storing the message) runs inside the catch: a
/// panic there is `SYMM_ERR_INTERNAL` with the internal message, not an unwind into C.
#[test]
fn a_panic_while_recording_the_outcome_does_not_unwind() {
    let failing = || Err(Error::Null { arg: "req" });
    assert_eq!(
        guard_with(failing, |_| panic!("formatting the error")),
        SYMM_ERR_INTERNAL
    );
    assert_eq!(last(), "internal error (a panic was caught)");
    assert_eq!(
        guard_with(|| Ok(7), |_| panic!("storing")),
        SYMM_ERR_INTERNAL
    );
    assert_eq!(last(), "internal error (a panic was caught)");
    // The real recording: the message, then cleared on success.
    assert_eq!(guard(failing), crate::error::SYMM_ERR_NULL);
    assert_eq!(last(), "req is null");
    assert_eq!(guard(|| Ok(SYMM_OK)), SYMM_OK);
    assert_eq!(last(), "");
}

/// A panic whose payload panics again when dropped stops at the boundary too.
#[test]
fn a_payload_that_panics_when_dropped_does_not_unwind() {
    let status = guard(|| std::panic::panic_any(PanicsWhenDropped));
    assert_eq!(status, SYMM_ERR_INTERNAL);
    assert_eq!(last(), "internal error (a panic was caught)");
    let v = contain(|| -> u8 { std::panic::panic_any(PanicsWhenDropped) }, 3);
    assert_eq!(v, 3);
    assert_eq!(contain(|| 5u8, 3), 5);
}
