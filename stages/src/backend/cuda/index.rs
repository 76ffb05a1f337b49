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
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_as_cuda_reads() {
        let (m, n, k, z) = (Ix::var("m"), Ix::var("n"), Ix::var("k"), Ix::var("z"));
        assert_eq!(Ix::sum([Ix::var("abase"), m.clone() * 64, k.clone()]).to_string(), "abase + m * 64u + k");
        assert_eq!(((z.clone() * 8 + m.clone()) * 3136 + k * 1).to_string(), "(z * 8u + m) * 3136u + k");
        let nchw = (n.clone() / 49 * 256 + z * 64 + m) * 49 + n % 49;
        assert_eq!(nchw.to_string(), "((n / 49u) * 256u + z * 64u + m) * 49u + (n % 49u)");
        assert_eq!(Ix::sum([Ix::Lit(0), Ix::Batch(1) * 0]).to_string(), "0u");
        assert_eq!(batch_offset(&[0, 4, 1], 10).to_string(), "zb1 * 40u + zb2 * 10u");
    }

    /// A random tree over `m` and `n`, with its value at (m, n) computed alongside.
    fn tree() -> impl Strategy<Value = Ix> {
        let leaf = prop_oneof![Just(Ix::var("m")), Just(Ix::var("n")), (0usize..50).prop_map(Ix::Lit)];
        leaf.prop_recursive(4, 24, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Ix::sum),
                (inner.clone(), 0usize..9).prop_map(|(x, c)| x * c),
                (inner.clone(), 1usize..9).prop_map(|(x, c)| x / c),
                (inner, 1usize..9).prop_map(|(x, c)| x % c),
            ]
        })
    }

    fn eval(x: &Ix, m: u64, n: u64) -> u64 {
        match x {
            Ix::Var("m") => m,
            Ix::Var(_) => n,
            Ix::Batch(_) => unreachable!(),
            Ix::Lit(v) => *v as u64,
            Ix::Sum(t) => t.iter().map(|t| eval(t, m, n)).sum(),
            Ix::Mul(x, c) => eval(x, m, n) * *c as u64,
            Ix::Div(x, c) => eval(x, m, n) / *c as u64,
            Ix::Rem(x, c) => eval(x, m, n) % *c as u64,
        }
    }

    /// Evaluates the rendered text as C reads it (left-associative `*`, `/`, `%` above `+`).
    fn eval_text(s: &str, m: u64, n: u64) -> u64 {
        fn sum(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, m: u64, n: u64) -> u64 {
            let mut v = product(t, m, n);
            while t.peek().map(String::as_str) == Some("+") {
                t.next();
                v += product(t, m, n);
            }
            v
        }
        fn product(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, m: u64, n: u64) -> u64 {
            let mut v = atom(t, m, n);
            while let Some(op) = t.peek().cloned().filter(|o| o == "*" || o == "/" || o == "%") {
                t.next();
                let r = atom(t, m, n);
                v = match op.as_str() {
                    "*" => v * r,
                    "/" => v / r,
                    _ => v % r,
                };
            }
            v
        }
        fn atom(t: &mut std::iter::Peekable<std::vec::IntoIter<String>>, m: u64, n: u64) -> u64 {
            let a = t.next().expect("an operand");
            match a.as_str() {
                "(" => {
                    let v = sum(t, m, n);
                    assert_eq!(t.next().as_deref(), Some(")"));
                    v
                }
                "m" => m,
                "n" => n,
                lit => lit.trim_end_matches('u').parse().expect("a literal"),
            }
        }
        let spaced = s.replace('(', " ( ").replace(')', " ) ");
        let tokens: Vec<String> = spaced.split_whitespace().map(String::from).collect();
        let mut it = tokens.into_iter().peekable();
        let v = sum(&mut it, m, n);
        assert!(it.next().is_none(), "trailing text in {s}");
        v
    }

    proptest! {
        /// The text means what the tree means: no precedence slip in the rendering.
        #[test]
        fn rendering_keeps_the_meaning(x in tree(), m in 0u64..1000, n in 0u64..1000) {
            prop_assert_eq!(eval_text(&x.to_string(), m, n), eval(&x, m, n), "{}", x);
        }
    }
}
