//! `symm-labs`: the labs' checker. `cargo xtask lab ...` runs it; see `labs/README.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use symm_labs::grade::{GpuRun, Grader, Which};
use symm_labs::{lab, Lab, LABS};

const USAGE: &str = "usage: symm-labs list
       symm-labs check N [--solution] [--slots S] [--out DIR]
       symm-labs run N --gpu [--solution] [--out DIR]
       symm-labs grade-all
       symm-labs bugs
  list        the labs
  check N     grade lab N: the student's skeleton.rs (--solution: the reference solution);
              writes yours.trace and reference.trace to DIR (default <target>/labs/NN);
              --slots S (lab 3): run the schedule with S scratch slots only, to see what
              happens (a deadlock with one slot), instead of grading it
  run N --gpu run lab N's schedule (the showcase case of `check`) on this machine's GPU
              through symm's plan interpreter, check its outputs with the checker and compare
              its GPU trace op by op with the simulator's; writes gpu.trace and
              simulated.trace to DIR. Without a GPU it says so in one line.
  grade-all   every solution must pass and every skeleton must fail (what CI runs)
  bugs        the bug catalogue: realistic bugs planted in every lab's solution; each must
              fail its lab's check, and the table says whose hint names its cause";

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target"), |root| root.join("target")),
    }
}

fn check(l: &Lab, which: Which, out: PathBuf, slots: Option<u64>) -> bool {
    let file = match which {
        Which::Student => "skeleton.rs",
        Which::Solution => "solution.rs",
    };
    println!("lab {}: {} (labs/{}/{file})", l.number, l.title, l.dir);
    // A failed trace of an earlier run is not this run's.
    let _ = std::fs::remove_file(out.join(symm_labs::grade::FAILED_TRACE));
    let mut g = Grader::new(which, Some(out.clone()));
    g.slots = slots;
    let verdict = (l.check)(&mut g);
    for p in &g.passed {
        println!("{p}");
    }
    let ok = match &verdict {
        Ok(()) if slots.is_some() => {
            println!(
                "lab {}: the schedule runs through with {} slot(s) at every world (not a grade: \
                 cargo xtask lab check {} grades it)",
                l.number,
                slots.unwrap_or(0),
                l.number
            );
            true
        }
        Ok(()) if l.loom => {
            // Not the lab's verdict: its loom half runs next (`cargo xtask lab check N`).
            println!(
                "lab {}: the ops pass; the lab passes once its orderings pass under loom too",
                l.number
            );
            true
        }
        Ok(()) => {
            println!("lab {} passes", l.number);
            true
        }
        Err(f) => {
            print!("{f}");
            false
        }
    };
    if let Some((label, path)) = &g.failed {
        println!(
            "the failing case ({label}) is traced in {}: cargo xtask lab view {} prints the \
             link; open its address with ?trace=traces/{}",
            path.display(),
            l.number,
            symm_labs::grade::FAILED_TRACE
        );
    }
    let yours = out.join("yours.trace");
    if yours.exists() {
        // With --solution the reference ran in the student's place.
        let whose = match which {
            Which::Student => "yours",
            Which::Solution => "the reference solution, run by --solution",
        };
        let whose = match g.failed {
            Some(_) => format!("{whose}, on the showcase case"),
            None => whose.to_string(),
        };
        println!(
            "traces: {} ({whose}) and {} (the reference solution)",
            yours.display(),
            out.join("reference.trace").display()
        );
        println!(
            "compare them in the viz: cargo xtask lab view {} (it prints the link)",
            l.number
        );
    }
    ok
}

/// The lab whose checker takes `--slots`.
const SLOTS_LAB: u8 = 3;

/// The value of `--slots`: a count from 1 to 255 (what a request can allocate).
fn parse_slots(s: Option<&str>) -> Result<u64, String> {
    let s = s.ok_or("--slots needs a count, e.g. --slots 1")?;
    match s.parse::<u8>() {
        Ok(n) if n >= 1 => Ok(n as u64),
        _ => Err(format!("--slots {s:?}: give a count from 1 to 255")),
    }
}

fn grade_all() -> bool {
    let mut ok = true;
    for l in LABS {
        let t = Instant::now();
        let sol = (l.check)(&mut Grader::new(Which::Solution, None));
        let stu = (l.check)(&mut Grader::new(Which::Student, None));
        let secs = t.elapsed().as_secs_f64();
        let head = format!("lab {} {:<42}", l.number, l.title);
        match (sol, stu) {
            (Ok(()), Err(f)) => {
                let first = f.problem.words(&f.req).to_string();
                let first = first.lines().next().unwrap_or("").to_string();
                let cut: String = first.chars().take(90).collect();
                println!("{head} ok ({secs:.1} s): the skeleton fails: {cut}");
            }
            (Err(f), _) => {
                ok = false;
                println!("{head} FAILED: the solution fails\n{f}");
            }
            (Ok(()), Ok(())) => {
                ok = false;
                println!("{head} FAILED: the untouched skeleton passes");
            }
        }
    }
    ok
}

/// The GPUs here, or why none (a loom build has no GPU runtime).
fn gpus() -> Result<i32, String> {
    #[cfg(not(loom))]
    return symm_labs::gpu::gpus();
    #[cfg(loom)]
    return Err("this is a loom build, without the GPU runtime".into());
}

/// `run N --gpu`: the checker first (on the host), then the showcase case on the GPU.
fn run_gpu(l: &Lab, which: Which, out: PathBuf) -> bool {
    if let Err(e) = gpus() {
        println!(
            "lab {}: no GPU here ({e}); `cargo xtask lab check {}` runs it on the simulator",
            l.number, l.number
        );
        return true;
    }
    println!("lab {}: {} on the GPU", l.number, l.title);
    let mut g = Grader::new(which, Some(out.clone()));
    g.gpu = Some(GpuRun::default());
    let verdict = (l.check)(&mut g);
    let ran = g.gpu.and_then(|r| r.result);
    match (verdict, ran) {
        (_, Some(Ok(line))) => {
            println!("lab {} on the GPU: {line}", l.number);
            println!(
                "traces: {} and {}; compare them: cargo xtask lab view {} --gpu",
                out.join("gpu.trace").display(),
                out.join("simulated.trace").display(),
                l.number
            );
            true
        }
        (_, Some(Err(e))) => {
            println!("lab {} on the GPU: {e}", l.number);
            false
        }
        (Err(f), None) => {
            print!("{f}");
            println!(
                "lab {}: fix what the checker found first; the GPU runs the schedule once it passes",
                l.number
            );
            false
        }
        (Ok(()), None) => {
            println!("lab {}: its checker has no showcase case to run", l.number);
            false
        }
    }
}

/// Lab `n` of the command line, its number and its default output folder.
fn lab_arg(n: &str) -> Result<(u8, &'static Lab, PathBuf), String> {
    let n: u8 = n
        .parse()
        .map_err(|_| format!("{n:?} is not a lab number"))?;
    let l = lab(n).ok_or_else(|| format!("there is no lab {n} (symm-labs list)"))?;
    Ok((n, l, target_dir().join("labs").join(format!("{n:02}"))))
}

fn run(args: &[String]) -> Result<bool, String> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] | ["--help" | "-h" | "help", ..] => {
            println!("{USAGE}");
            Ok(true)
        }
        ["list"] => {
            for l in LABS {
                println!("{:>2}  {:<36} labs/{}/", l.number, l.title, l.dir);
            }
            Ok(true)
        }
        ["grade-all"] => Ok(grade_all()),
        ["bugs"] => {
            let outcomes: Vec<_> = symm_labs::catalogue::bugs()
                .iter()
                .map(symm_labs::catalogue::run)
                .collect();
            let (table, holds) = symm_labs::catalogue::report(&outcomes);
            print!("{table}");
            Ok(holds)
        }
        ["check", n, rest @ ..] => {
            let (n, l, mut out) = lab_arg(n)?;
            let mut which = Which::Student;
            let mut slots = None;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match *a {
                    "--solution" => which = Which::Solution,
                    "--out" => out = PathBuf::from(it.next().ok_or("--out needs a folder")?),
                    "--slots" => slots = Some(parse_slots(it.next().copied())?),
                    other => return Err(format!("unexpected argument {other:?}\n{USAGE}")),
                }
            }
            if slots.is_some() && n != SLOTS_LAB {
                return Err(format!(
                    "--slots goes with lab {SLOTS_LAB}, the lab with scratch slots"
                ));
            }
            Ok(check(l, which, out, slots))
        }
        ["run", n, rest @ ..] => {
            let (_, l, mut out) = lab_arg(n)?;
            let mut which = Which::Student;
            let mut gpu = false;
            let mut it = rest.iter();
            while let Some(a) = it.next() {
                match *a {
                    "--gpu" => gpu = true,
                    "--solution" => which = Which::Solution,
                    "--out" => out = PathBuf::from(it.next().ok_or("--out needs a folder")?),
                    other => return Err(format!("unexpected argument {other:?}\n{USAGE}")),
                }
            }
            if !gpu {
                return Err(format!(
                    "run N needs --gpu (check N runs the schedule on the host)\n{USAGE}"
                ));
            }
            Ok(run_gpu(l, which, out))
        }
        _ => Err(format!("unexpected arguments {args:?}\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
