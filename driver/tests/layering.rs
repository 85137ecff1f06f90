//! The runtime does not depend on its test backend: nothing under `driver/src/cuda/comm/` (the
//! `Comm` a job embeds) names `cuda::world` (the one-process `World` the GPU checks use). What
//! both need (buffer bounds, device plans, timeout records, launches) lives beside them in
//! `cuda/`.

use std::path::Path;

#[test]
fn the_comm_runtime_never_imports_the_world_backend() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cuda/comm");
    let mut seen = 0;
    let mut found = Vec::new();
    for e in std::fs::read_dir(&dir).expect("the comm module is a directory") {
        let p = e.unwrap().path();
        let text = std::fs::read_to_string(&p).unwrap();
        seen += 1;
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("world::") {
                found.push(format!("{}:{}: {}", p.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(seen >= 5, "the scan read the comm module ({seen} files)");
    assert!(
        found.is_empty(),
        "comm imports the World backend: {found:#?}"
    );
}
