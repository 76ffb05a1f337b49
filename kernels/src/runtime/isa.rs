//! Whether this CPU has the instruction set a shared-object module was compiled for.
//!
//! The `c` backend compiles with the target's `-march` (`generic`, `x86-64-v2`, `x86-64-v3` or `native`),
//! which the module records in its canonical target string. Code for a level this CPU lacks would die of
//! SIGILL in the middle of a run; checking before `dlopen` turns that into an error naming the module and
//! the missing features. `native` records no level (it means "the build machine"), so it cannot be checked
//! here; `tessera targets` says it ties artifacts to the build machine.

/// The x86-64 micro-architecture levels' features (psABI), as `is_x86_feature_detected!` names them.
const X86_64_V2: &[&str] = &["cmpxchg16b", "popcnt", "sse3", "ssse3", "sse4.1", "sse4.2"];
const X86_64_V3: &[&str] = &["avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"];

/// The `-march=` value of a canonical target string, if it has one.
fn march(target: &str) -> Option<&str> {
    target.split_whitespace().find_map(|t| t.strip_prefix("-march="))
}

/// The features `target` needs that `has` says are missing, in psABI order.
fn missing(target: &str, has: &dyn Fn(&str) -> bool) -> Vec<&'static str> {
    let needed: Vec<&'static str> = match march(target) {
        Some("x86-64-v2") => X86_64_V2.to_vec(),
        Some("x86-64-v3") => X86_64_V2.iter().chain(X86_64_V3).copied().collect(),
        _ => Vec::new(),
    };
    needed.into_iter().filter(|f| !has(f)).collect()
}

#[cfg(target_arch = "x86_64")]
fn cpu_has(feature: &str) -> bool {
    match feature {
        "cmpxchg16b" => std::is_x86_feature_detected!("cmpxchg16b"),
        "popcnt" => std::is_x86_feature_detected!("popcnt"),
        "sse3" => std::is_x86_feature_detected!("sse3"),
        "ssse3" => std::is_x86_feature_detected!("ssse3"),
        "sse4.1" => std::is_x86_feature_detected!("sse4.1"),
        "sse4.2" => std::is_x86_feature_detected!("sse4.2"),
        "avx" => std::is_x86_feature_detected!("avx"),
        "avx2" => std::is_x86_feature_detected!("avx2"),
        "bmi1" => std::is_x86_feature_detected!("bmi1"),
        "bmi2" => std::is_x86_feature_detected!("bmi2"),
        "f16c" => std::is_x86_feature_detected!("f16c"),
        "fma" => std::is_x86_feature_detected!("fma"),
        "lzcnt" => std::is_x86_feature_detected!("lzcnt"),
        "movbe" => std::is_x86_feature_detected!("movbe"),
        "xsave" => std::is_x86_feature_detected!("xsave"),
        _ => false,
    }
}

/// Another architecture has none of x86-64's features (and could not load its shared objects anyway).
#[cfg(not(target_arch = "x86_64"))]
fn cpu_has(_: &str) -> bool {
    false
}

/// An error naming the missing features when this CPU cannot run code compiled for `target`.
pub fn check(target: &str) -> Result<(), String> {
    check_with(target, &cpu_has)
}

fn check_with(target: &str, has: &dyn Fn(&str) -> bool) -> Result<(), String> {
    let lacking = missing(target, has);
    if lacking.is_empty() {
        return Ok(());
    }
    Err(format!(
        "compiled for -march={}, but this CPU lacks {} (recompile with -march=generic)",
        march(target).unwrap_or("?"),
        lacking.join(", ")
    ))
}

#[cfg(test)]
#[path = "isa_tests.rs"]
mod tests;
