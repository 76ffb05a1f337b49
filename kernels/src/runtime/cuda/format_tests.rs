use super::*;
use crate::tensor::TensorType;

fn info(symbol: &str) -> FunctionInfo {
    FunctionInfo { symbol: symbol.into(), inputs: vec![TensorType::f32(vec![4])], outputs: vec![TensorType::f32(vec![4])], scratch_bytes: 0 }
}

fn launches(entry: &str) -> FunctionLaunches {
    let args = vec![LaunchArg { index: 0, offset: 0 }, LaunchArg { index: 1, offset: 0 }];
    FunctionLaunches { launches: vec![Launch { entry: entry.into(), grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0, args }] }
}

fn module(format: crate::module::ModuleFormat, bytes: Vec<u8>) -> Module {
    Module { backend: "cuda".into(), target: "cuda".into(), format, functions: vec![info("f"), info("g")], bytes }
}

/// Two programs: each launch names its cubin; a module of the one-cubin format before still reads, as
/// one cubin holding every launch.
#[test]
fn functions_name_their_cubin_and_the_one_cubin_format_still_reads() {
    let elf = |tag: u8| [b"\x7fELF".as_slice(), &[tag]].concat();
    let two = CubinModule { arch: "sm_90".into(), cubins: vec![elf(1), elf(2)], functions: vec![launches("f_k0"), launches("g_k0")], launch_cubins: vec![vec![0], vec![1]], launch_params: vec![vec![None], vec![None]] };
    assert_eq!(two.format(), super::super::FORMAT);
    assert_eq!(CubinModule::decode(&module(super::super::FORMAT, two.encode())).unwrap(), two);
    #[derive(Serialize)]
    struct Old {
        arch: String,
        cubin: Vec<u8>,
        functions: Vec<FunctionLaunches>,
    }
    let old = postcard::to_stdvec(&Old { arch: "sm_90".into(), cubin: elf(7), functions: vec![launches("f_k0"), launches("g_k0")] }).unwrap();
    let read = CubinModule::decode(&module(super::super::LEGACY_FORMAT, old)).unwrap();
    assert_eq!((read.cubins, read.launch_cubins), (vec![elf(7)], vec![vec![0], vec![0]]));
    let bad = CubinModule { launch_cubins: vec![vec![0], vec![2]], ..two.clone() };
    let e = CubinModule::decode(&module(super::super::FORMAT, bad.encode())).unwrap_err();
    assert!(matches!(e, crate::runtime::cuda::CudaError::InvalidModule(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("function 'g': kernel 'g_k0' is in cubin 2 of 2"), "{e}");
    let short = CubinModule { launch_cubins: vec![vec![0], vec![]], ..two.clone() };
    assert!(CubinModule::decode(&module(super::super::FORMAT, short.encode())).unwrap_err().to_string().contains("function 'g' has 1 launches and 0 cubin indices"));
    let not_elf = CubinModule { cubins: vec![elf(1), b"text".to_vec()], ..two };
    assert!(CubinModule::decode(&module(super::super::FORMAT, not_elf.encode())).unwrap_err().to_string().contains("its code 1 is not an ELF cubin"));
}

fn tensor_map(at: u32, index: u32) -> TensorMapPatch {
    let arg = LaunchArg { index, offset: 0 };
    TensorMapPatch { at, arg, data_type: 6, dims: vec![64, 32], strides: vec![128], box_dims: vec![64, 32], element_strides: vec![1, 1], interleave: 0, swizzle: 3, l2_promotion: 2, oob_fill: 0 }
}

/// A launch with a parameter block makes the module `cubins-params`; its blocks survive encoding, and
/// a block's patches are checked: inside the block, aligned, not overlapping, naming real arguments.
#[test]
fn parameter_blocks_round_trip_and_are_checked() {
    let elf = b"\x7fELF!".to_vec();
    let block = ParamBlock { bytes: vec![0; 384], pointers: vec![PointerPatch { at: 8, arg: LaunchArg { index: 1, offset: 0 } }], tensor_maps: vec![tensor_map(128, 0), tensor_map(256, 1)] };
    let mut fl = launches("f_k0");
    fl.launches[0].args.clear();
    let m = CubinModule { arch: "sm_90a".into(), cubins: vec![elf], functions: vec![fl, launches("g_k0")], launch_cubins: vec![vec![0], vec![0]], launch_params: vec![vec![Some(block.clone())], vec![None]] };
    assert_eq!(m.format(), super::super::PARAMS_FORMAT);
    let read = CubinModule::decode(&module(super::super::PARAMS_FORMAT, m.encode())).unwrap();
    assert_eq!(read, m);
    let with = |b: ParamBlock| CubinModule { launch_params: vec![vec![Some(b)], vec![None]], ..m.clone() };
    let bad = [
        (ParamBlock { tensor_maps: vec![tensor_map(96, 0)], ..block.clone() }, "not 64-byte aligned"),
        (ParamBlock { tensor_maps: vec![tensor_map(320, 0)], ..block.clone() }, "outside the 384-byte block"),
        (ParamBlock { pointers: vec![PointerPatch { at: 130, arg: LaunchArg { index: 1, offset: 0 } }], ..block.clone() }, "overlapping"),
        (ParamBlock { tensor_maps: vec![tensor_map(128, 2)], ..block.clone() }, "argument 2 of a function with 2 arguments"),
        (ParamBlock { bytes: vec![0; 5000], ..block.clone() }, "at most 4096"),
    ];
    for (b, want) in bad {
        let e = CubinModule::decode(&module(super::super::PARAMS_FORMAT, with(b).encode())).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    let both = CubinModule { functions: vec![launches("f_k0"), launches("g_k0")], ..m.clone() };
    assert!(CubinModule::decode(&module(super::super::PARAMS_FORMAT, both.encode())).unwrap_err().to_string().contains("both pointers and a parameter block"));
}
