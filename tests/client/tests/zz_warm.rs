#[test]
fn warm() {}
