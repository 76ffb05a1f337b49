//! The SVG picture of a partitioned graph: nodes as boxes colored by backend, in layers.
//!
//! Layout: a node's layer is its longest-path depth from the graph inputs, so every edge points down. Within
//! a layer nodes start in graph order and are then sorted once by the mean position of their producers
//! (the barycenter heuristic, ties by node index), which keeps chains roughly vertical and untangles most
//! crossings at the cost of one sort per layer. Boxes have a fixed size and the canvas grows with the
//! widest layer and the depth, so ResNet-50 and BERT-base stay readable (zoom and scroll, not shrink).
//! Every coordinate is an integer and every iteration is over vectors, so equal inputs give equal bytes.

use super::Explanation;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use tessera_stages::backend::Backend;
use tessera_stages::ir::Graph;

const BOX_W: i64 = 128;
const BOX_H: i64 = 30;
const GAP_X: i64 = 16;
const GAP_Y: i64 = 40;
const MARGIN: i64 = 20;
const LEGEND_ROW: i64 = 20;
/// Op labels longer than this are cut (the full text is in the box's tooltip).
const LABEL_CHARS: usize = 18;

/// Fill and stroke of a backend: its own ([`Backend::colors`]), so a backend keeps its colours across models;
/// a backend not among `backends` takes the palette in name order.
fn colors(backends: &[Box<dyn Backend>], backend: &str, rank: usize) -> (&'static str, &'static str) {
    match backends.iter().find(|b| b.name() == backend) {
        Some(b) => b.colors(),
        None => {
            const PALETTE: [(&str, &str); 4] = [("#f6e8c3", "#8c510a"), ("#c7eae5", "#01665e"), ("#fde0ef", "#c51b7d"), ("#e6f5d0", "#4d9221")];
            PALETTE[rank % PALETTE.len()]
        }
    }
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 text.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// Layers of the graph's nodes (longest-path depth), each in drawing order.
pub fn layers(g: &Graph) -> Vec<Vec<usize>> {
    let mut depth = vec![0usize; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        // Nodes are topologically ordered, so producers already have their depth.
        depth[i] = n.inputs.iter().filter_map(|&v| g.producer(v)).map(|p| depth[p.index()] + 1).max().unwrap_or(0);
    }
    let mut layers: Vec<Vec<usize>> = vec![Vec::new(); depth.iter().max().map_or(0, |d| d + 1)];
    for (i, &d) in depth.iter().enumerate() {
        layers[d].push(i);
    }
    // Barycenter ordering, top to bottom: a node's key is the mean centered slot of its producers.
    let mut slot = vec![0f64; g.nodes.len()];
    for (l, layer) in layers.iter_mut().enumerate() {
        if l > 0 {
            let mut keyed: Vec<(f64, usize)> = layer
                .iter()
                .map(|&i| {
                    let ps: Vec<f64> = g.nodes[i].inputs.iter().filter_map(|&v| g.producer(v)).map(|p| slot[p.index()]).collect();
                    let key = if ps.is_empty() { 0.0 } else { ps.iter().sum::<f64>() / ps.len() as f64 };
                    (key, i)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            *layer = keyed.into_iter().map(|(_, i)| i).collect();
        }
        let mid = (layer.len() as f64 - 1.0) / 2.0;
        for (k, &i) in layer.iter().enumerate() {
            slot[i] = k as f64 - mid;
        }
    }
    layers
}

/// Renders the explanation's partitioning over `g` (the graph its node indices refer to), each backend in
/// the colours `backends` give it.
pub fn render(g: &Graph, ex: &Explanation, backends: &[Box<dyn Backend>]) -> String {
    let n = g.nodes.len();
    // Which partition and backend each node belongs to (a node outside every partition is drawn grey; a
    // well-formed plan has none).
    let mut part_of: Vec<Option<usize>> = vec![None; n];
    for p in &ex.partitions {
        for r in &p.nodes {
            if let Some(s) = part_of.get_mut(r.index as usize) {
                *s = Some(p.index);
            }
        }
    }
    let registered = backends;
    let backends: Vec<&String> = ex.by_backend.keys().collect();
    let rank = |b: &str| backends.iter().position(|x| x.as_str() == b).unwrap_or(0);

    let layers = layers(g);
    let widest = layers.iter().map(|l| l.len() as i64).max().unwrap_or(0);
    let legend_h = LEGEND_ROW * (backends.len() as i64 + 2) + 10;
    let legend_w = 560;
    let width = (2 * MARGIN + widest * (BOX_W + GAP_X) - GAP_X).max(2 * MARGIN + legend_w);
    let top = MARGIN + legend_h;
    let height = top + layers.len() as i64 * (BOX_H + GAP_Y) - GAP_Y + MARGIN;
    let mut pos = vec![(0i64, 0i64); n];
    for (l, layer) in layers.iter().enumerate() {
        let row_w = layer.len() as i64 * (BOX_W + GAP_X) - GAP_X;
        let x0 = (width - row_w) / 2;
        for (k, &i) in layer.iter().enumerate() {
            pos[i] = (x0 + k as i64 * (BOX_W + GAP_X), top + l as i64 * (BOX_H + GAP_Y));
        }
    }

    let mut s = String::new();
    let _ = writeln!(s, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, "<title>{}</title>", esc(&format!("{}: partitioning", ex.model)));
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>"##);

    // Legend: model, then one row per backend with its share.
    let _ = writeln!(s, r#"<g class="legend">"#);
    let _ = writeln!(
        s,
        r#"<text x="{MARGIN}" y="{}" font-size="13" font-weight="bold">{}</text>"#,
        MARGIN + 12,
        esc(&format!("{}: {} nodes, {} partitions, {:.1} us ({})", ex.model, ex.total.nodes, ex.total.partitions, ex.total.cost_us, ex.cost_source))
    );
    for (k, b) in backends.iter().enumerate() {
        let (fill, stroke) = colors(registered, b, k);
        let t = &ex.by_backend[b.as_str()];
        let y = MARGIN + LEGEND_ROW * (k as i64 + 1);
        let _ = writeln!(s, r#"<rect x="{MARGIN}" y="{}" width="14" height="14" fill="{fill}" stroke="{stroke}"/>"#, y + 4);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            MARGIN + 20,
            y + 15,
            esc(&format!("{b}: {} partitions, {} nodes, {:.1} us", t.partitions, t.nodes, t.cost_us))
        );
    }
    let y = MARGIN + LEGEND_ROW * (backends.len() as i64 + 1);
    let _ = writeln!(
        s,
        r##"<line x1="{MARGIN}" y1="{}" x2="{}" y2="{}" stroke="#555555" stroke-dasharray="4 3"/><text x="{}" y="{}">edge between partitions (pN: partition N, in execution order)</text>"##,
        y + 11,
        MARGIN + 14,
        y + 11,
        MARGIN + 20,
        y + 15
    );
    let _ = writeln!(s, "</g>");

    // Edges first, so boxes sit on top of them.
    let _ = writeln!(s, r#"<g class="edges" fill="none">"#);
    for (i, node) in g.nodes.iter().enumerate() {
        let mut producers: Vec<usize> = node.inputs.iter().filter_map(|&v| g.producer(v)).map(|p| p.index()).collect();
        producers.sort_unstable();
        producers.dedup();
        for p in producers {
            let crossing = part_of[p] != part_of[i];
            let style = if crossing { r##"stroke="#555555" stroke-dasharray="4 3""## } else { r##"stroke="#aaaaaa""## };
            let span = (pos[i].1 - pos[p].1) / (BOX_H + GAP_Y);
            if span <= 1 {
                // Adjacent layers: bottom center to top center.
                let (x1, y1) = (pos[p].0 + BOX_W / 2, pos[p].1 + BOX_H);
                let (x2, y2) = (pos[i].0 + BOX_W / 2, pos[i].1);
                let dy = (y2 - y1) / 2;
                let _ = writeln!(s, r#"<path d="M{x1} {y1} C{x1} {} {x2} {} {x2} {y2}" {style}/>"#, y1 + dy, y2 - dy);
            } else {
                // A long edge (a residual connection) would hide behind the boxes between its ends: it leaves
                // and enters at the right side and bulges into the gap, further for longer spans.
                let (x1, y1) = (pos[p].0 + BOX_W, pos[p].1 + BOX_H / 2);
                let (x2, y2) = (pos[i].0 + BOX_W, pos[i].1 + BOX_H / 2);
                let cx = x1.max(x2) + 24 + 6 * span.min(8);
                let _ = writeln!(s, r#"<path d="M{x1} {y1} C{cx} {y1} {cx} {y2} {x2} {y2}" {style}/>"#);
            }
        }
    }
    let _ = writeln!(s, "</g>");

    // Nodes, grouped by partition in execution order (a partition is one <g>, outlined in its backend's color).
    let mut groups: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
    for (i, p) in part_of.iter().enumerate() {
        groups.entry(*p).or_default().push(i);
    }
    for (p, nodes) in &groups {
        let (label, backend) = match p {
            Some(p) => (format!("p{p}"), ex.partitions[*p].backend.as_str()),
            None => ("unassigned".to_string(), ""),
        };
        let (fill, stroke) = if backend.is_empty() { ("#eeeeee", "#999999") } else { colors(registered, backend, rank(backend)) };
        match p {
            Some(pi) => {
                let pr = &ex.partitions[*pi];
                let _ = writeln!(
                    s,
                    r#"<g class="partition" id="{label}" data-backend="{}"><title>{}</title>"#,
                    esc(backend),
                    esc(&format!("partition {pi}: {} ({}), {} nodes, {:.1} us ({})", backend, pr.target, pr.nodes.len(), pr.cost_us, pr.cost_source))
                );
            }
            None => {
                let _ = writeln!(s, r#"<g class="partition" id="unassigned">"#);
            }
        }
        for &i in nodes {
            let (x, y) = pos[i];
            let node = &g.nodes[i];
            let op = node.op.name();
            let _ = writeln!(
                s,
                r#"<g class="node" id="n{i}"><title>{}</title><rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="4" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/><text x="{}" y="{}" text-anchor="middle">{}</text><text x="{}" y="{}" font-size="8" text-anchor="end" fill="{stroke}">{label}</text></g>"#,
                esc(&format!("#{i} {} ({op}) in {label}", node.name)),
                x + BOX_W / 2,
                y + 19,
                esc(&cut(op, LABEL_CHARS)),
                x + BOX_W - 3,
                y + 9,
            );
        }
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_stages::ir::{Op, TensorType, UnaryOp};

    /// x -> a -> b -> d, x -> c -> d: a diamond with one long side.
    fn diamond() -> Graph {
        let mut g = Graph::new("diamond");
        let x = g.add_input("x", TensorType::f32([4]));
        let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a]).unwrap();
        let c = g.add("c", Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        let d = g.add("d", Op::Binary(tessera_stages::ir::BinaryOp::Add), &[b, c]).unwrap();
        g.outputs.push(d);
        g
    }

    #[test]
    fn layers_are_longest_path_depths() {
        let g = diamond();
        let l = layers(&g);
        assert_eq!(l, vec![vec![0, 2], vec![1], vec![3]]);
        // Every edge goes strictly down.
        let depth_of = |i: usize| l.iter().position(|layer| layer.contains(&i)).unwrap();
        for (i, n) in g.nodes.iter().enumerate() {
            for p in n.inputs.iter().filter_map(|&v| g.producer(v)) {
                assert!(depth_of(p.index()) < depth_of(i));
            }
        }
    }

    #[test]
    fn escapes_and_cuts_text() {
        assert_eq!(esc("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(cut("LayerNormalization", 10), "LayerNorm…");
        assert_eq!(cut("Add", 10), "Add");
    }
}
