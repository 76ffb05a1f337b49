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
