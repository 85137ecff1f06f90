//! `cargo xtask lab`: the teaching labs of `labs/`.
//!
//! Each lab is a folder `labs/NN-name/` with a README that teaches one idea, a `skeleton.rs` the
//! student edits and a `solution.rs`. The checker is the `symm-labs` binary (run with
//! `cargo run --release -p symm-labs`, so a student's compile error never breaks xtask itself);
//! lab 4's memory-ordering half is a loom model (`labs/tests/lab04_loom.rs`), built with
//! `--cfg loom` in `<target>/loom` beside the library's own loom models. The commands are
//! those of [`USAGE`].

use crate::util::{self, cargo};
use std::path::{Path, PathBuf};

/// Usage of `cargo xtask lab`.
pub const USAGE: &str = "usage: cargo xtask lab                       list the labs
       cargo xtask lab N                     show lab N and the file to edit
       cargo xtask lab check N [--solution]  grade lab N (your skeleton.rs; --solution: the
                                             reference solution); writes your trace and the
                                             reference's to <target>/labs/NN
       cargo xtask lab check 3 --slots S     run lab 3's schedule with S scratch slots only and
                                             show what happens (with 1: the deadlock)
       cargo xtask lab view N                build the viz (installing, and saying so first, the
                                             wasm32 target and wasm-bindgen-cli when missing) and
                                             serve lab N's traces on 127.0.0.1, yours beside the
                                             reference in the compare view
       cargo xtask lab run N --gpu [--solution]
                                             run lab N's schedule on this machine's GPU (ranks
                                             share one GPU when there are fewer): the checker
                                             first, then its showcase case through the plan
                                             interpreter, outputs checked, the GPU trace compared
                                             op by op with the simulator's (no GPU: one line)
       cargo xtask lab view N --gpu          the GPU trace beside the simulator's
       cargo xtask lab grade                 every solution must pass and every untouched
                                             skeleton must fail (run by cargo xtask test)
       cargo xtask lab bugs                  the bug catalogue: realistic bugs planted in the
                                             solutions, each failing its lab's check, and which
                                             hints name the cause (its test runs in CI)
  <target> is $CARGO_TARGET_DIR when set, else target/.";

/// Labs with a loom half: (number, test target of `symm-labs`).
const LOOM: &[(u8, &str)] = &[(4, "lab04_loom")];

/// A lab folder: its number, folder, README title and expected time.
struct Lab {
    number: u8,
    dir: PathBuf,
    title: String,
    time: String,
}

fn labs_dir() -> PathBuf {
    util::root().join("labs")
}

/// Every lab folder (`NN-name` with a README), in order.
fn labs() -> Result<Vec<Lab>, String> {
    let root = labs_dir();
    let entries = std::fs::read_dir(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(number) = name.get(..2).and_then(|n| n.parse::<u8>().ok()) else {
            continue;
        };
        let readme = e.path().join("README.md");
        let Ok(text) = std::fs::read_to_string(&readme) else {
            continue;
        };
        let title = text
            .lines()
            .next()
            .unwrap_or("")
            .trim_start_matches('#')
            .trim()
            .to_string();
        // The README's "Time: about 30 minutes." line, as "30 minutes".
        let time = text
            .lines()
            .find_map(|l| l.strip_prefix("Time: "))
            .map(|t| {
                t.trim_start_matches("about ")
                    .trim_end_matches('.')
                    .to_string()
            })
            .unwrap_or_default();
        out.push(Lab {
            number,
            dir: e.path(),
            title,
            time,
        });
    }
    out.sort_by_key(|l| l.number);
    Ok(out)
}

fn find(n: &str) -> Result<Lab, String> {
    let number: u8 = n
        .parse()
        .map_err(|_| format!("{n:?} is not a lab number\n{USAGE}"))?;
    labs()?
        .into_iter()
        .find(|l| l.number == number)
        .ok_or_else(|| format!("there is no lab {number} (cargo xtask lab lists them)"))
}

fn rel(p: &Path) -> String {
    p.strip_prefix(util::root())
        .unwrap_or(p)
        .display()
        .to_string()
}

/// One line of the list: number, expected time and folder in columns, then the title, which
/// may be of any length.
fn list_line(number: u8, time: &str, dir: &str, title: &str) -> String {
    format!("  {number:>2}  {time:<11} {dir:<30} {title}")
}

fn list() -> Result<(), String> {
    println!("labs (start with cargo xtask lab N):");
    let head = list_line(0, "time", "folder", "title").replacen(" 0", "  ", 1);
    println!("{head}");
    for l in labs()? {
        let title = l
            .title
            .split_once(": ")
            .map_or(l.title.as_str(), |(_, t)| t);
        let dir = format!("{}/", rel(&l.dir));
        println!("{}", list_line(l.number, &l.time, &dir, title));
    }
    println!("\nthe labs' index: labs/README.md");
    Ok(())
}

/// The README up to its first second-level heading: the lab's introduction.
fn show(l: &Lab) -> Result<(), String> {
    let readme = l.dir.join("README.md");
    let text =
        std::fs::read_to_string(&readme).map_err(|e| format!("{}: {e}", readme.display()))?;
    let intro: Vec<&str> = text
        .lines()
        .enumerate()
        .take_while(|(i, line)| *i == 0 || !line.starts_with("## "))
        .map(|(_, line)| line)
        .collect();
    println!("{}", intro.join("\n").trim_end());
    let (read, edit, n) = (rel(&readme), rel(&l.dir.join("skeleton.rs")), l.number);
    println!("\nread:  {read}\nedit:  {edit}\ncheck: cargo xtask lab check {n}");
    println!("view:  cargo xtask lab view {n}");
    Ok(())
}

fn out_dir(n: u8) -> PathBuf {
    util::target_dir().join("labs").join(format!("{n:02}"))
}

/// The command that reruns loom model `test` alone, built in `loom_dir` (cargo's own rerun
/// suggestion leaves out `--cfg loom`, without which the model only says how to run it).
fn loom_rerun(test: &str, loom_dir: &Path, args: &[&str]) -> String {
    let mut cmd = format!(
        "RUSTFLAGS=\"--cfg loom\" CARGO_TARGET_DIR={} cargo test --release -p symm-labs --test {test}",
        loom_dir.display()
    );
    if !args.is_empty() {
        cmd.push_str(" -- ");
        cmd.push_str(&args.join(" "));
    }
    cmd
}

/// The loom half of lab `n`: `None` when it has none, else whether it passed. `args` go to the
/// model's `main`.
fn loom(n: u8, args: &[&str]) -> Option<Result<(), String>> {
    let (_, test) = LOOM.iter().find(|(l, _)| *l == n)?;
    let dir = util::target_dir().join("loom");
    eprintln!("lab {n}: the memory orderings, under loom (built with --cfg loom in <target>/loom)");
    let ran = util::run(
        util::cargo_with(&format!("test -q --release -p symm-labs --test {test} --"))
            .args(args)
            .env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", &dir),
    );
    Some(ran.map_err(|_| {
        format!(
            "its memory orderings fail (see above: a static check or an execution loom found); \
             rerun that part alone with:\n  {}",
            loom_rerun(test, &dir, args)
        )
    }))
}

/// Lab `n`'s verdict from its parts: the checker of its ops and, when it has one, its loom
/// model. The lab passes only when every part passes.
fn verdict(n: u8, ops: Result<(), ()>, loom: Option<Result<(), String>>) -> Result<String, String> {
    let mut failed = Vec::new();
    if ops.is_err() {
        failed.push("its ops fail the checker (see above)".to_string());
    }
    if let Some(Err(e)) = loom {
        failed.push(e);
    }
    if failed.is_empty() {
        Ok(format!("lab {n} passes"))
    } else {
        Err(format!("lab {n} does not pass yet: {}", failed.join("; ")))
    }
}

/// The checker's command line: `symm-labs SUB N FLAGS --out <target>/labs/NN` through cargo.
fn checker(sub: &str, l: &Lab, flags: &[&str]) -> std::process::Command {
    let out = out_dir(l.number).display().to_string();
    let n = l.number.to_string();
    let mut c = cargo();
    c.args(["run", "-q", "--release", "-p", "symm-labs", "--", sub, &n])
        .args(flags)
        .args(["--out", &out]);
    c
}

fn check(l: &Lab, solution: bool, slots: Option<&str>) -> Result<(), String> {
    let n = l.number;
    let mut flags = Vec::new();
    if solution {
        flags.push("--solution");
    }
    if let Some(s) = slots {
        flags.extend(["--slots", s]);
    }
    if slots.is_some() {
        // Not a grade: the checker's own output says what the schedule did.
        return util::run(&mut checker("check", l, &flags)).map_err(|_| {
            format!(
                "lab {n} does not run through with --slots {}",
                slots.unwrap_or("")
            )
        });
    }
    let ops = util::run(&mut checker("check", l, &flags)).map_err(|_| ());
    let loom = loom(l.number, if solution { &["--solution"] } else { &[] });
    if loom.is_none() {
        // The checker's own last line is the verdict.
        return ops.map_err(|()| format!("lab {n} does not pass yet"));
    }
    let v = verdict(l.number, ops, loom)?;
    println!("{v}");
    Ok(())
}

/// `lab run N --gpu`: the checker's binary does it all (and says in one line when there is no
/// GPU).
fn run_gpu(l: &Lab, solution: bool) -> Result<(), String> {
    let flags: &[&str] = if solution {
        &["--gpu", "--solution"]
    } else {
        &["--gpu"]
    };
    util::run(&mut checker("run", l, flags))
        .map_err(|_| format!("lab {} does not run on the GPU yet (see above)", l.number))
}

/// `lab view N --gpu`: the GPU trace of `lab run N --gpu` beside the simulator's.
fn view_gpu(l: &Lab) -> Result<(), String> {
    let out = out_dir(l.number);
    if !out.join("gpu.trace").exists() {
        return Err(format!(
            "lab {}: no GPU trace yet: run cargo xtask lab run {} --gpu on a machine with a GPU",
            l.number, l.number
        ));
    }
    let dist = crate::viz::build()?;
    println!(
        "lab {}: the link below opens the GPU's trace, with the simulator's of the same ops in \
         the compare view",
        l.number
    );
    crate::viz::serve(
        &dist,
        &out,
        Some("?trace=traces/gpu.trace&compare=traces/simulated.trace"),
    )
}

fn view(l: &Lab) -> Result<(), String> {
    let out = out_dir(l.number);
    let time = |p: PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let traced = time(out.join("yours.trace"));
    // A trace older than the skeleton shows code that is gone: check again first.
    if traced.is_none() || time(l.dir.join("skeleton.rs")) > traced {
        let n = l.number;
        eprintln!("lab {n}: no traces, or skeleton.rs is newer than them: checking first");
        let _ = check(l, false, None);
    }
    let dist = crate::viz::build()?;
    println!(
        "lab {}: the link below opens the reference solution, with yours in the compare view",
        l.number
    );
    crate::viz::serve(
        &dist,
        &out,
        Some("?trace=traces/reference.trace&compare=traces/yours.trace"),
    )
}

/// Every solution passes and every untouched skeleton fails, loom halves included.
pub fn grade() -> Result<(), String> {
    util::run(&mut util::cargo_with(
        "run -q --release -p symm-labs -- grade-all",
    ))?;
    for (n, _) in LOOM {
        if labs()?.iter().any(|l| l.number == *n) {
            if let Some(r) = loom(*n, &["--grade"]) {
                r.map_err(|e| format!("lab {n}: {e}"))?;
            }
        }
    }
    Ok(())
}

/// `args` without `--slots S` (or `--slots=S`), and `S`; the checker judges `S` itself.
fn take_slots(args: &[String]) -> Result<(Vec<String>, Option<String>), String> {
    let mut rest = Vec::new();
    let mut slots = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--slots" {
            let v = it.next().ok_or(format!("--slots needs a count\n{USAGE}"))?;
            slots = Some(v.clone());
        } else if let Some(v) = a.strip_prefix("--slots=") {
            slots = Some(v.to_string());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((rest, slots))
}

/// `cargo xtask lab ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let (args, slots) = take_slots(args)?;
    let (words, flags): (Vec<String>, Vec<String>) =
        args.iter().cloned().partition(|a| !a.starts_with('-'));
    let Some(parsed) =
        util::command_args(&flags, &[("--solution", false), ("--gpu", false)], USAGE)?
    else {
        return Ok(());
    };
    let solution = parsed.flag("--solution");
    let gpu = parsed.flag("--gpu");
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    if slots.is_some() && !matches!(words.as_slice(), ["check", "3" | "03"]) {
        return Err(format!("--slots goes with check 3\n{USAGE}"));
    }
    if solution && !matches!(words.as_slice(), ["check" | "run", _]) {
        return Err(format!(
            "--solution goes with check N or run N --gpu\n{USAGE}"
        ));
    }
    if gpu != matches!(words.as_slice(), ["run", _]) && !matches!(words.as_slice(), ["view", _]) {
        return Err(format!(
            "run N takes --gpu (and --gpu goes with run N or view N)\n{USAGE}"
        ));
    }
    match words.as_slice() {
        [] => list(),
        ["run", n] => run_gpu(&find(n)?, solution),
        ["view", n] if gpu => view_gpu(&find(n)?),
        ["check", n] => check(&find(n)?, solution, slots.as_deref()),
        ["view", n] => view(&find(n)?),
        ["grade"] => grade(),
        ["bugs"] => util::run(&mut util::cargo_with(
            "run -q --release -p symm-labs -- bugs",
        )),
        [n] if n.parse::<u8>().is_ok() => show(&find(n)?),
        _ => Err(format!("unexpected arguments {words:?}\n{USAGE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lab_passes_only_when_every_part_passes() {
        assert_eq!(verdict(4, Ok(()), Some(Ok(()))), Ok("lab 4 passes".into()));
        let loom_failed = verdict(4, Ok(()), Some(Err("the loom model failed".into())));
        let e = loom_failed.expect_err("a failed loom model fails the lab");
        assert!(e.starts_with("lab 4 does not pass yet"), "{e}");
        assert!(!e.contains("lab 4 passes"), "{e}");
        assert!(verdict(4, Err(()), Some(Ok(()))).is_err());
        assert!(verdict(4, Err(()), None).is_err());
    }

    #[test]
    fn slots_and_their_count_are_taken_out_of_the_words() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (rest, slots) = take_slots(&args(&["check", "--slots", "1", "3"])).unwrap();
        assert_eq!((rest, slots.as_deref()), (args(&["check", "3"]), Some("1")));
        let (rest, slots) = take_slots(&args(&["check", "3", "--slots=2"])).unwrap();
        assert_eq!((rest, slots.as_deref()), (args(&["check", "3"]), Some("2")));
        assert!(take_slots(&args(&["check", "3", "--slots"])).is_err());
        // Only lab 3 has scratch slots: any other lab is refused before anything runs.
        let e = run(&args(&["check", "1", "--slots", "1"])).expect_err("refused");
        assert!(e.starts_with("--slots goes with check 3"), "{e}");
        assert!(run(&args(&["view", "3", "--slots", "1"])).is_err());
    }

    #[test]
    fn long_titles_leave_the_columns_in_line() {
        let short = list_line(
            1,
            "30 minutes",
            "labs/01-ring-all-gather/",
            "Ring all-gather",
        );
        let long = list_line(
            7,
            "an hour",
            "labs/07-one-shot-two-shot/",
            "One-shot against two-shot: predict the crossover, then measure it",
        );
        let at = |line: &str, what: &str| line.find(what).expect(what);
        assert_eq!(at(&short, "labs/"), at(&long, "labs/"), "{short}\n{long}");
        assert_eq!(at(&short, "Ring"), at(&long, "One-shot"), "{short}\n{long}");
    }

    #[test]
    fn every_lab_states_its_expected_time() {
        let labs = labs().unwrap();
        assert!(labs.len() >= 9);
        for l in labs {
            assert!(
                l.time.contains("minutes") || l.time.contains("hour"),
                "lab {}: {:?}",
                l.number,
                l.time
            );
        }
    }

    #[test]
    fn the_loom_rerun_command_builds_with_cfg_loom() {
        let cmd = loom_rerun("lab04_loom", Path::new("/t/loom"), &["--solution"]);
        assert_eq!(
            cmd,
            "RUSTFLAGS=\"--cfg loom\" CARGO_TARGET_DIR=/t/loom cargo test --release -p \
             symm-labs --test lab04_loom -- --solution"
        );
        assert!(!loom_rerun("lab04_loom", Path::new("/t"), &[]).contains(" -- "));
    }
}
