//! mdtest's flag spellings parse into the plan mdtest would run, and the phases a plan
//! runs are the ones the flags select.

use clap::Parser;
use talon_bench::cli::{Cli, Command};
use talon_bench::mdtest::{MdtestArgs, Phase, Plan};
use talon_bench::target::TargetSpec;

fn parse(args: &[&str]) -> MdtestArgs {
    let mut argv = vec!["talon-bench", "mdtest"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv).expect("flags parse").command {
        Command::Mdtest(a) => a,
        other => panic!("parsed as {other:?}"),
    }
}

#[test]
fn mdtest_spellings_parse() {
    let a = parse(&["--tasks", "8", "-n", "2000", "-F", "-u", "-d", "/dev/shm/x"]);
    assert_eq!(a.tasks, 8);
    assert_eq!(a.items, 2000);
    assert!(a.files_only && a.unique_dir && !a.dirs_only);
    assert_eq!(a.dir, "/dev/shm/x");
    assert_eq!(a.target, None);

    // Glued values, bundled flags and size suffixes, as mdtest's own parser takes them.
    let a = parse(&[
        "-n2k", "-Fu", "-z", "2", "-b", "3", "-w", "4k", "-e", "4096", "-i3",
    ]);
    assert_eq!(a.items, 2048);
    assert!(a.files_only && a.unique_dir);
    assert_eq!((a.depth, a.branch), (2, 3));
    assert_eq!((a.write_bytes, a.read_bytes, a.iterations), (4096, 4096, 3));

    let a = parse(&["-I", "10", "-C", "-T", "-E", "-r", "-U", "-D", "-N", "1"]);
    assert_eq!(a.items_per_dir, 10);
    assert!(a.create && a.stat && a.read && a.remove && a.rename && a.dirs_only);
    assert_eq!(a.stride, 1);

    let a = parse(&["-n", "5", "--target", "talon:127.0.0.1:7001,127.0.0.1:7002"]);
    assert_eq!(
        a.target,
        Some(TargetSpec::Talon(vec![
            "127.0.0.1:7001".into(),
            "127.0.0.1:7002".into()
        ]))
    );
}

#[test]
fn bad_flags_are_refused() {
    for bad in [
        &["-n", "ten"][..],
        &["-n", "5", "--target", "nfs:/x"],
        &["-n", "5", "-q", "-Z"],
    ] {
        let mut argv = vec!["talon-bench", "mdtest"];
        argv.extend_from_slice(bad);
        assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} parsed");
    }
    assert!(Plan::new(&parse(&[])).is_err(), "neither -n nor -I");
    assert!(Plan::new(&parse(&["-n", "10", "--tasks", "0"])).is_err());
    assert!(Plan::new(&parse(&["-n", "3", "-z", "2", "-b", "2"])).is_err());
    assert!(Plan::new(&parse(&["-n", "10", "-I", "3"])).is_err());
    assert!(Plan::new(&parse(&["-n", "10", "--batch", "0"])).is_err());
    assert!(
        Plan::new(&parse(&["-n", "10", "--batch", "8", "-w", "4k"])).is_err(),
        "batches create empty files"
    );
}

#[test]
fn the_command_line_round_trips() {
    let a = parse(&[
        "--tasks",
        "4",
        "-n",
        "100",
        "-z",
        "1",
        "-b",
        "2",
        "-u",
        "-F",
        "-w",
        "4096",
        "-e",
        "4096",
        "-i",
        "2",
        "--batch",
        "8",
        "-d",
        "run dir",
        "--target",
        "posix:/mnt/t",
    ]);
    let line = a.command_line();
    assert!(
        line.starts_with("talon-bench mdtest --tasks 4 -n 100"),
        "{line}"
    );
    assert!(line.contains("-d 'run dir'"), "{line}");
    // The printed command parses back to the same run.
    let words: Vec<String> = line
        .replace("'run dir'", "run_dir")
        .split(' ')
        .map(String::from)
        .collect();
    let mut again = Cli::try_parse_from(&words).expect("reparse");
    let Command::Mdtest(b) = &mut again.command else {
        panic!("not mdtest")
    };
    b.dir = "run dir".into();
    assert_eq!(&a, b);
}

#[test]
fn phases_follow_the_selection_flags() {
    let plan = |args: &[&str]| Plan::new(&parse(args)).expect("plan");
    use Phase::*;
    assert_eq!(
        plan(&["-n", "10"]).phases(),
        vec![
            TreeCreate, DirCreate, DirStat, DirRename, DirRemove, FileCreate, FileStat, FileRead,
            FileRemove, TreeRemove
        ]
    );
    assert_eq!(
        plan(&["-n", "10", "-F"]).phases(),
        vec![TreeCreate, FileCreate, FileStat, FileRead, FileRemove, TreeRemove]
    );
    assert_eq!(
        plan(&["-n", "10", "-D"]).phases(),
        vec![TreeCreate, DirCreate, DirStat, DirRename, DirRemove, TreeRemove]
    );
    assert_eq!(
        plan(&["-n", "10", "-F", "-C"]).phases(),
        vec![TreeCreate, FileCreate]
    );
    assert_eq!(
        plan(&["-n", "10", "-F", "-T", "-E"]).phases(),
        vec![FileStat, FileRead]
    );
    assert_eq!(
        plan(&["-n", "10", "-F", "-r"]).phases(),
        vec![FileRemove, TreeRemove]
    );
    // A single item cannot be renamed in a chain; mdtest skips the phase.
    assert!(!plan(&["-n", "1", "-D"]).phases().contains(&DirRename));
    // The SUMMARY table lists the file rows with -F, every row otherwise.
    assert_eq!(plan(&["-n", "10", "-F", "-C"]).summary_phases().len(), 6);
    assert_eq!(plan(&["-n", "10"]).summary_phases().len(), 10);
}

#[test]
fn operation_counts_follow_tasks_and_tree() {
    let p = Plan::new(&parse(&[
        "-n", "100", "-z", "1", "-b", "4", "--tasks", "3", "-u",
    ]))
    .expect("plan");
    assert_eq!((p.dirs_in_tree, p.items_per_dir, p.items), (5, 20, 100));
    assert_eq!(p.counted_ops(Phase::FileCreate), 300);
    // mdtest counts one tree for the tree phases, even with one tree per task.
    assert_eq!(p.counted_ops(Phase::TreeCreate), 5);
    assert_eq!(p.calls(Phase::TreeCreate), 15);
}
