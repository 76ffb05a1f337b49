//! The boundary: every entry point's body runs in [`guard`], which turns errors and panics into a status
//! and the thread's last error message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tessera_runtime::{Error, ErrorKind};

/// What a call returns: `TESSERA_STATUS_OK`, or the kind of error (message from `tessera_last_error`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TesseraStatus {
    Ok = 0,
    /// The artifact could not be read, or is truncated, corrupted or of another format version.
    ErrorArtifact = 1,
    /// The artifact cannot be loaded here (a module, an instruction set, a GPU, memory).
    ErrorLoad = 2,
    /// An input is unknown, missing, given twice, or of the wrong dtype, shape or size.
    ErrorInput = 3,
    /// An output buffer is unknown, given twice, or of the wrong dtype, shape or size.
    ErrorOutput = 4,
    /// A run failed.
    ErrorRun = 5,
    /// A null pointer, an index out of range, a string that is not UTF-8.
    ErrorInvalidArgument = 6,
    /// A bug: the library panicked (the message says where); the model is still usable.
    ErrorPanic = 7,
}

/// An error before it is reported.
pub struct Failure(pub TesseraStatus, pub String);

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let status = match e.kind() {
            ErrorKind::Artifact => TesseraStatus::ErrorArtifact,
            ErrorKind::Load => TesseraStatus::ErrorLoad,
            ErrorKind::Input => TesseraStatus::ErrorInput,
            ErrorKind::Output => TesseraStatus::ErrorOutput,
            _ => TesseraStatus::ErrorRun,
        };
        Failure(status, e.message().to_string())
    }
}

pub fn invalid(msg: impl Into<String>) -> Failure {
    Failure(TesseraStatus::ErrorInvalidArgument, msg.into())
}

thread_local! {
    /// The message of this thread's last failed call.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // Interior NULs cannot appear in a C string: shown as spaces.
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The last error message of this thread: valid until this thread's next failing call.
pub fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs `f`, reporting its failure or panic as a status and this thread's last error.
pub fn guard(f: impl FnOnce() -> Result<(), Failure>) -> TesseraStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => TesseraStatus::Ok,
        Ok(Err(Failure(status, msg))) => {
            set_last_error(&msg);
            status
        }
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
            set_last_error(&format!("tessera panicked (a bug, please report it): {what}"));
            TesseraStatus::ErrorPanic
        }
    }
}

/// [`guard`] for functions that cannot report a status (getters): `fallback` on failure or panic.
pub fn guard_value<T>(fallback: T, f: impl FnOnce() -> Option<T>) -> T {
    catch_unwind(AssertUnwindSafe(f)).ok().flatten().unwrap_or(fallback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: `last_error` points at this thread's live message.
        unsafe { CStr::from_ptr(last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn panics_and_errors_become_statuses_with_messages() {
        assert_eq!(guard(|| Ok(())), TesseraStatus::Ok);
        assert_eq!(guard(|| Err(invalid("model is null"))), TesseraStatus::ErrorInvalidArgument);
        assert_eq!(last(), "model is null");
        let s = guard(|| panic!("index {} out of range", 3));
        assert_eq!(s, TesseraStatus::ErrorPanic);
        assert!(last().contains("panicked") && last().contains("index 3 out of range"), "{}", last());
        assert_eq!(guard_value(7usize, || panic!("no")), 7);
        assert_eq!(guard(|| Err(invalid("a\0b"))), TesseraStatus::ErrorInvalidArgument);
        assert_eq!(last(), "a b");
    }
}
