//! The house's shape, read from the source: no circle of imports between files of any crate (other than a
//! module and its own descendants: a child may use what its parent holds), and the stage files of
//! `tessera_stages::stages` (listed once, in `stages::DAG`) never import the module that runs the DAG.
//!
//! Each crate's `src/` is read as a graph: a node per module file, an edge where one file names another
//! through a `crate::`, `super::` or `self::` path (in a `use` or anywhere in code, macros included) or a
//! `use` of a child module, test modules and test-only files aside. A path names the deepest module file it reaches. Edges from a module to
//! its own ancestors are left out (a child reads its parent's items; the parent declares the child), every
//! other circle fails with its files. `TESSERA_IMPORT_GRAPH=DIR` also writes each crate's graph as a
//! Graphviz file (`DIR/<crate>.dot`): the drawing of the house.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every workspace crate's source folder (the library's modules; `src/bin/` holds crates of their own).
const CRATES: &[&str] = &["source-digest", "store", "kernels", "stages", "fixtures", "pipeline", "runtime", "runtime-c", "python", "fuzz", "tests"];

/// Test-only files, which never reach a build's output (as `tessera_source_digest::is_test_only` says).
fn test_only(file: &str) -> bool {
    let stem = file.rsplit('/').next().unwrap().trim_end_matches(".rs");
    stem == "tests" || stem.ends_with("_tests") || stem.ends_with("_cases")
}

/// The code of a Rust file with comments, string and character literals blanked out.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !b.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_') {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without the items marked `#[cfg(test)]` (a `mod x;` line or a braced item).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(i) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        let semi = after.find(';');
        let brace = after.find('{');
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, ch) in after[b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The paths of a `use` tree (`a::{b, c::{d as e}}` -> `a::b`, `a::c::d`), without spaces.
fn expand_use(tree: &str) -> Vec<String> {
    let tree: String = without_renames(tree).chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    parts.iter().filter(|p| !p.is_empty()).flat_map(|p| expand_use(p)).map(|p| format!("{prefix}{p}")).collect()
}

/// `tree` without its renames (`d as e` -> `d`).
fn without_renames(tree: &str) -> String {
    let mut out = String::new();
    let mut rest = tree;
    while let Some(i) = find_word(rest, "as") {
        out.push_str(&rest[..i]);
        let after = rest[i + 2..].trim_start();
        rest = after.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
    }
    out.push_str(rest);
    out
}

/// A module's path from its file (`a/b.rs` and `a/b/mod.rs` -> `[a, b]`; `lib.rs` -> `[]`).
fn module_path(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// One crate's file-level import graph: file -> the files it names.
fn import_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect(src, src, &mut files);
    let modules: BTreeMap<Vec<String>, String> = files.iter().map(|f| (module_path(f), f.clone())).collect();
    let resolve = |path: &[String]| -> Option<&String> { (1..=path.len()).rev().find_map(|n| modules.get(&path[..n])) };
    let mut graph = BTreeMap::new();
    for file in &files {
        let code = without_test_items(&code_only(&std::fs::read_to_string(src.join(file)).unwrap()));
        let here = module_path(file);
        let mut paths: Vec<String> = Vec::new();
        let mut rest = code.as_str();
        while let Some(i) = find_word(rest, "use") {
            let after = &rest[i + 3..];
            let end = after.find(';').unwrap_or(after.len());
            // A `use` of a plain path names a child module of this one (or another crate, which resolves to
            // no file here): read it as `self::`.
            paths.extend(expand_use(&after[..end]).into_iter().map(|p| match p.split("::").next() {
                Some("crate" | "super" | "self" | "") => p,
                _ => format!("self::{p}"),
            }));
            rest = &after[end..];
        }
        for root in ["crate::", "super::", "self::"] {
            let mut rest = code.as_str();
            while let Some(i) = find_word(rest, root) {
                let tail: String = rest[i..].chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
                paths.push(tail);
                rest = &rest[i + root.len()..];
            }
        }
        let mut deps = BTreeSet::new();
        for p in paths {
            let segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
            let full: Vec<String> = match segs.first() {
                Some(&"crate") => segs[1..].iter().map(|s| s.to_string()).collect(),
                Some(&"super") | Some(&"self") => {
                    let mut full = here.clone();
                    let mut k = 0;
                    while let Some(&s) = segs.get(k) {
                        match s {
                            "super" => {
                                full.pop();
                            }
                            "self" => {}
                            _ => break,
                        }
                        k += 1;
                    }
                    full.extend(segs[k..].iter().map(|s| s.to_string()));
                    full
                }
                // Other paths in code: types, functions, other crates.
                _ => continue,
            };
            if let Some(target) = resolve(&full) {
                let target_module = module_path(target);
                // An edge to an ancestor (the module itself included) is a child reading its parent.
                if !here.starts_with(&target_module) {
                    deps.insert(target.clone());
                }
            }
        }
        graph.insert(file.clone(), deps);
    }
    graph
}

/// Where `word` starts in `text` as a whole word (not inside an identifier, not after `$` or `::`).
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut at = 0;
    while let Some(i) = text[at..].find(word) {
        let start = at + i;
        let before = text[..start].chars().next_back();
        let after = text[start + word.len()..].chars().next();
        let word_start = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        let word_end = word.ends_with(':') || !after.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if word_start && word_end {
            return Some(start);
        }
        at = start + word.len();
    }
    None
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        if p.is_dir() {
            if rel != "bin" {
                collect(root, &p, out);
            }
        } else if rel.ends_with(".rs") && !test_only(&rel) {
            out.push(rel);
        }
    }
}

/// The circles of a graph: its strongly connected components of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(v: &'a str, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(w, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), out: Vec::new() };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(v, &mut s);
        }
    }
    s.out
}

fn dot(name: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut out = format!("digraph \"{name}\" {{\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n");
    for (f, deps) in graph {
        out.push_str(&format!("  \"{f}\";\n"));
        for d in deps {
            out.push_str(&format!("  \"{f}\" -> \"{d}\";\n"));
        }
    }
    out.push_str("}\n");
    out
}

#[test]
fn no_crate_has_an_import_circle_between_files() {
    let root = workspace();
    let drawings = std::env::var_os("TESSERA_IMPORT_GRAPH").map(PathBuf::from);
    let mut found = Vec::new();
    for krate in CRATES {
        let graph = import_graph(&root.join(krate).join("src"));
        assert!(!graph.is_empty(), "{krate}: no source files read");
        if let Some(dir) = &drawings {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join(format!("{krate}.dot")), dot(krate, &graph)).unwrap();
        }
        for c in circles(&graph) {
            let edges: Vec<String> = c.iter().map(|f| format!("{f} -> {:?}", graph[f].iter().filter(|d| c.contains(d)).collect::<Vec<_>>())).collect();
            found.push(format!("{krate}/src: {}", edges.join("; ")));
        }
    }
    assert!(found.is_empty(), "import circles between files:\n{}", found.join("\n"));
}

#[test]
fn stage_files_never_import_the_module_that_runs_the_dag() {
    let src = workspace().join("stages/src");
    let graph = import_graph(&src);
    let files = tessera_stages::stages::files();
    for f in &files {
        let file = format!("stages/{f}");
        let deps = graph.get(&file).unwrap_or_else(|| panic!("stages::DAG names {file}, which is not a file of stages/src"));
        assert!(!deps.contains("build.rs"), "{file} imports build.rs, the module that runs the DAG");
    }
    // Every file of the folder is a stage's or a declared helper's.
    let folder: BTreeSet<String> = graph.keys().filter(|f| f.starts_with("stages/") && *f != "stages/mod.rs").cloned().collect();
    let declared: BTreeSet<String> = files.iter().map(|f| format!("stages/{f}")).collect();
    assert_eq!(folder, declared, "stages/src/stages/ holds stage files and the helpers stages::HELPERS names, nothing else");
    // The reader is not blind: the partition stage reads the context, validation the artifact helper, and the
    // build runs the stages.
    assert!(graph["stages/partition.rs"].contains("context.rs"), "{graph:?}");
    assert!(graph["stages/validate.rs"].contains("stages/artifact.rs"), "{graph:?}");
    assert!(graph["build.rs"].contains("stages/layout.rs"), "{graph:?}");
}

/// The reader itself: comments, strings and test modules are not imports; groups and `super` resolve.
#[test]
fn the_reader_sees_paths_in_code_only() {
    let code = code_only("use crate::a::{b, c::{d as e}}; // crate::x::y\nlet s = \"crate::z\"; let c = '\"'; fn f<'a>() { super::q::r(); }\n#[cfg(test)]\nmod tests { use crate::t; }\n");
    let code = without_test_items(&code);
    assert!(!code.contains("crate::x") && !code.contains("crate::z") && !code.contains("crate::t"), "{code}");
    assert!(code.contains("super::q::r"), "{code}");
    assert_eq!(expand_use(" crate::a::{b, c::{d as e}}"), vec!["crate::a::b", "crate::a::c::d"]);
    let dir = tempfile::tempdir().unwrap();
    for (f, text) in [("lib.rs", "mod a; mod b;"), ("a.rs", "use crate::b::X; pub struct Y;"), ("b.rs", "pub struct X; fn f() { super::a::Y; }")] {
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    let g = import_graph(dir.path());
    assert_eq!(circles(&g), vec![vec!["a.rs".to_string(), "b.rs".to_string()]], "{g:?}");
}
