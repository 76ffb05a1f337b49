//! Module loading: every module format and the loader that turns a module of that format into a
//! [`LoadedModule`]. Each backend's run side is one module of the runtime named after the backend, which
//! defines its [`ModuleFormat`] (`FORMAT`: a name and a place) beside its loader; [`BUILTIN`] is the one line
//! per format that registers them. An explicit list, not one collected before `main` as the compiler's
//! backends are: this crate is linked into C programs as a static library, and a C linker pulls from an
//! archive only the objects whose symbols it needs, so a registration no code refers to would be dropped
//! (runtime-c's static test caught exactly that).
//!
//! A [`Registry`] is a value: [`Registry::builtin`] holds this crate's formats, and code outside the crate
//! (a backend developed out of tree, a test) adds its own loader for a [`ModuleFormat::named`] format to a
//! copy with [`Registry::with`] and loads artifacts through it
//! ([`Executable::load_with`](super::Executable::load_with)). Lookups scan a short vector in registration
//! order; nothing is hashed.

use super::{c, cuda, gemm, LoadedModule, RuntimeError};
use crate::module::{Module, ModuleFormat};
use std::sync::{Arc, OnceLock};

/// Loads modules of one format.
pub trait ModuleLoader: Send + Sync {
    /// Loads (and validates) `m`; an error names the module's backend.
    fn load(&self, m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError>;
}

impl<F> ModuleLoader for F
where
    F: Fn(&Module) -> Result<Box<dyn LoadedModule>, RuntimeError> + Send + Sync,
{
    fn load(&self, m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
        self(m)
    }
}

type LoadFn = fn(&Module) -> Result<Box<dyn LoadedModule>, RuntimeError>;

/// This crate's module formats and their loaders: one line per format.
const BUILTIN: &[(&ModuleFormat, LoadFn)] = &[
    (&c::FORMAT, c::loader),
    (&gemm::FORMAT, gemm::loader),
    (&cuda::FORMAT, cuda::loader),
    (&cuda::PARAMS_FORMAT, cuda::loader),
    (&cuda::LEGACY_FORMAT, cuda::loader),
    (&cuda::blas::FORMAT, cuda::blas::loader),
    (&cuda::dnn::FORMAT, cuda::dnn::loader),
];

/// Module format -> loader, at most one loader per format.
#[derive(Clone, Default)]
pub struct Registry {
    loaders: Vec<(ModuleFormat, Arc<dyn ModuleLoader>)>,
}

impl Registry {
    /// A registry with no formats.
    pub fn empty() -> Registry {
        Registry::default()
    }

    /// The formats of this crate ([`BUILTIN`]), built once.
    pub fn builtin() -> &'static Registry {
        static BUILT: OnceLock<Registry> = OnceLock::new();
        BUILT.get_or_init(|| {
            let mut r = Registry::empty();
            for (format, load) in BUILTIN {
                r.add((*format).clone(), Arc::new(*load)).expect("built-in formats are distinct");
            }
            r
        })
    }

    /// Adds the loader of `format`; a format that already has one is an error naming it.
    pub fn add(&mut self, format: ModuleFormat, loader: Arc<dyn ModuleLoader>) -> Result<(), RuntimeError> {
        if self.loaders.iter().any(|(f, _)| *f == format) {
            return Err(RuntimeError(format!("module format {format} already has a loader")));
        }
        self.loaders.push((format, loader));
        Ok(())
    }

    /// This registry with the loader of `format` added (see [`add`](Self::add)).
    pub fn with(mut self, format: ModuleFormat, loader: impl ModuleLoader + 'static) -> Result<Registry, RuntimeError> {
        self.add(format, Arc::new(loader))?;
        Ok(self)
    }

    /// The registered formats, in registration order.
    pub fn formats(&self) -> impl Iterator<Item = &ModuleFormat> {
        self.loaders.iter().map(|(f, _)| f)
    }

    /// Loads `m` with the loader of its format.
    pub fn load(&self, m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
        match self.loaders.iter().find(|(f, _)| *f == m.format) {
            Some((_, loader)) => loader.load(m),
            None => {
                let known: Vec<String> = self.formats().map(|f| f.to_string()).collect();
                Err(RuntimeError(format!(
                    "module of backend {} (target {}): format {} has no loader in this runtime (formats: {})",
                    m.backend,
                    m.target,
                    m.format,
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )))
            }
        }
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
