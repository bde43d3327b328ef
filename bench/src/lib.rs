//! Talon's benchmark harness: the workloads behind every number in `bench/README.md`.
//!
//! - [`mdtest`]: IOR mdtest's metadata workload, with its flags, names and SUMMARY table;
//! - [`imagenet`]: a class-per-directory tree of JPEG-sized files read in shuffled epochs
//!   by K workers, and a loader mode where each worker is an accelerator that needs a
//!   batch every T ms;
//! - [`traverse`]: a deep tree whose leaf files are opened and read in random order;
//! - [`records`]: small records read at random offsets of a few large shards, as a
//!   language model's data loader reads a tokenized dataset;
//! - [`memfs`]: not a workload but a target to run them on: an in-memory file system
//!   mounted through FUSE with the options of Talon's mount, the ceiling of any FUSE file
//!   system so mounted on the machine.
//!
//! Every workload runs over a [`target`]: any mounted path (`posix:PATH`: Talon's FUSE
//! mount, tmpfs, ext4, another FUSE file system) or a Talon cluster through the embedded
//! client library (`talon:ADDRS`), on OS threads ([`tasks`]) that make the same calls on
//! either, so the harness is never what bounds a run. Each report carries the one-line
//! command that reproduces it, and can be written as JSON.

pub mod cli;
pub mod epoch;
pub mod imagenet;
pub mod mdtest;
pub mod memfs;
pub mod records;
pub mod stats;
pub mod target;
pub mod tasks;
pub mod traverse;
