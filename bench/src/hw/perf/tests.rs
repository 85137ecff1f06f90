use super::*;

#[test]
fn collectives_are_named_once_and_unknown_names_refused() {
    assert_eq!(selected(&[]).unwrap(), COLLECTIVES.to_vec());
    let two = [
        "broadcast".to_string(),
        " all_reduce".into(),
        "broadcast".into(),
    ];
    assert_eq!(
        selected(&two).unwrap(),
        vec![Kind::Broadcast, Kind::AllReduce]
    );
    for bad in ["put", "signal", "all-reduce", ""] {
        let e = selected(&[bad.to_string()]).unwrap_err();
        assert!(
            e.contains("unknown collective") && e.contains("alltoall"),
            "{e}"
        );
    }
}

#[test]
fn tables_fit_and_calibration_are_redone_from_a_runs_samples_without_gpus() {
    let dir = std::env::temp_dir().join(format!("symm-bench-from-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cal = dir.join("calibration");
    std::fs::create_dir_all(&cal).unwrap();
    let args = |out: &Path| {
        let cli = <crate::Cli as clap::Parser>::try_parse_from([
            "symm-bench",
            "bench",
            "--worlds",
            "2",
            "--from-samples",
            "--out",
            out.to_str().unwrap(),
            "--calibrate",
            cal.to_str().unwrap(),
        ])
        .unwrap();
        match cli.cmd {
            crate::Cmd::Bench(a) => a,
            other => panic!("{other:?}"),
        }
    };
    // No samples there: a clear error naming the file, nothing written.
    let e = run(&args(&dir)).unwrap_err();
    assert!(e.contains("samples-w2.tsv"), "{e}");
    assert!(!dir.join("bench-w2.md").exists());
    // Two-shot and ring at 1, 4 and 16 MiB (candidates and the winner), and NCCL.
    let mut samples = Vec::new();
    for (i, size) in [1u64 << 20, 4 << 20, 16 << 20].into_iter().enumerate() {
        let us = 10.0 * (i + 1) as f64;
        for (label, t) in [("two_shot/16ch", us), ("ring/16ch", us * 1.5)] {
            samples.push(Sample::new(
                Kind::AllReduce,
                size,
                CANDIDATE,
                "eager",
                t,
                0,
                label,
            ));
        }
        samples.push(Sample::new(
            Kind::AllReduce,
            size,
            "symm",
            "eager",
            us,
            0,
            "two_shot/16ch",
        ));
        samples.push(Sample::new(
            Kind::AllReduce,
            size,
            "nccl",
            "eager",
            us * 1.2,
            0,
            "nccl",
        ));
    }
    let mut text: String = samples.iter().map(|s| s.line() + "\n").collect();
    // Hostile lines: times that are no time, a plan symm would refuse (0 channels, more
    // channels than a plan holds), sizes at the edges. None reaches the table.
    for l in [
        "all_reduce\t1024\tsymm\teager\tNaN\t0\tring/1ch",
        "all_reduce\t2048\tsymm\teager\t-5\t0\ttwo_shot/1ch",
        "all_reduce\t8192\tsymm\teager\tinf\t0\ttwo_shot/1ch",
        "all_reduce\t16384\tsymm\teager\t3\t0\ttwo_shot/0ch",
        "all_reduce\t32768\tsymm\teager\t3\t0\tring/65535ch",
        "all_reduce\t0\tsymm\teager\t3\t0\tring/1ch",
        "all_reduce\t18446744073709551615\tsymm\teager\t3\t0\tring/1ch",
    ] {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(dir.join("samples-w2.tsv"), text).unwrap();
    run(&args(&dir)).unwrap();
    let md = std::fs::read_to_string(dir.join("bench-w2.md")).unwrap();
    assert!(md.contains("| 4M |") && md.contains("0.83"), "{md}");
    assert!(dir.join("sim-fit-w2.md").exists());
    let table = std::fs::read_to_string(cal.join("nvlink_w2.rs")).unwrap();
    assert!(table.contains("collective: \"all_reduce\", world: 2, bytes: 4194304, algorithm: TwoShot, channels: 16"), "{table}");
    assert_eq!(table.matches("Calibrated {").count(), 3, "{table}");
    // Samples that give no entry leave the table as it was.
    std::fs::write(
        dir.join("samples-w2.tsv"),
        "all_reduce\t16384\tsymm\teager\t3\t0\ttwo_shot/0ch\n",
    )
    .unwrap();
    run(&args(&dir)).unwrap();
    assert_eq!(
        std::fs::read_to_string(cal.join("nvlink_w2.rs")).unwrap(),
        table
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_split_run_keeps_the_collectives_it_did_not_measure() {
    let dir = std::env::temp_dir().join(format!("symm-bench-split-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("samples-w2.tsv");
    let old = [
        Sample::new(
            Kind::AllReduce,
            1024,
            "symm",
            "eager",
            4.0,
            0,
            "one_shot_ll/1ch",
        ),
        Sample::new(
            Kind::AllReduce,
            1024,
            "torch-two-shot",
            "graph",
            6.0,
            0,
            "t",
        ),
        Sample::new(Kind::Broadcast, 1024, "nccl", "eager", 9.0, 0, "nccl"),
        Sample::new(Kind::Put, 1 << 20, "copy-engine", "eager", 5.0, 0, "ce"),
    ];
    let mut text: String = old.iter().map(|s| s.line() + "\n").collect();
    text.push_str("not a sample\nall_reduce\tx\tsymm\teager\t1\t0\tbad size\n");
    std::fs::write(&path, text).unwrap();
    // Broadcast measured again: the all-reduce samples (symm's and torch's) stay; the old
    // broadcast, the device API's and the lines that do not parse go.
    let kept = earlier(&path, &[Kind::Broadcast]);
    assert_eq!(kept, old[..2].to_vec());
    // Nothing there yet: nothing kept.
    assert!(earlier(&dir.join("none.tsv"), &[Kind::Broadcast]).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
