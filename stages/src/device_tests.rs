use super::*;

const SAMPLE: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.10GHz\nstepping\t: 2\nflags\t\t: sse avx fpu\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: sse avx fpu\n";

#[test]
fn parses_cpuinfo() {
    let fp = parse_cpuinfo(SAMPLE);
    assert_eq!(fp.vendor, "GenuineIntel");
    assert_eq!(fp.model_name, "Intel(R) Xeon(R) Processor @ 2.10GHz");
    assert_eq!(fp.family_model_stepping, "6/207/2");
    assert_eq!(fp.logical_cores, 2);
    // Flag order does not matter; a masked flag does.
    assert_eq!(fp.flags_digest, parse_cpuinfo(&SAMPLE.replace("sse avx fpu", "fpu avx sse")).flags_digest);
    assert_ne!(fp.flags_digest, parse_cpuinfo(&SAMPLE.replace("sse avx fpu", "sse fpu")).flags_digest);
}

/// Measurements taken from inside the global pool, beside compile work holding `busy`, all finish (a
/// measurement once deadlocked when a worker waiting for the measurement pool ran a `busy` job while
/// holding the gate itself).
#[test]
fn measurements_beside_busy_work_all_finish() {
    use rayon::prelude::*;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let total: u64 = (0..32u64)
            .into_par_iter()
            .map(|i| {
                if i % 2 == 0 {
                    exclusively("cpu", || {
                        tessera_kernels::runtime::on_runtime_pool(|| (0..1000u64).into_par_iter().sum::<u64>())
                    })
                } else {
                    let _busy = busy();
                    (0..1000u64).sum::<u64>()
                }
            })
            .sum();
        tx.send(total).unwrap();
    });
    let total = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("measurements and busy work never finished: deadlock");
    assert_eq!(total, 32 * 499_500);
}

/// Measurements on two GPUs run at once; two on one GPU take turns.
#[test]
fn each_gpu_has_its_own_measurement_lock() {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let (held_tx, held_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    let holder = std::thread::spawn(move || {
        cuda::device::on(1, || {
            let _gpu1 = measurement_lock("cuda");
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        })
    });
    held_rx.recv().unwrap();
    let (done_tx, done_rx) = channel();
    let other = done_tx.clone();
    std::thread::spawn(move || cuda::device::on(0, || { let _gpu0 = measurement_lock("cuda"); other.send(0).unwrap(); }));
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(30)), Ok(0), "GPU 0's lock waited for GPU 1's");
    std::thread::spawn(move || cuda::device::on(1, || { let _again = measurement_lock("cuda"); done_tx.send(1).unwrap(); }));
    assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err(), "a second measurement on GPU 1 ran beside the first");
    release_tx.send(()).unwrap();
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(30)), Ok(1));
    holder.join().unwrap();
}

/// `exclusively` runs its work on a thread of its own that keeps the caller's current GPU.
#[test]
fn exclusive_work_keeps_the_callers_gpu() {
    assert_eq!(cuda::device::on(3, || exclusively("cuda", cuda::device::current)), 3);
    assert_eq!(exclusively("cuda", cuda::device::current), 0);
}

#[test]
fn parses_gpu_lists() {
    assert_eq!(parse_gpus("all"), Ok(None));
    assert_eq!(parse_gpus("0"), Ok(Some(vec![0])));
    assert_eq!(parse_gpus(" 0, 1,3 "), Ok(Some(vec![0, 1, 3])));
    assert_eq!(parse_gpus("0,x"), Err(DeviceError::NotAnIndex("x".to_string())));
    assert_eq!(parse_gpus("0,x").unwrap_err().to_string(), "'x' is not a GPU index (--gpus takes `all` or indices like 0,1)");
    assert!(parse_gpus("").is_err() && parse_gpus("-1").is_err());
    assert_eq!(measuring_gpus(Some(&[])), Err(DeviceError::NoGpuNamed));
    assert_eq!(measuring_gpus(Some(&[1, 0, 1])).unwrap_err().to_string(), "--gpus names GPU 1 twice");
}

#[test]
fn this_machine_has_a_fingerprint() {
    let DeviceFingerprint::Cpu(fp) = cpu_fingerprint() else { panic!("not a CPU fingerprint") };
    assert!(!fp.arch.is_empty() && !fp.os.is_empty());
    if cfg!(target_os = "linux") {
        assert!(fp.logical_cores >= 1, "{fp:?}");
    }
    if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        assert!(!fp.model_name.is_empty() && !fp.vendor.is_empty(), "{fp:?}");
    }
    assert_eq!(cpu_fingerprint(), cpu_fingerprint());
}

#[test]
fn a_gpu_fingerprint_exactly_where_a_gpu_is() {
    match (tessera_kernels::runtime::cuda::available(), gpu_fingerprint()) {
        (Err(_), None) => eprintln!("no GPU here: gpu_fingerprint() is None, as it must be"),
        (Ok(()), Some(DeviceFingerprint::Gpu(fp))) => {
            assert!(!fp.name.is_empty() && fp.arch.starts_with("sm_") && fp.sm_count > 0 && fp.memory_bytes > 0, "{fp:?}");
            assert!(fp.l2_bytes > 0 && fp.clock_khz > 0 && !fp.driver_cuda.is_empty(), "{fp:?}");
        }
        (available, fp) => panic!("GPU available: {available:?}, fingerprint {fp:?}"),
    }
}
