//! The run side of the `c` backend: shared-object modules ([`FORMAT`];
//! later CUTLASS's too), loaded straight from the module bytes, with no
//! compiler and nothing written where other processes could see it.
//!
//! The bytes go into an anonymous in-memory file (`memfd_create`), which is `dlopen`ed through its
//! `/proc/self/fd/N` path with `RTLD_NOW | RTLD_LOCAL`: every undefined symbol is resolved at load (a module
//! that needs a missing library fails here, not in the middle of a run), and modules cannot see each other's
//! symbols. Every function's symbol is looked up once at load. Where memfd or /proc is not available, a private
//! temporary file (created exclusively, unlinked right after `dlopen`) stands in.
//!
//! The memfd stays open as long as the library is loaded: glibc recognizes an already loaded library by its
//! path name, so the `/proc/self/fd/N` name must stay unique while the library lives. Before `dlopen`, a
//! `RTLD_NOLOAD` probe checks that no library of that name is still loaded (one that could not be unloaded,
//! say); if one is, the memfd moves to another descriptor number.

use super::{LoadedModule, RuntimeError};
use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use std::ffi::{c_long, c_void};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use crate::module::Module;

/// `void symbol(void* const* args)`: the calling convention of every exported function.
type KernelFn = unsafe extern "C" fn(*const *mut u8);

/// A loaded shared object with every function resolved. Fields drop in order: function pointers, then the
/// library (`dlclose`), then the memfd holding its bytes.
pub struct SharedObject {
    functions: Vec<(KernelFn, usize, String)>,
    _lib: Library,
    _memfd: Option<File>,
    backend: String,
}

impl SharedObject {
    /// Loads `m` (a [`FORMAT`] module).
    pub fn load(m: &Module) -> Result<SharedObject, RuntimeError> {
        let fail = |msg: String| RuntimeError(format!("module of backend {} (target {}): {msg}", m.backend, m.target));
        if !m.bytes.starts_with(b"\x7fELF") {
            return Err(fail(format!("not an ELF shared object ({} bytes)", m.bytes.len())));
        }
        // Before `dlopen`, which runs the library's initializers: code for a level this CPU lacks must not run.
        super::isa::check(&m.target).map_err(fail)?;
        let (lib, memfd) = match open_memfd(&m.bytes) {
            Ok(loaded) => loaded,
            Err(MemfdError::Unavailable) => (open_temp_file(&m.bytes).map_err(fail)?, None),
            Err(MemfdError::Load(msg)) => return Err(fail(msg)),
        };
        let mut functions = Vec::with_capacity(m.functions.len());
        for f in &m.functions {
            // SAFETY: the symbol is declared by the backend with the calling convention's signature; the
            // pointer is only used while `lib` is loaded (it is dropped first).
            let sym = unsafe { lib.get::<KernelFn>(f.symbol.as_bytes()) }.map_err(|e| fail(format!("function '{}': {e}", f.symbol)))?;
            functions.push((*sym, f.arity(), f.symbol.clone()));
        }
        // A module with parallel loops exports `tsr_set_parallel` (c/prelude.h): hand it the pool's
        // parallel-for. Modules without it (older ones, CUTLASS's) run as they are.
        // SAFETY: the symbol, where present, has the prelude's signature; the function it is given is
        // 'static and callable from any thread.
        if let Ok(set) = unsafe { lib.get::<SetParallelFn>(b"tsr_set_parallel") } {
            unsafe { set(parallel_for, std::ptr::null_mut()) };
        }
        Ok(SharedObject { functions, _lib: lib, _memfd: memfd, backend: m.backend.clone() })
    }
}

/// `tsr_range_fn` of c/prelude.h: runs rows `lo..hi` of a parallel loop.
type RangeFn = unsafe extern "C" fn(ctx: *mut c_void, lo: c_long, hi: c_long);
/// `tsr_parallel_fn` of c/prelude.h.
type ParallelFn = unsafe extern "C" fn(pool: *mut c_void, n: c_long, grain: c_long, f: RangeFn, ctx: *mut c_void);
/// `tsr_set_parallel` of c/prelude.h.
type SetParallelFn = unsafe extern "C" fn(f: ParallelFn, pool: *mut c_void);

/// The ranges `n` rows are cut into: at most four per thread of the pool (rayon balances them), each at
/// least `grain` rows; their bounds depend only on `n`, `grain` and the thread count.
fn ranges(n: usize, grain: usize, threads: usize) -> Vec<(usize, usize)> {
    let count = (n / grain.max(1)).clamp(1, 4 * threads.max(1));
    (0..count).map(|c| (n * c / count, n * (c + 1) / count)).filter(|(lo, hi)| lo < hi).collect()
}

/// The parallel-for given to modules: `f(ctx, lo, hi)` over `0..n` in [`ranges`], on the runtime pool.
/// A module calls it from a kernel that runs on the pool, so the ranges go to its threads (nested calls
/// stay on the pool). Each row is computed by one call, so the results do not depend on the split.
unsafe extern "C" fn parallel_for(_pool: *mut c_void, n: c_long, grain: c_long, f: RangeFn, ctx: *mut c_void) {
    use rayon::prelude::*;
    let (n, grain) = (n.max(0) as usize, grain.max(1) as usize);
    let parts = ranges(n, grain, super::pool::threads());
    // The context pointer crosses threads as an address: the module's struct outlives the call, and every
    // range reads it only.
    let ctx = ctx as usize;
    super::pool::on_runtime_pool(|| {
        // SAFETY: `f` is the module's range function for `ctx`, and the ranges are disjoint rows.
        parts.par_iter().for_each(|&(lo, hi)| unsafe { f(ctx as *mut c_void, lo as c_long, hi as c_long) });
    });
}

/// The `c` backend's module format: an ELF shared object exporting each function as
/// `void symbol(void* const* args)`.
pub const FORMAT: crate::module::ModuleFormat = crate::module::ModuleFormat::host("shared-object");


/// The registry's loader of [`FORMAT`] modules.
pub fn loader(m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
    Ok(Box::new(SharedObject::load(m)?))
}

impl LoadedModule for SharedObject {
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError> {
        let (f, n, symbol) = self.functions.get(index).ok_or_else(|| {
            RuntimeError(format!("module of backend {}: no function {index} ({} loaded)", self.backend, self.functions.len()))
        })?;
        if args.len() != *n {
            return Err(RuntimeError(format!("module of backend {}: function '{symbol}' takes {n} arguments, got {}", self.backend, args.len())));
        }
        // SAFETY: the caller guarantees the buffers (see `LoadedModule::call`); the count was checked above.
        unsafe { f(args.as_ptr()) };
        Ok(())
    }
}

enum MemfdError {
    /// No memfd or no /proc: use a temporary file instead.
    Unavailable,
    /// The library itself failed to load.
    Load(String),
}

fn proc_path(fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// Whether a library of this path name is already loaded in the process.
fn name_in_use(path: &PathBuf) -> bool {
    // SAFETY: RTLD_NOLOAD never runs initializers; it only returns a (counted) handle to a loaded library,
    // released when the `Library` drops.
    unsafe { Library::open(Some(path), RTLD_NOW | libc::RTLD_NOLOAD) }.is_ok()
}

fn open_memfd(bytes: &[u8]) -> Result<(Library, Option<File>), MemfdError> {
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"tessera-module".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemfdError::Unavailable);
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(bytes).map_err(|e| MemfdError::Load(format!("cannot write the in-memory file: {e}")))?;
    let mut path = proc_path(file.as_raw_fd());
    if !path.exists() {
        return Err(MemfdError::Unavailable);
    }
    for _ in 0..16 {
        if !name_in_use(&path) {
            break;
        }
        // SAFETY: duplicating an open descriptor onto a higher free number; the result is checked.
        let dup = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, file.as_raw_fd() + 1) };
        if dup < 0 {
            return Err(MemfdError::Load(format!("cannot duplicate the in-memory file: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: a fresh descriptor; the old one closes when `file` is replaced.
        file = unsafe { File::from_raw_fd(dup) };
        path = proc_path(dup);
    }
    // SAFETY: loading runs the library's initializers: module bytes come from a backend of ours through a
    // digest-checked artifact.
    let lib = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| MemfdError::Load(format!("dlopen failed: {e}")))?;
    Ok((lib, Some(file)))
}

fn open_temp_file(bytes: &[u8]) -> Result<Library, String> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("tessera-module-{}-{n}.so", std::process::id()));
    let written = File::options()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .map_err(|e| format!("cannot write temporary file {}: {e}", path.display()));
    // SAFETY: as in `open_memfd`.
    let lib = written.and_then(|_| unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| format!("dlopen failed: {e}")));
    let _ = std::fs::remove_file(&path);
    lib
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_row_once_in_order() {
        for (n, grain, threads) in [(0, 1, 2), (1, 1, 2), (7, 1, 2), (128, 11, 2), (1536, 1, 16), (100, 1000, 4), (10, 3, 1)] {
            let r = ranges(n, grain, threads);
            let mut next = 0;
            for &(lo, hi) in &r {
                assert_eq!(lo, next, "{n} {grain} {threads}: {r:?}");
                assert!(hi > lo);
                next = hi;
            }
            assert_eq!(next, n, "{n} {grain} {threads}: {r:?}");
            assert!(r.len() <= 4 * threads);
            assert!(r.iter().all(|(lo, hi)| hi - lo >= grain.min(n)), "{n} {grain} {threads}: {r:?}");
        }
    }

    #[test]
    fn non_elf_bytes_are_refused() {
        let m = Module { backend: "c".into(), target: "llvm".into(), format: FORMAT, functions: vec![], bytes: b"hello".to_vec() };
        let e = SharedObject::load(&m).err().unwrap();
        assert!(e.0.contains("backend c") && e.0.contains("not an ELF"), "{e}");
    }

    #[test]
    fn truncated_elf_is_an_error() {
        let m = Module { backend: "c".into(), target: "llvm".into(), format: FORMAT, functions: vec![], bytes: b"\x7fELF\x02\x01\x01".to_vec() };
        let e = SharedObject::load(&m).err().unwrap();
        assert!(e.0.contains("dlopen failed"), "{e}");
    }
}
