//! The rule vocabulary of partitioning, beneath both the partitioner and the backends: what a backend says
//! about the candidates it wants (`Backend::rules`), and the epilogue chain ([`epilogue`]) that rules and
//! lowerings of MatMul and Conv chains share. Neither `partition` nor `backend` owns it; both import it.
//!
//! A [`Rule`] turns a graph into proto-candidates (node sets with a [`Kind`]):
//! - [`Rule::Primitive`]: every node the backend supports, alone (optionally only nodes of some kinds);
//! - [`Rule::Union`]: the candidates of several rules together;
//! - [`Rule::Combine`]: grows the candidates of a base rule, one adjacent supported node at a time, wherever a
//!   [`Combiner`] fires (elementwise/injective chains, epilogues onto an anchor, producers into an anchor,
//!   injective ops into a reduction), for at most `max_nodes - 1` rounds; it yields only the grown candidates;
//! - [`Rule::OnlyValid`]: keeps candidates that are convex, have at most `max_exits` outputs used outside, and
//!   stay within the depth and size bounds (and, in a rule set that uses [`Combiner::GemmEpilogue`], hold the
//!   whole chain of every epilogue they hold).
//!
//! Each backend gives its own rule set ([`crate::backend::Backend::rules`]); nothing here knows a backend by
//! name. The partitioner evaluates rules (`partition::collage::eval`).

pub mod epilogue;

use crate::ir::Op;

/// What a node computes, ordered from most to least fusible (TVM's pattern kinds, simplified).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// One output element from the same-index (broadcast) input elements; BatchNorm in inference counts.
    Elementwise,
    /// Data movement: each output element is one input element (reshape, transpose, slice, gather, ...).
    Injective,
    /// Reductions and ops built on them: Reduce*, Softmax, LogSoftmax, LayerNorm, pooling.
    Reduction,
    /// Compute-heavy ops libraries specialize in: MatMul, Conv, ConvTranspose, Attention.
    Anchor,
}

impl Kind {
    pub fn of(op: &Op) -> Kind {
        match op {
            Op::MatMul | Op::Conv(_) | Op::NhwcConv(_) | Op::ConvTranspose(_) | Op::Attention(_) => Kind::Anchor,
            Op::Reduce { .. }
            | Op::Softmax { .. }
            | Op::LogSoftmax { .. }
            | Op::LayerNorm { .. }
            | Op::MaxPool(_)
            | Op::NhwcMaxPool(_)
            | Op::AveragePool { .. }
            | Op::GlobalAveragePool => Kind::Reduction,
            Op::BatchNorm { .. } => Kind::Elementwise,
            op if op.is_elementwise() => Kind::Elementwise,
            _ => Kind::Injective,
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    pub const ALL: Kinds = Kinds(0b1111);
    pub const ELEMENTWISE: Kinds = Kinds(0b0001);
    /// Elementwise or injective.
    pub const INJECTIVE: Kinds = Kinds(0b0011);
    pub const REDUCTION: Kinds = Kinds(0b0100);
    pub const ANCHOR: Kinds = Kinds(0b1000);
    /// Anchors and reductions: what the c backend grows producers and epilogues around.
    pub const HEAVY: Kinds = Kinds(0b1100);

    pub fn has(self, k: Kind) -> bool {
        self.0 & k.bit() != 0
    }
}

/// When a candidate may absorb an adjacent node.
#[derive(Clone, Debug, PartialEq)]
pub enum Combiner {
    /// Joins an upstream part whose kind is in `upstream` with a downstream part whose kind is in `downstream`
    /// when a value flows from the first to the second. A candidate's kind is the greatest kind of its nodes.
    ByKind { upstream: Kinds, downstream: Kinds },
    /// gemm: adds an epilogue node whose fused input (as gemm's support rule decides on the model graph) is
    /// produced inside the candidate, so a candidate always holds each epilogue's chain back to its anchor.
    GemmEpilogue,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    Primitive { kinds: Kinds },
    Union(Vec<Rule>),
    Combine { base: Box<Rule>, combiners: Vec<Combiner> },
    OnlyValid(Box<Rule>),
}

impl Rule {
    /// The `c` backend's rule set, the fallback's: every node, elementwise/injective chains, anchors and
    /// reductions with their elementwise producers and consumers, injective ops into reductions.
    pub fn fusing_fallback() -> Rule {
        Rule::OnlyValid(Box::new(Rule::Union(vec![
            Rule::Primitive { kinds: Kinds::ALL },
            Rule::Combine {
                base: Box::new(Rule::Primitive { kinds: Kinds::ALL }),
                combiners: vec![
                    Combiner::ByKind { upstream: Kinds::INJECTIVE, downstream: Kinds::INJECTIVE },
                    Combiner::ByKind { upstream: Kinds::HEAVY, downstream: Kinds::ELEMENTWISE },
                    Combiner::ByKind { upstream: Kinds::ELEMENTWISE, downstream: Kinds::HEAVY },
                    Combiner::ByKind { upstream: Kinds::INJECTIVE, downstream: Kinds::REDUCTION },
                ],
            },
        ])))
    }

    /// The `gemm` backend's rule set: anchors alone and with their epilogue chains ([`Combiner::GemmEpilogue`]).
    pub fn anchors_with_epilogues() -> Rule {
        Rule::OnlyValid(Box::new(Rule::Union(vec![
            Rule::Primitive { kinds: Kinds::ANCHOR },
            Rule::Combine { base: Box::new(Rule::Primitive { kinds: Kinds::ANCHOR }), combiners: vec![Combiner::GemmEpilogue] },
        ])))
    }

    /// Whether [`Combiner::GemmEpilogue`] occurs anywhere in the rule (its `only_valid` then also checks
    /// epilogue chains).
    pub fn uses_gemm_epilogue(&self) -> bool {
        match self {
            Rule::Primitive { .. } => false,
            Rule::Union(rules) => rules.iter().any(Rule::uses_gemm_epilogue),
            Rule::Combine { base, combiners } => base.uses_gemm_epilogue() || combiners.contains(&Combiner::GemmEpilogue),
            Rule::OnlyValid(rule) => rule.uses_gemm_epilogue(),
        }
    }
}
