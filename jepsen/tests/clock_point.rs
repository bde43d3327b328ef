//! The harness names the server's clock-jump fail point by a constant of its own (it builds
//! on the client library, not on the server's); this keeps the two names one.

#[test]
fn the_clock_jump_arms_the_point_the_server_has() {
    assert_eq!(
        talon_jepsen::nemesis::CLOCK_POINT,
        talon_meta::clock::JUMP_POINT
    );
}
