//! Each lab's expected time is stated once in words and agrees everywhere: the lab's own README
//! ("Time: about two hours.") and the course table in `labs/README.md`.

use std::path::Path;

#[test]
fn the_course_table_gives_each_lab_the_time_its_readme_states() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut rows = 0;
    for line in table.lines().filter(|l| l.starts_with("| [")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (link, time) = (cells[1], cells[2]);
        let dir = link
            .split("](")
            .nth(1)
            .and_then(|l| l.strip_suffix("/README.md)"))
            .unwrap_or_else(|| panic!("no lab link in {line}"));
        let readme = std::fs::read_to_string(root.join(dir).join("README.md")).unwrap();
        let stated = readme
            .lines()
            .find_map(|l| l.strip_prefix("Time: about "))
            .and_then(|t| t.strip_suffix('.'))
            .unwrap_or_else(|| panic!("{dir}: no \"Time: about ...\" line"));
        assert_eq!(time, stated, "{dir}: the table and the lab's README differ");
        rows += 1;
    }
    assert_eq!(rows, 9);
}
