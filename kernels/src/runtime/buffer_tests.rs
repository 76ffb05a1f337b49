use super::*;

#[test]
fn aligned_and_zeroed() {
    for len in [0u64, 1, 63, 64, 65, 4096] {
        let b = HostBuffer::zeroed(len, "test").unwrap();
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(b.len() as u64, len);
        assert!(b.as_slice().iter().all(|&x| x == 0));
    }
    let b = HostBuffer::from_bytes(&[1, 2, 3], "test").unwrap();
    assert_eq!(b.as_slice(), &[1, 2, 3]);
}

#[test]
fn absurd_size_is_an_error() {
    let e = HostBuffer::zeroed(u64::MAX, "arena of m").err().unwrap();
    assert!(e.0.contains("arena of m"), "{e}");
}
