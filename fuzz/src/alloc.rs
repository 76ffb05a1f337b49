//! A counting global allocator: while an execution is armed on a thread, any single allocation larger than
//! the limit the input justifies is recorded as a finding (an allocation sized by an untrusted number
//! before it was checked against the real size). Allocations beyond [`HARD_CAP`] are refused outright
//! (the process would abort), after writing a note on stderr; everything below it is served, so the
//! execution finishes and the harness reports the finding with the input that caused it.
//!
//! Install it in a binary or test with `#[global_allocator] static A: CountingAlloc = CountingAlloc;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Larger than this is never served while armed.
pub const HARD_CAP: usize = 2 << 30;

pub struct CountingAlloc;

thread_local! {
    /// The limit for the current execution on this thread (0: not armed).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
    /// The largest allocation over the limit seen since arming (0: none).
    static WORST: Cell<usize> = const { Cell::new(0) };
    /// The largest allocation seen since arming.
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) -> bool {
    let limit = LIMIT.try_with(Cell::get).unwrap_or(0);
    if limit == 0 {
        return true;
    }
    let _ = PEAK.try_with(|p| p.set(p.get().max(size)));
    if size > limit {
        let _ = WORST.try_with(|w| w.set(w.get().max(size)));
        if size > HARD_CAP {
            // No allocation here: a fixed message through the raw stderr handle.
            use std::io::Write;
            let _ = std::io::stderr().write_all(b"tessera-fuzz: refused an allocation above the hard cap (the process will abort)\n");
            return false;
        }
    }
    true
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Arms the check on this thread with `limit` bytes per allocation.
pub fn arm(limit: usize) {
    LIMIT.with(|l| l.set(limit));
    WORST.with(|w| w.set(0));
    PEAK.with(|p| p.set(0));
}

/// Disarms it; returns (the largest allocation over the limit or 0, the largest allocation).
pub fn disarm() -> (usize, usize) {
    LIMIT.with(|l| l.set(0));
    (WORST.with(Cell::get), PEAK.with(Cell::get))
}

/// Whether this process's global allocator is [`CountingAlloc`] (an armed 1-byte limit sees a 2-byte box).
pub fn installed() -> bool {
    arm(1);
    let b = std::hint::black_box(Box::new([0u8; 2]));
    drop(b);
    disarm().0 > 0
}
