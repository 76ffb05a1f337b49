use super::*;

/// A folder laid out as the driver's files are: one GPU, a version, a boot.
fn fake_machine() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let w = |p: &str, text: &str| {
        let path = root.path().join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    w("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n");
    w("proc/driver/nvidia/gpus/0000:19:00.0/information", "Model: NVIDIA H200\nGPU UUID: GPU-aaaa\nBus Location: 0000:19:00.0\n");
    w("proc/driver/nvidia/params", "ResmanDebugLevel: 4294967295\n");
    w("proc/sys/kernel/random/boot_id", "6f0c2f4e-0000-4000-8000-000000000001\n");
    std::fs::create_dir_all(root.path().join("dev")).unwrap();
    w("dev/nvidia0", "");
    w("dev/nvidiactl", "");
    root
}

fn fingerprint(name: &str) -> GpuFingerprint {
    GpuFingerprint {
        name: name.into(),
        arch: "sm_90".into(),
        sm_count: 132,
        memory_bytes: 150_000_000_000,
        l2_bytes: 62_914_560,
        clock_khz: 1_980_000,
        driver_cuda: "13.0".into(),
        cublaslt_version: "130100".into(),
        cudnn_version: "91400".into(),
    }
}

fn name_under(root: &Path) -> Digest {
    name_of(&witness(root).expect("a witness"))
}

#[test]
fn the_witness_changes_with_each_thing_it_covers() {
    let m = fake_machine();
    let base = name_under(m.path());
    assert_eq!(name_under(m.path()), base, "read twice, the same witness");
    let changes: &[(&str, &str)] = &[
        ("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.105.08\n"),
        ("proc/driver/nvidia/gpus/0000:19:00.0/information", "Model: NVIDIA H200\nGPU UUID: GPU-bbbb\nBus Location: 0000:19:00.0\n"),
        ("proc/driver/nvidia/gpus/0000:2a:00.0/information", "Model: NVIDIA H200\nGPU UUID: GPU-cccc\n"),
        ("proc/driver/nvidia/params", "ResmanDebugLevel: 0\n"),
        ("proc/driver/nvidia/capabilities/gpu0/mig/gi1/access", "1\n"),
        ("proc/sys/kernel/random/boot_id", "6f0c2f4e-0000-4000-8000-000000000002\n"),
        ("dev/nvidia1", ""),
        ("etc/ld.so.cache", "a new loader cache"),
    ];
    for (path, text) in changes {
        let m = fake_machine();
        let full = m.path().join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, text).unwrap();
        assert_ne!(name_under(m.path()), base, "changing {path} must change the witness");
    }
}

#[test]
fn no_driver_files_no_witness() {
    let m = fake_machine();
    std::fs::remove_file(m.path().join("proc/driver/nvidia/version")).unwrap();
    assert!(witness(m.path()).is_none());
    let m = fake_machine();
    std::fs::remove_dir_all(m.path().join("proc/driver/nvidia/gpus/0000:19:00.0")).unwrap();
    assert!(witness(m.path()).is_none(), "a driver that lists no GPU");
}

fn store_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("FORMAT"), "tessera-store 1\n").unwrap();
    dir
}

#[test]
fn a_recorded_fingerprint_is_recalled_without_reading_the_gpu() {
    let store = store_dir();
    let facts = MachineFacts::in_store(store.path());
    let name = Digest::of(b"a witness");
    let (fp, recalled) = recall(&facts, &name, || Some(fingerprint("NVIDIA H200"))).unwrap();
    assert_eq!((fp.name.as_str(), recalled), ("NVIDIA H200", false));
    // The next process finds it, and never reads the GPU.
    let (fp, recalled) = recall(&facts, &name, || panic!("the GPU was read although the fact is current")).unwrap();
    assert_eq!((fp, recalled), (fingerprint("NVIDIA H200"), true));
    // Another witness (another driver, boot, GPU) does not find it.
    let (_, recalled) = recall(&facts, &Digest::of(b"another witness"), || Some(fingerprint("NVIDIA H100"))).unwrap();
    assert!(!recalled);
}

#[test]
fn a_fingerprint_missing_a_library_is_not_recorded() {
    let store = store_dir();
    let facts = MachineFacts::in_store(store.path());
    let name = Digest::of(b"a witness");
    let partial = GpuFingerprint { cudnn_version: "absent: cuDNN (libcudnn.so.9) not found on this machine".into(), ..fingerprint("NVIDIA H200") };
    recall(&facts, &name, || Some(partial.clone())).unwrap();
    let (_, recalled) = recall(&facts, &name, || Some(partial.clone())).unwrap();
    assert!(!recalled, "installing cuDNN later must be noticed");
    assert!(recall(&facts, &Digest::of(b"no gpu"), || None).is_none());
}

#[test]
fn a_changed_library_file_reads_the_gpu_again() {
    let store = store_dir();
    let facts = MachineFacts::in_store(store.path());
    let libs = tempfile::tempdir().unwrap();
    let lib = libs.path().join("libcublasLt.so.13");
    std::fs::write(&lib, "version 1").unwrap();
    let entry = |path: &Path| FileIdentity { path: path.to_path_buf(), file: identity(path).unwrap(), folder: identity(path.parent().unwrap()).unwrap() };
    let name = Digest::of(b"a witness");
    let record = Record { libraries: vec![entry(&lib)], fingerprint: fingerprint("NVIDIA H200") };
    facts.put(&name, &postcard::to_stdvec(&record).unwrap()).unwrap();
    assert!(recall(&facts, &name, || panic!("current: not read")).unwrap().1);

    // Replaced by another file of the same size (a new inode): read again.
    std::fs::write(libs.path().join("new"), "version 2").unwrap();
    std::fs::rename(libs.path().join("new"), &lib).unwrap();
    let (fp, recalled) = recall(&facts, &name, || Some(fingerprint("NVIDIA H200 (read again)"))).unwrap();
    assert_eq!((fp.name.as_str(), recalled), ("NVIDIA H200 (read again)", false));

    // A new file beside a recorded library (one the loader might find first) changes its folder.
    let record = Record { libraries: vec![entry(&lib)], fingerprint: fingerprint("NVIDIA H200") };
    facts.put(&name, &postcard::to_stdvec(&record).unwrap()).unwrap();
    assert!(recall(&facts, &name, || panic!("current: not read")).unwrap().1);
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(libs.path().join("libcublasLt.so"), "a shadowing copy").unwrap();
    assert!(!recall(&facts, &name, || Some(fingerprint("NVIDIA H200"))).unwrap().1);
}

#[test]
fn this_process_maps_its_libraries() {
    // The test binary maps at least the C library; every entry is a file that exists, with its folder.
    let libs = mapped_libraries().expect("no mapped library was deleted");
    assert!(libs.iter().any(|l| l.path.file_name().unwrap().to_string_lossy().starts_with("libc")), "{libs:?}");
    assert!(current(&libs));
}
