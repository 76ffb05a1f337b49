use super::*;
use tessera_kernels::runtime::cuda::device;

/// Every item is worked once, on a thread whose current GPU is one of those given, each GPU takes a
/// share, and results come back in item order, the items fed from several threads and some late. No GPU
/// is opened: `device::on` only sets the thread's current GPU, which is what the work's loads and
/// measurements would use.
#[test]
fn every_gpu_takes_items_until_none_is_left() {
    let gpus = [0, 2, 3];
    let items: Vec<usize> = (0..24).map(|i| i * 10).collect();
    let seen = std::sync::Mutex::new(Vec::new());
    let feed = |send: &(dyn Fn(usize) + Sync)| -> Result<()> {
        // Sent from several threads, late ones after a pause: the GPUs wait for them.
        items[..12].par_iter().for_each(|&i| send(i));
        std::thread::sleep(std::time::Duration::from_millis(20));
        items[12..].iter().for_each(|&i| send(i));
        Ok(())
    };
    let out = on_every_gpu(&gpus, items.len(), feed, |item, _| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        seen.lock().unwrap().push(item);
        Ok((item, device::current()))
    })
    .unwrap();
    assert_eq!(out.iter().map(|(i, _)| *i).collect::<Vec<_>>(), items, "results in item order");
    assert!(out.iter().all(|(i, (j, _))| i == j));
    let mut seen = seen.into_inner().unwrap();
    seen.sort_unstable();
    assert_eq!(seen, items, "each item worked exactly once");
    let used: std::collections::BTreeSet<usize> = out.iter().map(|(_, (_, g))| *g).collect();
    assert_eq!(used, gpus.into_iter().collect(), "every GPU took a share of 24 items of 5 ms");
    assert_eq!(device::current(), 0, "the caller's current GPU is untouched");
}

/// The first error by item order is the one reported, and it stops the GPUs from taking more items.
#[test]
fn an_error_on_one_gpu_stops_the_others() {
    let items: Vec<usize> = (0..1000).collect();
    let worked = std::sync::atomic::AtomicUsize::new(0);
    let err = on_every_gpu(&[0, 1], items.len(), |send| { items.iter().for_each(|&i| send(i)); Ok(()) }, |item, _| {
        worked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(1));
        if item >= 5 { bail!("item {item} failed") } else { Ok(()) }
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "item 5 failed");
    assert!(worked.into_inner() < 20, "the threads stopped taking items after the first error");
}

/// More GPUs than items: only as many threads as items.
#[test]
fn fewer_items_than_gpus() {
    let out = on_every_gpu(&[0, 1, 2, 3], 1, |send| { send(7); Ok(()) }, |item, _| Ok(item * 2)).unwrap();
    assert_eq!(out, vec![(7, 14)]);
}

/// A feed that fails (a compile error while the GPUs measure what was built) stops the GPUs and is the
/// error reported.
#[test]
fn a_failing_feed_stops_the_gpus() {
    let err = on_every_gpu(&[0, 1], 10, |send| { send(1); bail!("compiling failed") }, |item, _| Ok(item)).unwrap_err();
    assert_eq!(err.to_string(), "compiling failed");
}
