//! Criterion benches of hot paths.

fn main() {}
