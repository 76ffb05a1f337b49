//! The knobs of a kernel's GEMMs and tensor-core attention: the choices the `cuda` backend's configurations
//! (the tune stage's search space, `gemm::KNOB_SETTINGS`) set, which `gemm.rs` and `attention.rs` turn
//! into tile shapes and splits.

/// Which tile a GEMM takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TileChoice {
    /// The large tile where it fills the GPU, else the small one.
    #[default]
    Auto,
    Large,
    Small,
}

/// How a GEMM splits K.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitChoice {
    /// Enough slices to fill the GPU (none when the tiles already do).
    #[default]
    Auto,
    /// Never.
    None,
    /// Twice the automatic count (at most [`MAX_SPLITS`](super::gemm::MAX_SPLITS), slices at least `MIN_SLICE_K / 2` deep).
    Double,
}

/// How a block of the tensor-core attention kernel is shaped: warps of 16 query rows sharing each K/V tile,
/// or one warp of rows computed by several warps over slices of the keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionChoice {
    /// The per-problem default (`MmaTiles::for_problem`: the most warps whose blocks still fill the GPU, else
    /// the keys split).
    #[default]
    Auto,
    /// This many warps of rows, 64 keys per tile, the keys not split.
    Warps(u32),
    /// One warp of rows, the keys split (`MmaTiles::split_keys`).
    SplitKeys,
}

/// The knobs of every GEMM (and tensor-core attention) of a kernel: what the `cuda` backend's configurations set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    pub tiles: TileChoice,
    pub split: SplitChoice,
    pub attention: AttentionChoice,
}
