//! Same inputs, same bytes, on any number of threads: a model whose `c` kernels run their rows in parallel
//! ranges (attention's query rows, LayerNorm rows, a large GELU) and whose gemm kernels cut their GEMMs per
//! thread gives the same output bytes on 1, 2 and 3 runtime threads (`tessera run --threads`).

mod common {
    pub mod cli;
}

use common::cli::ok;
use std::collections::BTreeMap;
use std::path::Path;

/// Every `.npy` file `tessera run` wrote in `dir` (outputs and the drawn inputs), by name.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "npy"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect()
}

#[test]
fn outputs_are_the_same_bytes_on_any_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // BERT-mini: 4 heads of 128 query rows, LayerNorm over 128 rows of 256, GELU over 128 x 1024.
    ok(&["compile", "fixture:bert-mini:b1", "--target", "cpu", "--target", "cpu -compiler=gemm", "--costs", "analytical", "--store", "s", "--out", "o", "-q"], t);
    let artifact = t.join("o/bert-mini-b1.tsr");
    // The code does run rows in parallel: the generated C calls the runtime's parallel-for.
    let bytes = std::fs::read(&artifact).unwrap();
    assert!(bytes.windows(b"tsr_set_parallel".len()).any(|w| w == b"tsr_set_parallel"), "no module with parallel loops");
    let mut runs = Vec::new();
    for threads in ["1", "2", "3"] {
        let out = format!("run-{threads}");
        ok(&["run", artifact.to_str().unwrap(), "--out", &out, "--seed", "7", "--threads", threads, "-q"], t);
        let f = files(&t.join(&out));
        assert!(f.len() >= 2, "inputs and outputs written: {:?}", f.keys().collect::<Vec<_>>());
        runs.push((threads, f));
    }
    for (threads, f) in &runs[1..] {
        for (name, b) in f {
            assert!(runs[0].1.get(name) == Some(b), "{name} differs between 1 and {threads} threads");
        }
        assert_eq!(f.len(), runs[0].1.len());
    }
}
