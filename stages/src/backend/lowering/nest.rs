//! Loop nests over a shape shared by several operands, each addressing it through its own strides.
//!
//! Every index loop the backend emits (fused elementwise loops, reductions, copies, broadcasts) goes through
//! here. Dimensions are coalesced jointly first: size-1 dimensions disappear and neighbours merge when every
//! operand walks them as one run (`stride[d] == stride[d+1] * dim[d+1]`), so a contiguous elementwise op is a
//! single flat loop that the C compiler vectorizes, and a broadcast keeps only the loops it needs.

/// Row-major strides, in elements, of a contiguous tensor of `shape`.
pub fn contiguous(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc *= shape[i] as i64;
    }
    s
}

/// Strides that read a tensor of `shape` broadcast (NumPy rules) to `out`: 0 on broadcast axes.
pub fn broadcast(shape: &[usize], out: &[usize]) -> Vec<i64> {
    let own = contiguous(shape);
    let lead = out.len() - shape.len();
    (0..out.len()).map(|i| if i < lead || shape[i - lead] == 1 { 0 } else { own[i - lead] }).collect()
}

/// A coalesced iteration space: `dims`, and per operand its stride on each dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nest {
    pub dims: Vec<usize>,
    pub strides: Vec<Vec<i64>>,
}

impl Nest {
    /// Coalesces `shape` jointly for every operand's strides (`strides[op][dim]`).
    pub fn new(shape: &[usize], strides: &[Vec<i64>]) -> Nest {
        let mut dims: Vec<usize> = Vec::new();
        let mut st: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
        for (d, &n) in shape.iter().enumerate() {
            if n == 1 {
                continue;
            }
            if !dims.is_empty() {
                let k = dims.len() - 1;
                if strides.iter().enumerate().all(|(o, s)| st[o][k] == s[d] * n as i64) {
                    dims[k] *= n;
                    for (o, s) in strides.iter().enumerate() {
                        st[o][k] = s[d];
                    }
                    continue;
                }
            }
            dims.push(n);
            for (o, s) in strides.iter().enumerate() {
                st[o].push(s[d]);
            }
        }
        Nest { dims, strides: st }
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// Offset expression of operand `op` over dims `from..to` with loop variables `{var}{k}`, added to `base`.
    pub fn offset(&self, op: usize, from: usize, to: usize, var: &str, base: &str) -> String {
        let mut terms: Vec<String> = Vec::new();
        if base != "0" && !base.is_empty() {
            terms.push(base.to_string());
        }
        for k in from..to {
            match self.strides[op][k] {
                0 => {}
                1 => terms.push(format!("{var}{k}")),
                s => terms.push(format!("{var}{k} * {s}")),
            }
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }

    /// Emits loops over dims `from..to` (loop variables `{var}{k}`, type long) around `body`, which gets
    /// every operand's offset (its `base` plus the loops' contribution).
    pub fn emit_range(&self, from: usize, to: usize, var: &str, base: &[String], body: impl FnOnce(&[String]) -> String) -> String {
        let offs: Vec<String> = (0..self.strides.len()).map(|o| self.offset(o, from, to, var, &base[o])).collect();
        let mut code = String::new();
        for k in from..to {
            code.push_str(&format!("for (long {var}{k} = 0; {var}{k} < {}; {var}{k}++) {{\n", self.dims[k]));
        }
        code.push_str(&body(&offs));
        for _ in from..to {
            code.push_str("}\n");
        }
        code
    }

    /// Loops over the whole nest.
    pub fn emit(&self, var: &str, body: impl FnOnce(&[String]) -> String) -> String {
        let base = vec!["0".to_string(); self.strides.len()];
        self.emit_range(0, self.rank(), var, &base, body)
    }
}

/// Splits a row-major index space `[rows..., cols...]` for one operand: the C expression of its offset
/// contributed by a flat row index `row` (over `row_dims`, with the operand's `row_strides`), computed by
/// division and remainder over the coalesced row dims (constant divisors, so multiplications in practice).
pub fn row_offset(row_dims: &[usize], row_strides: &[i64], row: &str) -> String {
    let nest = Nest::new(row_dims, &[row_strides.to_vec()]);
    let mut terms = Vec::new();
    let mut inner: usize = 1;
    for k in (0..nest.rank()).rev() {
        let s = nest.strides[0][k];
        let n = nest.dims[k];
        if s != 0 {
            let q = if inner == 1 { row.to_string() } else { format!("({row} / {inner})") };
            let c = if k == 0 { q } else { format!("({q} % {n})") };
            terms.push(if s == 1 { c } else { format!("{c} * {s}") });
        }
        inner *= n;
    }
    terms.reverse();
    if terms.is_empty() {
        "0".into()
    } else {
        terms.join(" + ")
    }
}

/// The single stride with which an operand walks `col_dims` as one flat run, if it does (a broadcast along
/// all of them gives 0); `None` when the walk needs more than one loop.
pub fn flat_stride(col_dims: &[usize], col_strides: &[i64]) -> Option<i64> {
    let nest = Nest::new(col_dims, &[col_strides.to_vec()]);
    match nest.rank() {
        0 => Some(0),
        1 => Some(nest.strides[0][0]),
        _ => None,
    }
}

#[cfg(test)]
#[path = "nest_tests.rs"]
mod tests;
