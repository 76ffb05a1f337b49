use super::*;

#[test]
fn canonical_form_fills_defaults_and_sorts() {
    let a = Target::parse("cpu -opt-level=3 -compiler=c").unwrap();
    let b = Target::parse(r#"{"kind": "cpu", "compiler": "c", "opt-level": 3}"#).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.digest(), b.digest());
    assert_eq!(a.canonical(), "cpu -compiler=c -fast-math=false -march=generic -opt-level=3");
    assert_eq!(Target::parse(&a.canonical()).unwrap(), a);
    assert_eq!(a.backend_name(), "c");
    // A backend's target holds the kind's attributes and its own options only.
    let g = Target::parse("cpu -compiler=gemm").unwrap();
    assert_eq!(g.canonical(), "cpu -compiler=gemm");
    assert_eq!(g.backend_name(), "gemm");
    assert!(!g.is_least_specialized());
    let n = Target::parse("cuda -compiler=cudnn -precision=fp16").unwrap();
    assert_eq!(n.canonical(), "cuda -arch=sm_90 -compiler=cudnn -layout=auto -overflow=keep-fp32 -precision=fp16 -tune-configs=16");
}

#[test]
fn flags_and_double_dashes() {
    let t = Target::parse("cpu --fast-math").unwrap();
    assert!(t.bool_attr("fast-math"));
    assert_eq!(t.backend_name(), "c");
    assert!(t.is_least_specialized());
}

#[test]
fn errors_list_what_is_valid() {
    let e = Target::parse("tpu").unwrap_err().0;
    assert!(e.contains("unknown kind 'tpu'") && e.contains("cpu, cuda"), "{e}");
    let e = Target::parse("cpu -foo=1").unwrap_err().0;
    assert!(e.contains("unknown attribute '-foo'") && e.contains("-opt-level"), "{e}");
    let e = Target::parse("cpu -opt-level=7").unwrap_err().0;
    assert!(e.contains("out of range 0..=3"), "{e}");
    let e = Target::parse("cuda -compiler=tensorrt").unwrap_err().0;
    assert!(e.contains("nvrtc, cublas, cudnn, cutlass") && !e.contains("tensorrt,"), "only values with a backend behind them: {e}");
    // Another backend's option is not this one's, and the message lists this one's.
    let e = Target::parse("cpu -compiler=gemm -opt-level=3").unwrap_err().0;
    assert!(e.contains("unknown attribute '-opt-level'") && e.contains("backend gemm") && e.contains("valid attributes: -compiler"), "{e}");
    let e = Target::parse("cuda -compiler=cublas -fast-math").unwrap_err().0;
    assert!(e.contains("'-fast-math'") && e.contains("-tune-configs"), "{e}");
    let e = Target::parse("cpu opt").unwrap_err().0;
    assert!(e.contains("expected '-key=value'"), "{e}");
    assert!(Target::parse("cpu -opt-level=1 -opt-level=2").is_err());
    assert!(Target::parse("{\"compiler\": \"c\"}").unwrap_err().0.contains("missing \"kind\""));
}

#[test]
fn every_attribute_changes_the_digest() {
    for text in ["cpu", "cuda", "cuda -compiler=cublas"] {
        let base = Target::parse(text).unwrap();
        let attrs: Vec<&AttrSpec> = base.spec().attrs.iter().chain(base.backend_spec().options).collect();
        assert!(!attrs.is_empty(), "{text}");
        for a in attrs {
            let other = match &a.ty {
                AttrType::Bool => format!("{text} -{}={}", a.name, !base.bool_attr(a.name)),
                AttrType::Int { min, max } => format!("{text} -{}={}", a.name, if base.int_attr(a.name) == *max { min } else { max }),
                AttrType::Enum(o) => format!("{text} -{}={}", a.name, o.iter().find(|v| **v != base.str_attr(a.name)).unwrap()),
            };
            assert_ne!(Target::parse(&other).unwrap().digest(), base.digest(), "{other}");
        }
    }
}

#[test]
fn target_sets_gain_the_fallback_and_reject_conflicts() {
    let set = TargetSet::parse(&["cpu -compiler=gemm".into()]).unwrap();
    assert_eq!(set.targets.len(), 2);
    let fb = set.fallback("cpu").unwrap();
    assert_eq!(fb.backend_name(), "c");
    assert_eq!(fb.int_attr("opt-level"), 2);
    // The fallback inherits the device's attributes, not the other backend's options.
    let set = TargetSet::parse(&["cuda -compiler=cublas -arch=sm_80 -tune-configs=3".into()]).unwrap();
    let fb = set.fallback("cuda").unwrap();
    assert_eq!((fb.backend_name(), fb.str_attr("arch"), fb.int_attr("tune-configs")), ("cuda", "sm_80", 16));
    // Order and spelling do not matter.
    let a = TargetSet::parse(&["cpu".into(), "cpu -compiler=gemm".into()]).unwrap();
    let b = TargetSet::parse(&[r#"[{"kind":"cpu","compiler":"gemm"},{"kind":"cpu"}]"#.into()]).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.digest(), b.digest());
    let e = TargetSet::parse(&["cpu -opt-level=1".into(), "cpu -opt-level=2".into()]).unwrap_err().0;
    assert!(e.contains("two targets select backend 'c'"), "{e}");
}

#[test]
fn layout_is_one_per_set_and_the_fallback_inherits_it() {
    assert_eq!(TargetSet::parse(&["cpu".into()]).unwrap().layout().unwrap(), Layout::Nchw);
    assert_eq!(TargetSet::parse(&["cuda".into()]).unwrap().layout().unwrap(), Layout::Auto);
    let set = TargetSet::parse(&["cuda -compiler=cudnn -layout=nhwc".into()]).unwrap();
    assert_eq!(set.layout().unwrap(), Layout::Nhwc);
    assert_eq!(set.fallback("cuda").unwrap().str_attr("layout"), "nhwc");
    let e = TargetSet::parse(&["cuda -layout=nhwc".into(), "cuda -compiler=cudnn".into()]).unwrap_err().0;
    assert!(e.contains("different layouts"), "{e}");
    let e = Target::parse("cuda -layout=nchwc").unwrap_err().0;
    assert!(e.contains("auto, nchw, nhwc"), "{e}");
    let e = Target::parse("cpu -layout=nhwc").unwrap_err().0;
    assert!(e.contains("layout"), "{e}");
}

#[test]
fn precision_is_one_per_set_and_the_fallback_inherits_it() {
    assert_eq!(TargetSet::parse(&["cpu".into()]).unwrap().precision().unwrap(), Precision::Fp32);
    assert_eq!(TargetSet::parse(&["cuda".into()]).unwrap().precision().unwrap(), Precision::Fp32);
    let set = TargetSet::parse(&["cuda -compiler=cublas -precision=fp16".into(), "cpu".into()]).unwrap();
    assert_eq!(set.precision().unwrap(), Precision::Fp16);
    assert_eq!(set.fallback("cuda").unwrap().str_attr("precision"), "fp16");
    let e = TargetSet::parse(&["cuda -precision=fp16".into(), "cuda -compiler=cublas".into()]).unwrap_err().0;
    assert!(e.contains("different precisions"), "{e}");
    let e = Target::parse("cuda -precision=fp8").unwrap_err().0;
    assert!(e.contains("fp32, fp16, bf16"), "{e}");
}

#[test]
fn bf16_is_a_gpu_precision_for_every_gpu_backend_and_sm80_up() {
    let set = TargetSet::parse(&["cuda -compiler=cublas -precision=bf16".into(), "cuda -compiler=cutlass -precision=bf16".into(), "cpu".into()]).unwrap();
    assert_eq!(set.precision().unwrap(), Precision::Bf16);
    assert_eq!(set.fallback("cuda").unwrap().str_attr("precision"), "bf16", "the nvrtc fallback inherits it");
    assert_eq!(Precision::Bf16.dtype(), crate::ir::DType::BF16);
    let e = TargetSet::parse(&["cuda -precision=bf16".into(), "cuda -compiler=cudnn -precision=fp16".into()]).unwrap_err().0;
    assert!(e.contains("different precisions"), "{e}");
    let e = Target::parse("cpu -precision=bf16").unwrap_err().0;
    assert!(e.contains("precision"), "the CPU has no precision attribute: {e}");
    // Every architecture the registry offers is sm_80 or newer; an older one is refused by name.
    let mut old = Target::parse("cuda -precision=bf16").unwrap();
    old.attrs.insert("arch".into(), AttrValue::Str("sm_75".into()));
    let e = TargetSet { targets: vec![old] }.precision().unwrap_err().0;
    assert!(e.contains("sm_80 or newer") && e.contains("sm_75"), "{e}");
    assert_eq!(TargetSet::parse(&["cuda -precision=fp16 -overflow=bf16".into()]).unwrap().overflow().unwrap(), Overflow::Bf16);
}
