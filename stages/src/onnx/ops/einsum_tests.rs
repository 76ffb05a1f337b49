use super::*;

#[test]
fn equations_parse_and_malformed_ones_say_where() {
    let e = parse(" bij , bjk -> bik ").unwrap();
    assert_eq!(e.inputs.len(), 2);
    assert_eq!(e.output.as_ref().unwrap().len(), 3);
    let e = parse("...ii->...i").unwrap();
    assert_eq!(e.inputs[0], vec![Sub::Ellipsis, Sub::Letter(b'i'), Sub::Letter(b'i')]);
    assert_eq!(parse("->").unwrap().inputs, vec![Vec::<Sub>::new()]);
    assert!(parse("i..j").unwrap_err().contains("'...'"));
    assert!(parse("i1").unwrap_err().contains("'1' at position 1"));
    assert!(parse("i->j->k").unwrap_err().contains("more than one"));
    assert!(parse("......").unwrap_err().contains("second"));
    assert!(parse("i->i,j").unwrap_err().contains("one term"));
}
