//! The README's environment table lists exactly the variables `Config` reads, each once, and every `NETCL_*` variable the benchmark crate reads is documented there too.
use netcl_core_devices::Config;
use std::collections::BTreeSet;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The `NETCL_*` names starting a table row of the README's Environment section, per table.
fn tables() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme
        .find("\n## Environment\n")
        .expect("README has ## Environment");
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut tables = vec![Vec::new()];
    for line in section.lines() {
        if !line.starts_with('|') {
            if !tables.last().is_some_and(Vec::is_empty) {
                tables.push(Vec::new());
            }
            continue;
        }
        let first = line.split('|').nth(1).unwrap_or("");
        let names = first
            .split('`')
            .filter_map(|w| w.split('=').next())
            .filter(|w| w.starts_with("NETCL_"))
            .map(str::to_string);
        if let Some(t) = tables.last_mut() {
            t.extend(names);
        }
    }
    tables.retain(|t| !t.is_empty());
    tables
}

#[test]
fn readme_lists_exactly_configs_variables_once() {
    let tables = tables();
    let library = &tables[0];
    let listed: BTreeSet<&str> = library.iter().map(String::as_str).collect();
    assert_eq!(listed.len(), library.len(), "listed twice: {library:?}");
    let known: BTreeSet<&str> = Config::variables().into_iter().collect();
    assert_eq!(
        listed, known,
        "README's first Environment table against Config"
    );
    let all: Vec<&String> = tables.iter().flatten().collect();
    let distinct: BTreeSet<&String> = all.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "a variable documented twice: {all:?}"
    );
}

/// Every `"NETCL_..."` string in `dir`'s Rust files.
fn names_in(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            names_in(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split("\"NETCL_").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if piece[name.len()..].starts_with('"') {
                    out.insert(format!("NETCL_{name}"));
                }
            }
        }
    }
}

#[test]
fn every_variable_the_benchmarks_read_is_documented() {
    let documented: BTreeSet<String> = tables().into_iter().flatten().collect();
    let mut read = BTreeSet::new();
    names_in(&root().join("crates/bench/src"), &mut read);
    assert!(read.len() > 5, "{read:?}");
    let missing: Vec<&String> = read.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "not in README's Environment tables: {missing:?}"
    );
}
