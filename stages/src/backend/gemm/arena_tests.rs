use super::*;
use proptest::prelude::*;

#[test]
fn reuses_freed_regions() {
    let mut a = Arena::default();
    let x = a.alloc(100);
    let y = a.alloc(10);
    assert_eq!((x, y), (0, 112));
    a.free(x, 100);
    assert_eq!(a.alloc(50), 0);
    assert_eq!(a.alloc(20), 64);
    assert_eq!(a.size(), 128);
    // Growing past the top reuses the free tail.
    a.free(y, 10);
    assert_eq!(a.alloc(200), 96);
    assert_eq!(a.size(), 304);
}

proptest! {
    /// Live regions never overlap, all lie below `size()`, and offsets are aligned.
    #[test]
    fn live_regions_are_disjoint(ops in prop::collection::vec((0u64..300, any::<bool>(), any::<prop::sample::Index>()), 1..60)) {
        let mut a = Arena::default();
        let mut live: Vec<(u64, u64)> = Vec::new();
        for (len, free, pick) in ops {
            if free && !live.is_empty() {
                let (o, l) = live.remove(pick.index(live.len()));
                a.free(o, l);
            } else {
                let o = a.alloc(len);
                prop_assert_eq!(o % ALIGN, 0);
                live.push((o, len));
            }
            for (i, &(o1, l1)) in live.iter().enumerate() {
                prop_assert!(o1 + l1.max(1) <= a.size());
                for &(o2, l2) in &live[i + 1..] {
                    prop_assert!(o1 + l1.max(1) <= o2 || o2 + l2.max(1) <= o1, "overlap {:?}", live);
                }
            }
        }
    }
}
