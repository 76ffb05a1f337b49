//! `tessera explain` and `tessera baselines` end to end, through the binary: small fixture models only.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use tessera::job::load_graph;
use tessera::explain::parse_fixture_spec;

fn tessera(store: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).arg("--store").arg(store).output().expect("tessera runs");
    assert!(out.status.success(), "tessera {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Checks that `s` is one well-formed XML element tree: every tag closed in order, attributes quoted, no
/// stray `<` or `&` in text. Returns the element names in document order.
fn xml_elements(s: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut rest = s.trim_start();
    if let Some(r) = rest.strip_prefix("<?xml") {
        rest = &r[r.find("?>").expect("closed XML declaration") + 2..];
    }
    let mut roots = 0;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        assert!(!stack.is_empty() || text.trim().is_empty(), "text outside the root: {text:?}");
        for (i, _) in text.match_indices('&') {
            let ent = &text[i..text[i..].find(';').map_or(text.len(), |e| i + e + 1)];
            assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&ent), "bad entity {ent:?}");
        }
        let gt = rest[lt..].find('>').expect("tag closes") + lt;
        let tag = &rest[lt + 1..gt];
        assert!(tag.matches('"').count() & 1 == 0 && !tag.contains('<'), "malformed tag <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "mismatched </{name}>");
        } else {
            let name: String = tag.chars().take_while(|c| !c.is_whitespace() && *c != '/').collect();
            assert!(!name.is_empty(), "empty tag");
            if stack.is_empty() {
                roots += 1;
            }
            names.push(name.clone());
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &rest[gt + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    assert_eq!(roots, 1, "one root element");
    names
}

#[test]
fn xml_check_rejects_malformed_documents() {
    assert_eq!(xml_elements("<?xml version=\"1.0\"?>\n<a><b x=\"1\"/><c>t &amp; u</c></a>\n"), ["a", "b", "c"]);
    for bad in ["<a><b></a></b>", "<a>", "<a/><b/>", "<a>x & y</a>", "<a x=\"1></a>"] {
        assert!(std::panic::catch_unwind(|| xml_elements(bad)).is_err(), "{bad} passed");
    }
}

#[test]
fn explain_json_covers_every_node_once_and_svg_is_deterministic() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let spec = "fixture:bert-tiny:s16";
    let g = load_graph(&parse_fixture_spec(spec).unwrap()).unwrap();
    let svg1 = d.path().join("a.svg");
    let json: serde_json::Value =
        serde_json::from_str(&tessera(&store, &["explain", spec, "--costs", "analytical", "--target", "cpu -compiler=gemm", "--json", "--svg", svg1.to_str().unwrap()])).unwrap();

    assert_eq!(json["model"], "bert-tiny-b1-s16");
    let targets: Vec<&str> = json["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(targets.len() == 2 && targets.iter().any(|t| t.contains("compiler=gemm")) && targets.iter().any(|t| t.contains("compiler=c")), "{targets:?}");
    assert!(["analytical", "measured"].contains(&json["cost_source"].as_str().unwrap()));
    let parts = json["partitions"].as_array().unwrap();
    let mut seen = vec![0usize; g.nodes.len()];
    let mut backends = BTreeSet::new();
    let mut sum = 0.0;
    for p in parts {
        let b = p["backend"].as_str().unwrap();
        assert!(["c", "gemm"].contains(&b), "{b}");
        assert!(p["target"].as_str().unwrap().contains(&format!("compiler={b}")));
        backends.insert(b.to_string());
        let cost = p["cost_us"].as_f64().unwrap();
        assert!(cost.is_finite() && cost >= 0.0);
        sum += cost;
        assert!(p["cost_source"].is_string());
        assert!(p.get("alternative").is_some(), "alternative is always present (null when none)");
        for n in p["nodes"].as_array().unwrap() {
            let i = n["index"].as_u64().unwrap() as usize;
            seen[i] += 1;
            assert_eq!(n["name"], g.nodes[i].name.as_str());
            assert_eq!(n["op"], g.nodes[i].op.name());
        }
    }
    assert!(seen.iter().all(|&c| c == 1), "node coverage counts {seen:?}");
    // The mix really is a mix for BERT: matmuls on gemm, softmax and layer norm on c.
    assert_eq!(backends.into_iter().collect::<Vec<_>>(), ["c", "gemm"]);
    assert_eq!(json["total"]["nodes"], g.nodes.len());
    assert!((json["total"]["cost_us"].as_f64().unwrap() - sum).abs() < 1e-6 * sum.max(1.0));
    let by_backend = json["by_backend"].as_object().unwrap();
    assert_eq!(by_backend.values().map(|t| t["partitions"].as_u64().unwrap()).sum::<u64>(), parts.len() as u64);

    // SVG: well-formed, one box per node, one legend row per backend.
    let svg = std::fs::read_to_string(&svg1).unwrap();
    let elements = xml_elements(&svg);
    assert_eq!(elements[0], "svg");
    for i in 0..g.nodes.len() {
        assert_eq!(svg.matches(&format!("class=\"node\" id=\"n{i}\"")).count(), 1, "node {i}");
    }
    assert_eq!(svg.matches("class=\"partition\"").count(), parts.len());
    assert!(svg.contains("gemm: ") && svg.contains("c: "), "legend");

    // Same bytes again: from the warm store, and from a fresh one (analytical costs: measured ones would differ
    // between stores); the text report agrees with the JSON.
    let svg2 = d.path().join("b.svg");
    let text = tessera(&store, &["explain", spec, "--costs", "analytical", "--target", "cpu -compiler=gemm", "--svg", svg2.to_str().unwrap()]);
    assert_eq!(std::fs::read(&svg2).unwrap(), svg.as_bytes());
    let svg3 = d.path().join("c.svg");
    tessera(&d.path().join("fresh"), &["explain", spec, "--costs", "analytical", "--target", "cpu -compiler=gemm", "--json", "--svg", svg3.to_str().unwrap()]);
    assert_eq!(std::fs::read(&svg3).unwrap(), svg.as_bytes());
    assert!(text.starts_with(&format!("model bert-tiny-b1-s16: {} nodes in {} partitions", g.nodes.len(), parts.len())), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with('[')).count(), parts.len());
    assert!(text.lines().any(|l| l.starts_with("total ")), "{text}");
}

#[test]
fn explain_names_bad_models() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["explain", "fixture:resnet18:i8", "--store"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resnet18") && err.contains("image size"), "{err}");
}

#[test]
fn baselines_give_one_row_per_model_with_finite_ratios() {
    let d = tempfile::tempdir().unwrap();
    let json: serde_json::Value = serde_json::from_str(&tessera(
        &d.path().join("store"),
        &["baselines", "fixture:mlp3", "fixture:resnet18:i32", "--target", "cpu -compiler=gemm", "--iters", "3", "--warmup", "1", "--json"],
    ))
    .unwrap();
    let labels: Vec<&str> = json["configs"].as_array().unwrap().iter().map(|c| c["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["mix", "gemm", "c"]);
    assert!(!json["machine"]["cpu"].as_str().unwrap().is_empty());
    let models = json["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["model"].as_str().unwrap()).collect();
    assert_eq!(names, ["mlp3-b1", "resnet18-b1-i32"]);
    for m in models {
        let configs = m["configs"].as_array().unwrap();
        assert_eq!(configs.len(), 3);
        for c in configs {
            let ms = c["median_ms"].as_f64().unwrap();
            assert!(ms.is_finite() && ms > 0.0, "{c}");
        }
        // The c-only build runs everything on c.
        assert_eq!(configs[2]["partitions_by_backend"].as_object().unwrap().keys().collect::<Vec<_>>(), ["c"]);
        let ratio = m["ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{m}");
        let best = m["best_single_ms"].as_f64().unwrap();
        assert!(configs[1..].iter().all(|c| c["median_ms"].as_f64().unwrap() >= best));
        assert!((ratio - best / m["mix_ms"].as_f64().unwrap()).abs() < 1e-9);
    }
}

/// `-layout=auto` (the GPU targets' default) plans a convolutional model both ways and says which it kept and
/// why; with analytical costs, by the plans' estimates, the lower kept. A 16-bit build with cudnn of a model
/// without depthwise convolutions is planned channels-last alone, by rule; a model without convolutions is
/// planned once and shows no layout block. No GPU needed: nothing is timed.
#[test]
fn layout_auto_plans_both_layouts_and_shows_the_choice() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("store");
    let explain = |spec: &str, targets: &[&str], json: bool| {
        let mut args = vec!["explain", spec, "--costs", "analytical"];
        for t in targets {
            args.extend(["--target", t]);
        }
        if json {
            args.push("--json");
        }
        tessera(&store, &args)
    };
    let own = ["cuda -precision=fp16"];
    let with_cudnn = ["cuda -precision=fp16", "cuda -compiler=cudnn -precision=fp16"];
    // Our own kernels alone: both layouts planned.
    let json: serde_json::Value = serde_json::from_str(&explain("fixture:resnet18:b8", &own, true)).unwrap();
    let layout = &json["layout"];
    assert_eq!(layout["by"], "estimates", "{layout}");
    let trials = layout["trials"].as_array().unwrap();
    let names: Vec<&str> = trials.iter().map(|t| t["layout"].as_str().unwrap()).collect();
    assert_eq!(names, ["nchw", "nhwc"]);
    let est: Vec<f64> = trials.iter().map(|t| t["estimated_us"].as_f64().unwrap()).collect();
    let lower = if est[1] < est[0] { "nhwc" } else { "nchw" };
    assert_eq!(layout["chosen"], lower, "{layout}");
    // The plan shown is the chosen layout's: channels-last ops exactly when nhwc was kept.
    let ops = |json: &serde_json::Value| -> Vec<String> {
        json["partitions"].as_array().unwrap().iter().flat_map(|p| p["nodes"].as_array().unwrap().iter().map(|n| n["op"].as_str().unwrap().to_string())).collect()
    };
    assert_eq!(ops(&json).iter().any(|o| o == "NhwcConv"), lower == "nhwc");
    let text = explain("fixture:resnet18:b8", &own, false);
    assert!(text.contains("layout (-layout=auto, by estimates)"), "{text}");

    // With cudnn in fp16 and no depthwise convolution: channels-last alone, by rule.
    let json: serde_json::Value = serde_json::from_str(&explain("fixture:resnet18:b8", &with_cudnn, true)).unwrap();
    let layout = &json["layout"];
    assert_eq!((layout["chosen"].as_str(), layout["trials"].as_array().unwrap().len()), (Some("nhwc"), 1), "{layout}");
    assert!(layout["by"].as_str().unwrap().starts_with("rule:"), "{layout}");
    assert!(ops(&json).iter().any(|o| o == "NhwcConv"));
    // A depthwise model (MobileNetV2) is planned both ways even so.
    let json: serde_json::Value = serde_json::from_str(&explain("fixture:mobilenetv2:b1", &with_cudnn, true)).unwrap();
    assert_eq!(json["layout"]["trials"].as_array().unwrap().len(), 2, "{}", json["layout"]);

    let json: serde_json::Value = serde_json::from_str(&explain("fixture:mlp3:b1", &with_cudnn, true)).unwrap();
    assert!(json["layout"].is_null(), "{}", json["layout"]);
}
