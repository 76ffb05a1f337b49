use super::*;

fn req(size: u64, first: u32, last: u32) -> Request {
    Request { size, life: Lifetime { first, last } }
}

#[test]
fn chain_reuses_space() {
    // a -> b -> c -> d: each buffer only overlaps its neighbours, so two slots suffice.
    let r = [req(128, 0, 1), req(128, 1, 2), req(128, 2, 3), req(128, 3, 4)];
    let (off, arena) = assign(&r);
    assert_eq!(arena, 256);
    assert_eq!(find_overlap(&r, &off), None);
}

#[test]
fn small_buffer_fills_hole() {
    // A big buffer dies, then a small one and a big one live together: the small one goes in the hole
    // left below the long-lived buffer rather than growing the arena.
    let r = [req(64, 0, 3), req(256, 0, 1), req(64, 2, 3), req(192, 2, 3)];
    let (off, arena) = assign(&r);
    assert_eq!(find_overlap(&r, &off), None);
    assert_eq!(arena, 320);
}

#[test]
fn overlap_is_found() {
    let r = [req(128, 0, 2), req(64, 2, 3)];
    assert_eq!(find_overlap(&r, &[0, 64]), Some((0, 1)));
    assert_eq!(find_overlap(&r, &[0, 128]), None);
    let r = [req(128, 0, 1), req(64, 2, 3)];
    assert_eq!(find_overlap(&r, &[0, 0]), None);
}
