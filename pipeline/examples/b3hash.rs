//! Hashes each file given with blake3 the way `tessera compile` hashes model files (memory-mapped, on every
//! core: `update_mmap_rayon`) and prints the digests: the yardstick of bench/compile_times.md's warm rebuilds
//! (`cargo build --release -p tessera --example b3hash`; `scripts/bench_warm.py` times it).

fn main() {
    for p in std::env::args().skip(1) {
        let mut h = blake3::Hasher::new();
        if let Err(e) = h.update_mmap_rayon(&p) {
            eprintln!("{p}: {e}");
            std::process::exit(1);
        }
        println!("{}  {p}", h.finalize().to_hex());
    }
}
