//! Lab 7's README shows the numbers the checker prints: its crossover table rows and the times
//! of the traces it suggests opening come from the code, and this test fails when they drift.

use symm_driver::host::DEFAULT_LINK;
use symm_labs::lab07::{self, row_words, solution, table, SHOWN};

fn readme() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join("07-one-shot-two-shot/README.md")).unwrap()
}

#[test]
fn the_readme_table_rows_are_the_reference_solutions() {
    let rows = table(&solution::one_shot, &solution::two_shot, &DEFAULT_LINK).expect("runs");
    let text = readme();
    let shown: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.split_whitespace().count() == 5 && l.starts_with(char::is_numeric))
        .collect();
    assert!(shown.len() >= 4, "the README shows too few rows: {shown:?}");
    for line in &shown {
        let bytes: u64 = line.split_whitespace().next().unwrap().parse().unwrap();
        let row = rows
            .iter()
            .find(|r| r.bytes == bytes)
            .expect("a size of SIZES");
        assert_eq!(
            row_words(row).trim(),
            *line,
            "the README's row for {bytes} bytes"
        );
    }
    // The crossover the README names is the one both curves give.
    let cross = rows
        .iter()
        .find(|r| r.model_two < r.model_one)
        .unwrap()
        .bytes;
    let sim = rows.iter().find(|r| r.sim_two < r.sim_one).unwrap().bytes;
    assert_eq!(
        cross, sim,
        "the model and the simulator cross at the same size"
    );
    let words = format!("{} KiB", cross >> 10);
    assert!(
        text.contains(&format!("crossover: {words}")),
        "the README names the crossover {words}"
    );
    // One-shot wins at the smallest size: there is a crossover to find.
    assert!(rows[0].model_one < rows[0].model_two && rows[0].sim_one < rows[0].sim_two);
}

#[test]
fn the_readme_quotes_the_shown_traces_times() {
    let (one, two) = lab07::shown_times().expect("runs");
    let (w, bytes) = SHOWN;
    let text = readme();
    let quoted = format!(
        "world {w} and {} KiB: {one:.2} us against {two:.2} us",
        bytes >> 10
    );
    assert!(text.contains(&quoted), "the README should say \"{quoted}\"");
    // The traces show a contrast: one-shot visibly ahead at that size.
    assert!(two > one * 1.2, "{one} {two}");
}
