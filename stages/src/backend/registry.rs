//! Every backend of this build, and those a program embedding tessera registers at run time. A backend of this
//! crate registers itself from its own folder with one line, [`register_builtin!`] (its description for
//! target parsing, its constructor for [`all`], both collected before `main` by the `inventory` crate): no list
//! here or elsewhere names it. The pipeline asks each whether it can run here ([`super::Backend::available`]); targets select
//! them by their `-compiler` value.

use super::Backend;
use crate::target::BackendSpec;
use std::sync::{Arc, RwLock};

/// A backend of this crate: its description and its constructor.
pub struct Builtin {
    pub spec: &'static BackendSpec,
    pub make: fn() -> Box<dyn Backend>,
}

inventory::collect!(Builtin);

/// Registers a backend of this crate, from its folder: `register_builtin!(SPEC, FooBackend);` with its
/// [`BackendSpec`] static and a value of its type.
macro_rules! register_builtin {
    ($spec:path, $backend:expr) => {
        inventory::submit! { $crate::target::SpecEntry(&$spec) }
        inventory::submit! { $crate::backend::registry::Builtin { spec: &$spec, make: || Box::new($backend) } }
    };
}
pub(crate) use register_builtin;

type Make = Arc<dyn Fn() -> Box<dyn Backend> + Send + Sync>;

/// Backends registered at run time ([`register`]), in registration order.
static REGISTERED: RwLock<Vec<(&'static BackendSpec, Make)>> = RwLock::new(Vec::new());

/// Registers a backend built outside this crate for the rest of the process: its description (so targets
/// accept its `-compiler` value and options) and a constructor. Every build through the library's entry point
/// (the CLI's and Python's) then offers it. Registering the same description again is a no-op; a name or
/// `-compiler` value another backend has is an error naming both.
pub fn register(spec: &'static BackendSpec, make: impl Fn() -> Box<dyn Backend> + Send + Sync + 'static) -> Result<(), String> {
    let made = make();
    if !std::ptr::eq(made.spec(), spec) {
        return Err(format!("registering backend {}: its constructor makes a backend whose spec() is another ({})", spec.name, made.spec().name));
    }
    crate::target::register_spec(spec)?;
    let mut reg = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    if !reg.iter().any(|(s, _)| std::ptr::eq(*s, spec)) {
        reg.push((spec, Arc::new(make)));
    }
    Ok(())
}

/// All backends: this crate's in registry order (`BackendSpec::order`), then those registered at run time.
pub fn all() -> Vec<Box<dyn Backend>> {
    let mut builtin: Vec<&Builtin> = inventory::iter::<Builtin>.into_iter().collect();
    builtin.sort_by_key(|b| (b.spec.order, b.spec.name));
    let mut out: Vec<Box<dyn Backend>> = builtin.iter().map(|b| (b.make)()).collect();
    out.extend(REGISTERED.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, make)| make()));
    out
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
