use super::*;
use proptest::prelude::*;

#[test]
fn disjoint_lifetimes_share_memory() {
    let reqs = [
        Request { bytes: 1000, start: 0, end: 1 },
        Request { bytes: 1000, start: 2, end: 3 },
        Request { bytes: 100, start: 1, end: 2 },
    ];
    let (off, total) = assign(&reqs);
    assert_eq!(off[0], off[1]);
    assert_eq!(total, 1024 + 128);
}

proptest! {
    /// No two buffers that are live at the same time overlap, and every buffer lies inside the total.
    #[test]
    fn live_buffers_never_overlap(raw in proptest::collection::vec((1u64..5000, 0usize..10, 0usize..5), 0..20)) {
        let reqs: Vec<Request> = raw.iter().map(|&(b, s, l)| Request { bytes: b, start: s, end: s + l }).collect();
        let (off, total) = assign(&reqs);
        for i in 0..reqs.len() {
            prop_assert!(off[i] % ALIGN == 0);
            prop_assert!(off[i] + reqs[i].bytes <= total);
            for j in 0..i {
                let live = reqs[i].start <= reqs[j].end && reqs[j].start <= reqs[i].end;
                let overlap = off[i] < off[j] + reqs[j].bytes && off[j] < off[i] + reqs[i].bytes;
                prop_assert!(!(live && overlap), "buffers {} and {} overlap", i, j);
            }
        }
    }
}
