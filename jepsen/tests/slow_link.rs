//! The `slow-link` fault's queue: bytes a node's socket sends to a slowed peer arrive
//! whole and in order but at the link's rate, and once the fault heals they go at once.
//!
//! Like the harness, the test moves its process into a network namespace of its own (root
//! only). It sends as node 1 does: from a socket made while the thread's file-system group
//! is node 1's, which is what the firewall's rules match.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use talon_jepsen::cluster::{node_ip, NODE_GID_BASE};
use talon_jepsen::net::{enter_private_netns, Firewall};

/// Sends `bytes` to `to` from a socket of node 1's group and waits until the receiver has
/// read them all; returns how long that took and what the receiver read.
fn send_as_node_1(to: &TcpListener, bytes: &[u8]) -> (Duration, Vec<u8>) {
    let addr: SocketAddr = to.local_addr().expect("listener address");
    let before = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(NODE_GID_BASE + 1));
    let sent = TcpStream::connect(addr);
    nix::unistd::setfsgid(before);
    let mut sent = sent.expect("connect to node 2's address");
    let (mut got, _) = to.accept().expect("accept");
    let start = Instant::now();
    let writer = {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            sent.write_all(&bytes).expect("send");
            sent.shutdown(std::net::Shutdown::Write).expect("shut down");
        })
    };
    let mut read = Vec::new();
    got.read_to_end(&mut read).expect("receive");
    let took = start.elapsed();
    writer.join().expect("sender");
    (took, read)
}

#[test]
fn a_slow_link_delivers_late_and_whole_and_heals_at_once() {
    // Before any thread of this test's own: threads started later share the namespace.
    let ns = enter_private_netns().expect("a network namespace of this test's own (root)");
    let fw = Firewall::new(&ns, true).expect("a firewall with the slow links' queue");
    let to_node_2 = TcpListener::bind((node_ip(2), 0)).expect("listen on node 2's address");
    let bytes: Vec<u8> = (0..8 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();

    fw.slow(&[(1, 2)], 16)
        .expect("slow the link between nodes 1 and 2");
    let (took, read) = send_as_node_1(&to_node_2, &bytes);
    assert_eq!(read, bytes, "the slowed link delivers every byte in order");
    // 8 KiB at 16 kbit/s is 4 s; the queue sends a burst of at most 1,600 bytes at once.
    assert!(
        took >= Duration::from_secs(2),
        "8 KiB crossed a 16 kbit/s link in {took:?}"
    );

    fw.apply(&[]).expect("heal");
    let big: Vec<u8> = bytes.iter().copied().cycle().take(1 << 20).collect();
    let (took, read) = send_as_node_1(&to_node_2, &big);
    assert_eq!(read, big, "the healed link delivers every byte in order");
    // At 16 kbit/s a MiB would take over 8 minutes.
    assert!(
        took < Duration::from_secs(60),
        "a MiB took {took:?} after the link healed"
    );
}
