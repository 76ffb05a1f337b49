use super::*;

struct Fake;

impl LoadedModule for Fake {
    unsafe fn call(&self, _: usize, _: &[*mut u8]) -> Result<(), RuntimeError> {
        Ok(())
    }
}

fn module(format: ModuleFormat) -> Module {
    Module { backend: "toy".into(), target: "cpu -compiler=toy".into(), format, functions: vec![], bytes: vec![] }
}

#[test]
fn builtin_has_one_loader_per_format_of_this_crate() {
    let formats: Vec<&ModuleFormat> = Registry::builtin().formats().collect();
    let names: Vec<&str> = formats.iter().map(|f| f.name.as_ref()).collect();
    assert_eq!(names, ["shared-object", "gemm-plan", "cubins", "cubins-params", "cubin", "cublaslt", "cudnn"]);
    assert!(formats.contains(&&crate::runtime::c::FORMAT) && formats.contains(&&crate::runtime::cuda::FORMAT) && formats.contains(&&crate::runtime::cuda::PARAMS_FORMAT) && formats.contains(&&crate::runtime::cuda::LEGACY_FORMAT));
}

#[test]
fn an_unknown_format_is_an_error_naming_the_backend() {
    let e = Registry::builtin().load(&module(ModuleFormat::named("toy-plan"))).err().expect("no loader");
    assert!(e.0.contains("backend toy") && e.0.contains("toy-plan (host)") && e.0.contains("shared-object (host), gemm-plan (host), cubins (GPU), cubins-params (GPU), cubin (GPU), cublaslt (GPU), cudnn (GPU)"), "{e}");
}

#[test]
fn an_added_loader_is_used_and_a_second_one_refused() {
    let load = |_: &Module| -> Result<Box<dyn LoadedModule>, RuntimeError> { Ok(Box::new(Fake)) };
    let r = Registry::builtin().clone().with(ModuleFormat::named("toy-plan"), load).unwrap();
    assert!(r.load(&module(ModuleFormat::named("toy-plan"))).is_ok());
    assert!(r.load(&module(ModuleFormat::named("other"))).is_err());
    let e = r.with(crate::runtime::gemm::FORMAT, load).err().expect("duplicate");
    assert!(e.0.contains("gemm-plan"), "{e}");
}
