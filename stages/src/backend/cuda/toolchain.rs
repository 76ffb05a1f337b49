//! NVRTC: CUDA C++ source to a cubin for the target's architecture (not PTX: a cubin loads on the driver
//! as is, whatever PTX version the driver would accept). The toolkit is found by
//! `tessera_kernels::runtime::cuda::libs` (CUDA installation or NVIDIA's PyPI wheels); no GPU is needed.

use crate::backend::ToolError;
use crate::target::{AttrValue, Target};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use tessera_kernels::runtime::cuda::libs;

/// How many threads NVRTC splits a program's optimization and code generation over (`-split-compile`). A
/// program of many kernels (a fused partition's launches, a tuning batch) then compiles on several cores:
/// the analytical zoo's modules (ResNet-18, MobileNetV2, MLP, BERT-tiny; fp16 and fp32) took 12.3 s on the
/// 2-core build machine, 9.1 s split, with the same machine code in every function (their `.text` sections
/// byte for byte). A fixed count, not "as many as there are cores" (0): the split decides the order of the
/// cubin's symbol table and the cubin records the option, and a module must be the same bytes on every
/// machine (frozen builds are reproduced on machines without a GPU).
pub const SPLIT_COMPILE: u32 = 8;

/// The NVRTC options for `target`: architecture, C++ dialect, the compile split, fast math when the target
/// asks for it.
pub fn options(target: &Target) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={}", arch(target)),
        "--std=c++17".to_string(),
        "-default-device".to_string(),
        "-diag-suppress=177".to_string(),
        format!("-split-compile={SPLIT_COMPILE}"),
    ];
    if matches!(target.attr("fast-math"), AttrValue::Bool(true)) {
        o.push("--use_fast_math".to_string());
    }
    o
}

/// The `-arch` of a cuda target (`sm_90`).
pub fn arch(target: &Target) -> String {
    match target.attr("arch") {
        AttrValue::Str(s) => s.clone(),
        _ => "sm_90".to_string(),
    }
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<(), ToolError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(ToolError::Failed(format!("NVRTC {what}: {r:?}")))
    }
}

/// Compiles `source` (named `name` in diagnostics) to a cubin; `Err` holds NVRTC's log.
pub fn compile(target: &Target, name: &str, source: &str) -> Result<Vec<u8>, ToolError> {
    let toolkit = libs::toolkit().map_err(|e| ToolError::NotFound(e.to_string()))?;
    let nul = |what: &str| ToolError::Failed(format!("{what} holds a NUL byte"));
    let src = CString::new(source).map_err(|_| nul("the CUDA source"))?;
    let cname = CString::new(name).map_err(|_| nul("the source name"))?;
    // The header folder is where this machine keeps the toolkit's headers, not a property of the code: it
    // is passed here rather than through `options` (a key ingredient), the NVRTC version standing for the
    // headers' release.
    let mut opts = options(target);
    opts.push(format!("-I{}", toolkit.include_dir.display()));
    // CUDA 13 keeps the CCCL headers (`<nv/target>`, which cuda_fp16.h includes) under include/cccl.
    let cccl = toolkit.include_dir.join("cccl");
    if cccl.is_dir() {
        opts.push(format!("-I{}", cccl.display()));
    }
    let opts: Vec<CString> = opts.into_iter().map(|o| CString::new(o).map_err(|_| nul("an NVRTC option"))).collect::<Result<_, _>>()?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded (toolkit() above); every pointer is a live NUL-terminated string; the program
    // is destroyed on every path below.
    unsafe {
        check(sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()), "create program")?;
        let compiled = sys::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let result = if compiled == sys::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            check(sys::nvrtcGetCUBINSize(prog, &mut size), "cubin size").and_then(|_| {
                let mut cubin = vec![0u8; size];
                check(sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char), "get cubin").map(|_| cubin)
            })
        } else {
            let mut size = 0usize;
            let mut log = String::new();
            if sys::nvrtcGetProgramLogSize(prog, &mut size) == sys::nvrtcResult::NVRTC_SUCCESS && size > 0 {
                let mut buf = vec![0u8; size];
                if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char) == sys::nvrtcResult::NVRTC_SUCCESS {
                    log = CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
                }
            }
            Err(ToolError::Failed(format!("{compiled:?}\n{log}")))
        };
        let _ = sys::nvrtcDestroyProgram(&mut prog);
        result
    }
}
