//! The C ABI of `tessera-runtime`: load an artifact, read its inputs and outputs, run it into the caller's
//! buffers, free it. `include/tessera.h` is generated from this file by cbindgen (tests/header.rs checks
//! the committed header is current; `TESSERA_BLESS=1 cargo test -p tessera-runtime-c --test header`
//! rewrites it).
//!
//! Conventions, the same for every function:
//! - Fallible functions return a [`TesseraStatus`]; on anything but `TESSERA_OK`, [`tessera_last_error`]
//!   gives the message (it names the file, model, input or output at fault).
//! - No panic crosses the boundary: every entry point runs under `catch_unwind` and reports a panic as
//!   `TESSERA_ERROR_PANIC`. Null pointers and non-UTF-8 names are `TESSERA_ERROR_INVALID_ARGUMENT`.
//! - A model may be run from many threads at once (`tessera_model_run` takes a const model); strings and
//!   shapes it hands out live as long as the model.

mod abi;
mod device;
mod guard;

pub use abi::*;
pub use device::*;
pub use guard::TesseraStatus;
