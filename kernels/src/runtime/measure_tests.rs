use super::*;

#[test]
fn quantiles() {
    // Interpolated as `percentile` (one definition for tune records and `tessera bench`).
    let m = Measurement::from_samples(&[5.0, 1.0, 4.0, 2.0, 3.0], 2).unwrap();
    assert_eq!((m.median_us, m.min_us, m.runs, m.warmups), (3.0, 1.0, 5, 2));
    assert!((m.p10_us - 1.4).abs() < 1e-12 && (m.p90_us - 4.6).abs() < 1e-12, "{m:?}");
    let m = Measurement::from_samples(&[4.0, 1.0, 3.0, 2.0], 0).unwrap();
    assert_eq!(m.median_us, 2.5);
    let s: Vec<f64> = (1..=100).map(f64::from).collect();
    let m = Measurement::from_samples(&s, 0).unwrap();
    assert!((m.p10_us - 10.9).abs() < 1e-9 && (m.p90_us - 90.1).abs() < 1e-9, "{m:?}");
    assert!(Measurement::from_samples(&[], 0).is_none());
}

#[test]
fn percentiles_interpolate() {
    let s = [1.0, 2.0, 3.0, 4.0, 5.0];
    assert_eq!(percentile(&s, 50.0), 3.0);
    assert!((percentile(&s, 10.0) - 1.4).abs() < 1e-12);
    assert!((percentile(&s, 90.0) - 4.6).abs() < 1e-12);
    assert_eq!(percentile(&[7.0], 90.0), 7.0);
    assert_eq!(percentile(&[1.0, 2.0], 50.0), 1.5);
    assert_eq!(median(&[3.0, 1.0, 2.0, 4.0]), 2.5);
}

/// A module whose one function sleeps a little and counts its calls.
struct Counting(std::sync::atomic::AtomicU32, usize);

impl LoadedModule for Counting {
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError> {
        assert_eq!(index, 0);
        assert_eq!(args.len(), self.1);
        assert!(args.iter().all(|p| (*p as usize).is_multiple_of(64)));
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_micros(200));
        Ok(())
    }
}

fn info() -> FunctionInfo {
    use crate::tensor::TensorType;
    FunctionInfo { symbol: "k".into(), inputs: vec![TensorType::f32([3])], outputs: vec![TensorType::f32([3])], scratch_bytes: 100 }
}

#[test]
fn runs_until_count_and_budget_are_met() {
    let m = Counting(Default::default(), 3);
    let x = Tensor::from_f32([3], &[1.0, -2.0, 0.5]);
    let opts = MeasureOptions { warmup: 2, min_runs: 4, budget_us: 3000, max_runs: 1000 };
    let r = measure_function(&m, 0, &info(), std::slice::from_ref(&x), &opts).unwrap();
    // Warmup stops early once the budget is spent: on a loaded machine one 200 us sleep can take
    // longer than the whole 3 ms budget, leaving one warmup instead of two (this assertion used to
    // demand two, and failed at random under load).
    assert!(r.runs >= 4 && (1..=2).contains(&r.warmups), "{r:?}");
    assert!(r.median_us >= 200.0 && r.min_us <= r.median_us && r.p10_us <= r.median_us && r.median_us <= r.p90_us);
    // Every run sleeps at least 200 us, so 15 runs exceed the 3000 us budget whatever the load: the
    // loop ended on the budget (not on max_runs, 1000). Its lower side, runs until the budget is spent,
    // cannot be checked from the quantiles without timing assumptions (one slow sample skews them).
    assert!(r.runs <= 15, "{r:?}: ran past the budget");
    assert_eq!(m.0.load(std::sync::atomic::Ordering::Relaxed), r.runs + r.warmups);
    // The cap wins over the budget.
    let opts = MeasureOptions { warmup: 0, min_runs: 2, budget_us: 10_000_000, max_runs: 3 };
    let r = measure_function(&m, 0, &info(), &[x], &opts).unwrap();
    assert_eq!((r.runs, r.warmups), (3, 1));
}

#[test]
fn bad_inputs_are_errors() {
    let m = Counting(Default::default(), 3);
    let opts = MeasureOptions::default();
    let e = measure_function(&m, 0, &info(), &[Tensor::from_f32([3], &[0.0; 3])], &opts).unwrap_err();
    assert!(e.0.contains("'k'") && e.0.contains("all zeros"), "{e}");
    let e = measure_function(&m, 0, &info(), &[Tensor::from_f32([4], &[1.0; 4])], &opts).unwrap_err();
    assert!(e.0.contains("input 0"), "{e}");
    let e = measure_function(&m, 0, &info(), &[], &opts).unwrap_err();
    assert!(e.0.contains("0 inputs given"), "{e}");
    let bad = MeasureOptions { min_runs: 0, ..opts };
    assert!(measure_function(&m, 0, &info(), &[Tensor::from_f32([3], &[1.0; 3])], &bad).is_err());
    assert_eq!(m.0.load(std::sync::atomic::Ordering::Relaxed), 0);
}
