//! The floors of `src/lib.rs` hold: a module refers only to modules on its
//! own floor or below (`crate::<module>` in shipped code; test-only code is
//! left out), and no set of modules refers to each other in a circle. A
//! move that runs an arrow up a floor fails here, naming the file.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, from the ground up (the table in `src/lib.rs`).
const FLOORS: &[&[&str]] = &[
    &[
        "clock", "units", "store", "stats", "reply", "path", "lease", "testing",
    ],
    &["schedule", "queue", "gate", "matcher", "keys", "ratelimit"],
    &["config"],
    &["adaptive", "cluster"],
    &["rate", "classes"],
    &["worker"],
    &["stream"],
];

/// Test-only modules (gated out of the `.wasm`): above every floor.
const TEST_ONLY: &[&str] = &["sim"];

fn floor_of(m: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&m))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Whether a file is test-only by its name.
fn test_only(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "tests.rs"
        || name.starts_with("tests_")
        || name == "sim.rs"
        || name == "scenarios.rs"
        || name == "testing.rs"
        || rel.starts_with("sim/")
        || rel.starts_with("bin/")
}

/// The shipped part of a file: up to its first inline `#[cfg(test)]`
/// module (`mod tests {`; a `mod tests;` line declares a file, left out by
/// its name).
fn shipped(text: &str) -> &str {
    let mut at = text.len();
    let mut from = 0;
    while let Some(i) = text[from..].find("#[cfg(test)]\n") {
        let start = from + i;
        let next = &text[start + "#[cfg(test)]\n".len()..];
        let line = next.lines().next().unwrap_or("");
        if line.contains("mod ") && line.trim_end().ends_with('{') {
            at = start;
            break;
        }
        from = start + 1;
    }
    text.get(..at).unwrap_or(text)
}

/// Every `crate::<module>` a shipped file refers to, with the file.
fn arrows() -> BTreeMap<(String, String), Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in all {
        let rel = f
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if test_only(&rel) || rel == "lib.rs" {
            continue;
        }
        let from = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        let text = std::fs::read_to_string(&f).unwrap();
        // Code only: a doc comment's link is no dependency.
        let code: String = shipped(&text)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let body = code.as_str();
        for (i, _) in body.match_indices("crate::") {
            let rest = &body[i + "crate::".len()..];
            let to: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            // `crate::{a, b}`: each name.
            let targets: Vec<String> = if to.is_empty() && rest.starts_with('{') {
                rest[1..rest.find('}').unwrap_or(1)]
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .chars()
                            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                            .collect()
                    })
                    .filter(|s: &String| !s.is_empty())
                    .collect()
            } else {
                vec![to]
            };
            for to in targets {
                if to != from && floor_of(&to).is_some() {
                    out.entry((from.clone(), to)).or_default().push(rel.clone());
                }
            }
        }
    }
    out
}

#[test]
fn every_module_has_a_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let lib = std::fs::read_to_string(src).unwrap();
    for line in lib.lines() {
        let Some(name) = line
            .strip_prefix("pub mod ")
            .and_then(|r| r.strip_suffix(';'))
        else {
            continue;
        };
        assert!(
            floor_of(name).is_some() || TEST_ONLY.contains(&name),
            "src/lib.rs declares `{name}`: give it a floor in tests/floors.rs and in lib.rs's table"
        );
    }
}

#[test]
fn no_arrow_runs_up_a_floor() {
    let mut up = Vec::new();
    for ((from, to), files) in arrows() {
        let (Some(a), Some(b)) = (floor_of(&from), floor_of(&to)) else {
            continue;
        };
        if b > a {
            let mut f: Vec<&String> = files.iter().collect();
            f.dedup();
            up.push(format!("{from} (floor {a}) -> {to} (floor {b}) in {f:?}"));
        }
    }
    assert!(up.is_empty(), "arrows up a floor:\n{}", up.join("\n"));
}

#[test]
fn no_modules_refer_to_each_other_in_a_circle() {
    let arrows = arrows();
    let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in arrows.keys() {
        next.entry(from.clone()).or_default().insert(to.clone());
    }
    // A circle through `m`: `m` reachable from one of its targets.
    for m in next.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = next[m].iter().cloned().collect();
        while let Some(x) = todo.pop() {
            if &x == m {
                panic!("a circle through `{m}`: {:?}", next);
            }
            if seen.insert(x.clone()) {
                todo.extend(next.get(&x).into_iter().flatten().cloned());
            }
        }
    }
}
