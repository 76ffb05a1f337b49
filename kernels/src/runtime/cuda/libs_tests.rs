use super::*;

#[test]
fn a_missing_toolkit_or_driver_is_an_error_not_a_panic() {
    // Either outcome is fine; what matters is that asking never panics, and an error says what to do.
    if let Err(e) = toolkit() {
        assert!(e.is_unavailable(), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("NVRTC") && e.contains("TESSERA_CUDA_HOME"), "{e}");
    }
    if let Err(e) = driver() {
        assert!(e.is_unavailable(), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("libcuda"), "{e}");
    }
}
