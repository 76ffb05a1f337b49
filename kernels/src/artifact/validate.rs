//! Every structural check of a decoded body: indices, types against each function's signature, dataflow
//! order, bounds of every buffer in the arena and the data section, and the memory plan's soundness. The
//! linker runs the same checks on what it is about to write, so a file that reads back is one the runtime can
//! execute without further checks: the runtime's pointer arithmetic relies on them.

use super::plan::{find_overlap, requests};
use super::{slot_bytes, Body, BodyError, Buf, ALIGN};
use crate::module::Place;
use std::collections::BTreeSet;
use crate::tensor::TensorType;

fn unique_names<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), BodyError> {
    let mut seen = BTreeSet::new();
    for n in names {
        if n.is_empty() {
            return Err(BodyError::Structure(format!("an {what} has an empty name")));
        }
        if !seen.insert(n) {
            return Err(BodyError::Structure(format!("two {what}s are named '{n}'")));
        }
    }
    Ok(())
}

fn in_bounds(what: impl Fn() -> String, offset: u64, size: u64, limit: u64) -> Result<(), BodyError> {
    if !offset.is_multiple_of(ALIGN) {
        return Err(BodyError::Bounds(format!("{} is at offset {offset}, not {ALIGN}-byte aligned", what())));
    }
    match offset.checked_add(size) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(BodyError::Bounds(format!("{} ({size} bytes at offset {offset}) lies outside its {limit}-byte region", what()))),
    }
}

/// Largest buffer an artifact may describe (256 TiB): every size below it, rounded up to the alignment
/// and summed over a body's buffers, stays far from overflowing a u64.
pub const MAX_BUFFER_BYTES: u64 = 1 << 48;

/// Checks that a type's size is computable (no overflow) and below [`MAX_BUFFER_BYTES`], before any
/// other check computes it: a shape from a hostile file must not wrap around to a small size.
fn sized(what: impl Fn() -> String, ty: &TensorType) -> Result<(), BodyError> {
    let bytes = ty.shape.iter().try_fold(ty.dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
    match bytes {
        Some(n) if n <= MAX_BUFFER_BYTES => Ok(()),
        _ => Err(BodyError::Bounds(format!("{} has type {ty}, whose size is beyond {MAX_BUFFER_BYTES} bytes", what()))),
    }
}

/// Every type a body names has a sane size (see [`sized`]).
fn sizes(b: &Body) -> Result<(), BodyError> {
    for d in &b.inputs {
        sized(|| format!("input '{}'", d.name), &d.ty)?;
    }
    for d in &b.outputs {
        sized(|| format!("output '{}'", d.name), &d.ty)?;
    }
    for (i, v) in b.values.iter().enumerate() {
        sized(|| format!("value %{i}"), &v.ty)?;
    }
    for (i, c) in b.constants.iter().enumerate() {
        sized(|| format!("constant {i}"), &c.ty)?;
    }
    for (m, module) in b.modules.iter().enumerate() {
        for (f, func) in module.functions.iter().enumerate() {
            for ty in func.inputs.iter().chain(&func.outputs) {
                sized(|| format!("module {m} (backend {}) function {f} ('{}')", module.backend, func.symbol), ty)?;
            }
        }
    }
    Ok(())
}

/// Checks a body whose data section is `data_len` bytes long; the message says what is wrong and where.
pub fn body(b: &Body, data_len: u64) -> Result<(), BodyError> {
    sizes(b)?;
    // The runtime allocates the arena and the scratch buffer by these sizes: they must be what the
    // buffers need (a plan only saves on the sum of the slots; scratch is the largest any function declares).
    let unplanned = b.unplanned_bytes();
    if b.arena_bytes > unplanned {
        return Err(BodyError::Bounds(format!("the arena is {} bytes, more than all inputs and values together ({unplanned})", b.arena_bytes)));
    }
    let scratch = b.modules.iter().flat_map(|m| m.functions.iter().map(|f| f.scratch_bytes)).max().unwrap_or(0);
    if b.scratch_bytes > scratch {
        return Err(BodyError::Bounds(format!("the scratch buffer is {} bytes, more than any function declares ({scratch})", b.scratch_bytes)));
    }
    unique_names("input", b.inputs.iter().map(|d| d.name.as_str()))?;
    unique_names("output", b.outputs.iter().map(|d| d.name.as_str()))?;
    for d in &b.inputs {
        in_bounds(|| format!("input '{}'", d.name), d.offset, slot_bytes(&d.ty), b.arena_bytes)?;
        if d.int_bound < 1 {
            return Err(BodyError::Structure(format!("input '{}' has random integer bound {}, below 1", d.name, d.int_bound)));
        }
    }
    for (i, v) in b.values.iter().enumerate() {
        in_bounds(|| format!("value %{i}"), v.offset, slot_bytes(&v.ty), b.arena_bytes)?;
    }
    for (i, c) in b.constants.iter().enumerate() {
        in_bounds(|| format!("constant {i}"), c.offset, c.ty.size_bytes() as u64, data_len)?;
    }
    for (m, module) in b.modules.iter().enumerate() {
        for (f, func) in module.functions.iter().enumerate() {
            if func.symbol.is_empty() {
                return Err(BodyError::Structure(format!("module {m} (backend {}): function {f} has an empty symbol", module.backend)));
            }
        }
    }
    let mut written = vec![false; b.values.len()];
    // Where each value's bytes are: the place of the step that wrote it, and the other place once a
    // transfer has copied it there. Inputs and constants are in both places from the start.
    let mut at_place: Vec<[bool; 2]> = vec![[false; 2]; b.values.len()];
    let slot = |p: Place| p as usize;
    let mut next_transfer = 0usize;
    for (s, step) in b.steps.iter().enumerate() {
        let module = b.modules.get(step.module as usize).ok_or_else(|| BodyError::Structure(format!("step {s} calls module {} of {}", step.module, b.modules.len())))?;
        let place = module.format.place();
        while let Some(t) = b.transfers.get(next_transfer).filter(|t| t.before as usize == s) {
            let what = || format!("transfer {next_transfer} (value %{} to the {} before step {s})", t.value, t.to);
            let Some(&[host, gpu]) = at_place.get(t.value as usize) else {
                return Err(BodyError::Structure(format!("{}: the value does not exist", what())));
            };
            if t.to != place {
                return Err(BodyError::Structure(format!("{}: step {s} runs on the {place}, a transfer goes where the step it precedes runs", what())));
            }
            if !host && !gpu {
                return Err(BodyError::Structure(format!("{}: no step has written the value yet", what())));
            }
            if at_place[t.value as usize][slot(t.to)] {
                return Err(BodyError::Structure(format!("{}: the value is there already", what())));
            }
            at_place[t.value as usize][slot(t.to)] = true;
            next_transfer += 1;
        }
        let f = module.functions.get(step.function as usize).ok_or_else(|| {
            BodyError::Structure(format!("step {s} calls function {} of module {} (backend {}), which has {}", step.function, step.module, module.backend, module.functions.len()))
        })?;
        let at = |k: usize| format!("step {s} (backend {}, function '{}') argument {k}", module.backend, f.symbol);
        if step.args.len() != f.arity() {
            return Err(BodyError::Structure(format!(
                "step {s} (backend {}, function '{}') has {} arguments, the function takes {} ({} inputs, {} outputs{})",
                module.backend,
                f.symbol,
                step.args.len(),
                f.arity(),
                f.inputs.len(),
                f.outputs.len(),
                if f.scratch_bytes > 0 { ", scratch" } else { "" }
            )));
        }
        let expect = |k: usize, arg: Buf, want: &TensorType| -> Result<(), BodyError> {
            match b.buf_type(arg) {
                None => Err(BodyError::Structure(format!("{}: {arg} does not exist", at(k)))),
                Some(t) if t != want => Err(BodyError::Structure(format!("{}: {arg} is {t}, the function expects {want}", at(k)))),
                Some(_) => Ok(()),
            }
        };
        let n_in = f.inputs.len();
        for (k, want) in f.inputs.iter().enumerate() {
            let arg = step.args[k];
            expect(k, arg, want)?;
            if let Buf::Value(v) = arg {
                if !written[v as usize] {
                    return Err(BodyError::Structure(format!("{}: reads value %{v} before any step writes it", at(k))));
                }
                if !at_place[v as usize][slot(place)] {
                    return Err(BodyError::Structure(format!("{}: reads value %{v} on the {place}, where it is not (a transfer is missing)", at(k))));
                }
            }
        }
        for (j, want) in f.outputs.iter().enumerate() {
            let k = n_in + j;
            let arg = step.args[k];
            let Buf::Value(v) = arg else {
                return Err(BodyError::Structure(format!("{}: an output must be a value, got {arg}", at(k))));
            };
            expect(k, arg, want)?;
            if std::mem::replace(&mut written[v as usize], true) {
                return Err(BodyError::Structure(format!("{}: value %{v} is written a second time", at(k))));
            }
            at_place[v as usize][slot(place)] = true;
        }
        if f.scratch_bytes > 0 {
            let k = step.args.len() - 1;
            if step.args[k] != Buf::Scratch {
                return Err(BodyError::Structure(format!("{}: the last argument must be the scratch buffer", at(k))));
            }
            if f.scratch_bytes > b.scratch_bytes {
                return Err(BodyError::Structure(format!("{}: needs {} bytes of scratch, the plan has {}", at(k), f.scratch_bytes, b.scratch_bytes)));
            }
        }
    }
    if let Some(t) = b.transfers.get(next_transfer) {
        return Err(BodyError::Structure(format!(
            "transfer {next_transfer} (value %{} before step {}) is out of order or after the last step",
            t.value, t.before
        )));
    }
    if let Some(v) = written.iter().position(|w| !w) {
        return Err(BodyError::Structure(format!("value %{v} is never written by any step")));
    }
    for o in &b.outputs {
        match b.buf_type(o.source) {
            None => return Err(BodyError::Structure(format!("output '{}' refers to {}, which does not exist", o.name, o.source))),
            Some(t) if *t != o.ty => return Err(BodyError::Structure(format!("output '{}' is declared {} but {} is {t}", o.name, o.ty, o.source))),
            Some(_) => {}
        }
    }
    let reqs = requests(b);
    let offsets: Vec<u64> = b.inputs.iter().map(|d| d.offset).chain(b.values.iter().map(|v| v.offset)).collect();
    if let Some((x, y)) = find_overlap(&reqs, &offsets) {
        let name = |i: usize| if i < b.inputs.len() { format!("input '{}'", b.inputs[i].name) } else { format!("value %{}", i - b.inputs.len()) };
        return Err(BodyError::MemoryPlan(format!("memory plan: {} and {} are live at the same time and overlap", name(x), name(y))));
    }
    Ok(())
}
