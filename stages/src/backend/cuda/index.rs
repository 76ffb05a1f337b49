//! Index expressions: how a generated kernel addresses an operand or its output, kept as a small typed tree
//! (coordinates, constants, sums, and products, quotients and remainders by constants) and rendered to CUDA
//! where the kernel is written, so a GEMM's loaders are data that can be built, compared and tested, not text.
//!
//! Arithmetic is unsigned 32-bit, as the kernels index: the tree's constants render with a `u` suffix, so an
//! `int` coordinate beside them converts to `unsigned`.

use std::fmt;
use std::ops::{Add, Div, Mul, Rem};

/// An unsigned index over the coordinates in scope where it is rendered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ix {
    /// A coordinate in scope: `m`, `n`, `k`, `z` (batch or group), `i` (a flat output index), `abase`, ...
    Var(&'static str),
    /// Batch coordinate `d`, `zb{d}` (see [`super::kernel::coords`]).
    Batch(usize),
    Lit(usize),
    Sum(Vec<Ix>),
    Mul(Box<Ix>, usize),
    Div(Box<Ix>, usize),
    Rem(Box<Ix>, usize),
}

impl Ix {
    pub fn var(name: &'static str) -> Ix {
        Ix::Var(name)
    }

    /// The sum of `terms`, zeros dropped and nested sums flattened.
    pub fn sum(terms: impl IntoIterator<Item = Ix>) -> Ix {
        let mut flat = Vec::new();
        for t in terms {
            match t {
                Ix::Lit(0) => {}
                Ix::Sum(inner) => flat.extend(inner),
                t => flat.push(t),
            }
        }
        match flat.len() {
            0 => Ix::Lit(0),
            1 => flat.pop().unwrap(),
            _ => Ix::Sum(flat),
        }
    }

    /// Precedence of the rendered expression: 1 a sum, 2 a product or quotient, 3 an atom.
    fn precedence(&self) -> u8 {
        match self {
            Ix::Sum(_) => 1,
            Ix::Mul(..) | Ix::Div(..) | Ix::Rem(..) => 2,
            _ => 3,
        }
    }

    /// Renders `self` as the left operand of `*`, `/` or `%` (a sum parenthesized).
    fn operand(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.precedence() < 2 {
            write!(f, "({self})")
        } else {
            write!(f, "{self}")
        }
    }
}

impl Add for Ix {
    type Output = Ix;
    fn add(self, other: Ix) -> Ix {
        Ix::sum([self, other])
    }
}

impl Mul<usize> for Ix {
    type Output = Ix;
    fn mul(self, c: usize) -> Ix {
        match (self, c) {
            (_, 0) | (Ix::Lit(0), _) => Ix::Lit(0),
            (x, 1) => x,
            (Ix::Lit(v), c) => Ix::Lit(v * c),
            (x, c) => Ix::Mul(Box::new(x), c),
        }
    }
}

impl Div<usize> for Ix {
    type Output = Ix;
    fn div(self, c: usize) -> Ix {
        assert!(c > 0, "an index divided by zero");
        if c == 1 {
            self
        } else {
            Ix::Div(Box::new(self), c)
        }
    }
}

impl Rem<usize> for Ix {
    type Output = Ix;
    fn rem(self, c: usize) -> Ix {
        assert!(c > 0, "an index modulo zero");
        Ix::Rem(Box::new(self), c)
    }
}

impl fmt::Display for Ix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ix::Var(v) => f.write_str(v),
            Ix::Batch(d) => write!(f, "zb{d}"),
            Ix::Lit(v) => write!(f, "{v}u"),
            Ix::Sum(terms) => {
                for (i, t) in terms.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    write!(f, "{t}")?;
                }
                Ok(())
            }
            Ix::Mul(x, c) => {
                x.operand(f)?;
                write!(f, " * {c}u")
            }
            // Parenthesized whole: `(x / 4u) * 3u` reads unambiguously, and so does `a + (x / 4u)`.
            Ix::Div(x, c) => {
                f.write_str("(")?;
                x.operand(f)?;
                write!(f, " / {c}u)")
            }
            Ix::Rem(x, c) => {
                f.write_str("(")?;
                x.operand(f)?;
                write!(f, " % {c}u)")
            }
        }
    }
}

/// `sum over d of Batch(d) * strides[d]` (zero strides, broadcast axes, dropped).
pub fn batch_offset(strides: &[i64], scale: usize) -> Ix {
    Ix::sum(strides.iter().enumerate().map(|(d, &s)| {
        assert!(s >= 0, "batch strides of a GEMM operand are not negative");
        Ix::Batch(d) * (s as usize * scale)
    }))
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
