use super::*;

#[test]
fn levels_need_their_features() {
    let none = |_: &str| false;
    let all = |_: &str| true;
    let no_avx2 = |f: &str| f != "avx2";
    assert!(missing("cpu -compiler=c -march=generic -opt-level=3", &none).is_empty());
    assert!(missing("llvm", &none).is_empty());
    assert!(missing("cpu -march=native", &none).is_empty(), "native cannot be checked");
    assert_eq!(missing("cpu -march=x86-64-v2", &none), X86_64_V2);
    assert!(missing("cpu -march=x86-64-v3", &all).is_empty());
    assert_eq!(missing("cpu -compiler=c -march=x86-64-v3 -opt-level=3", &no_avx2), ["avx2"]);
}

#[test]
fn the_error_names_the_level_and_the_features() {
    assert!(check("cpu -march=generic").is_ok());
    let e = check_with("cpu -compiler=c -march=x86-64-v3", &|f| f != "fma" && f != "movbe").unwrap_err();
    assert_eq!(e, "compiled for -march=x86-64-v3, but this CPU lacks fma, movbe (recompile with -march=generic)");
}
