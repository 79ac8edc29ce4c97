//! SVG line charts for `loch-bench run --plot`: the latency CDF of each
//! system, and throughput against client threads. Hand-written SVG 1.1
//! (a few hundred bytes of markup per chart; a plotting crate would bring
//! fonts and dozens of dependencies for two charts). Output is a complete,
//! self-contained document whose text is XML-escaped; any finite input
//! gives a well-formed chart, and empty input a chart that says "no data".

use hdrhistogram::Histogram;
use std::fmt::Write as _;

/// One line: a name for the legend and its points.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Where the axis puts values.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    Log10,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_scale: Scale,
    /// Fixed y range, or `None` for 0 to the largest value.
    pub y_range: Option<(f64, f64)>,
    /// Circles on the points (sparse data such as a sweep).
    pub markers: bool,
    pub series: &'a [Series],
}

const W: f64 = 760.0;
const H: f64 = 460.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 58.0;
/// Okabe–Ito: distinguishable with colour-blindness.
const COLORS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

/// Quantiles drawn for a latency CDF: every percent, then the tail.
fn cdf_quantiles() -> Vec<f64> {
    let mut q: Vec<f64> = (0..100).map(|i| i as f64 / 100.0).collect();
    q.extend([0.995, 0.999, 0.9995, 0.9999, 1.0]);
    q
}

/// The CDF of a latency histogram (ns) as points (µs, fraction ≤ it).
pub fn cdf_points(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    cdf_quantiles()
        .into_iter()
        .map(|q| (h.value_at_quantile(q).max(1) as f64 / 1e3, q))
        .collect()
}

/// A latency CDF, one line per named histogram.
pub fn latency_cdf_svg(title: &str, systems: &[(String, &Histogram<u64>)]) -> String {
    let series: Vec<Series> = systems
        .iter()
        .map(|(name, h)| Series {
            name: name.clone(),
            points: cdf_points(h),
        })
        .collect();
    svg(&Chart {
        title,
        x_label: "latency (µs, log scale)",
        y_label: "fraction of operations",
        x_scale: Scale::Log10,
        y_range: Some((0.0, 1.0)),
        markers: false,
        series: &series,
    })
}

/// Throughput (ops/s) against total client threads, one line per system.
pub fn throughput_svg(title: &str, series: &[Series]) -> String {
    let mops: Vec<Series> = series
        .iter()
        .map(|s| Series {
            name: s.name.clone(),
            points: s.points.iter().map(|&(x, y)| (x, y / 1e6)).collect(),
        })
        .collect();
    svg(&Chart {
        title,
        x_label: "client threads in all",
        y_label: "throughput (Mops/s)",
        x_scale: Scale::Linear,
        y_range: None,
        markers: true,
        series: &mops,
    })
}

pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // XML 1.0 forbids most control characters even escaped.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A short label: 1, 2.5, 0.01, 1200, 20k, 1.5M, 2e-5.
fn label(v: f64) -> String {
    let short = |x: f64| {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    match a {
        _ if a < 1e-3 => format!("{v:.0e}"),
        _ if a < 1e4 => short(v),
        _ if a < 1e6 => format!("{}k", short(v / 1e3)),
        _ if a < 1e9 => format!("{}M", short(v / 1e6)),
        _ => format!("{v:.1e}"),
    }
}

/// Which of the ticks at x positions `xs` (increasing) get a label:
/// first the `major` ones (a log axis's decades), each unless it would come
/// within `gap` pixels of one already kept, then the others where they
/// still fit; a tick left unlabelled keeps its grid line. Labels never
/// overlap.
fn labelled(xs: &[f64], widths: &[f64], major: &[bool], gap: f64) -> Vec<bool> {
    let span = |i: usize| (xs[i] - widths[i] / 2.0, xs[i] + widths[i] / 2.0);
    let mut keep = vec![false; xs.len()];
    for pass_major in [true, false] {
        for i in (0..xs.len()).filter(|&i| major[i] == pass_major) {
            let (a, b) = span(i);
            let clear = (0..xs.len()).filter(|&j| keep[j]).all(|j| {
                let (c, d) = span(j);
                b + gap <= c || d + gap <= a
            });
            keep[i] = clear;
        }
    }
    keep
}

/// About how wide a tick label is drawn (12 px sans-serif).
fn label_width(text: &str) -> f64 {
    7.0 * text.chars().count() as f64
}

/// A round step (1, 2 or 5 × 10^k) giving about six ticks over `span`.
fn nice_step(span: f64) -> f64 {
    let raw = span.max(f64::MIN_POSITIVE) / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag)
}

/// Round tick positions over `[lo, hi]`.
fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let step = nice_step(hi - lo);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step).floor() as i64;
    (first..=last.min(first + 20))
        .map(|i| i as f64 * step)
        .collect()
}

/// 1, 2, 5 × 10^k within `[lo, hi]` (both > 0).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut t = Vec::new();
    let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    for k in k0..=k1.min(k0 + 30) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(k);
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                t.push(v);
            }
        }
    }
    t
}

/// Where a chart's values land: its ranges, ticks and plot area.
struct Frame {
    scale: Scale,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
    xt: Vec<f64>,
    yt: Vec<f64>,
    /// The plot area's width and height.
    pw: f64,
    ph: f64,
}

impl Frame {
    /// Ranges that hold every point of `pts`, rounded out to ticks.
    fn new(c: &Chart, pts: &[(f64, f64)]) -> Frame {
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        // x range
        let (mut x0, mut x1) = pts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                (a.min(p.0), b.max(p.0))
            });
        if pts.is_empty() {
            (x0, x1) = (1.0, 10.0);
        }
        let xt = match c.x_scale {
            Scale::Log10 => {
                x0 = 10f64.powf(x0.log10().floor());
                x1 = 10f64.powf(x1.log10().ceil());
                if x1 <= x0 {
                    x1 = x0 * 10.0;
                }
                log_ticks(x0, x1)
            }
            Scale::Linear => {
                x0 = x0.min(0.0);
                if x1 <= x0 {
                    x1 = x0 + 1.0;
                }
                let step = nice_step(x1 - x0);
                x1 = (x1 / step).ceil() * step;
                linear_ticks(x0, x1)
            }
        };
        let (y0, y1) = match c.y_range {
            Some(r) => r,
            None => {
                // 0 to the first round tick at or above the largest value.
                let m = pts.iter().map(|p| p.1).fold(0.0f64, f64::max);
                let top = if m > 0.0 { m * 1.02 } else { 1.0 };
                let step = nice_step(top);
                (0.0, (top / step).ceil() * step)
            }
        };
        Frame {
            scale: c.x_scale,
            x0,
            x1,
            y0,
            y1,
            xt,
            yt: linear_ticks(y0, y1),
            pw,
            ph,
        }
    }

    fn sx(&self, x: f64) -> f64 {
        let (x0, x1) = (self.x0, self.x1);
        let f = match self.scale {
            Scale::Log10 => (x.log10() - x0.log10()) / (x1.log10() - x0.log10()),
            Scale::Linear => (x - x0) / (x1 - x0),
        };
        LEFT + f.clamp(0.0, 1.0) * self.pw
    }

    fn sy(&self, y: f64) -> f64 {
        TOP + self.ph - ((y - self.y0) / (self.y1 - self.y0)).clamp(0.0, 1.0) * self.ph
    }
}

/// The points a chart can place (finite, and positive on a log axis).
fn placeable(c: &Chart, p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite() && (c.x_scale == Scale::Linear || p.0 > 0.0)
}

/// The chart as an SVG document.
pub fn svg(c: &Chart) -> String {
    let pts: Vec<(f64, f64)> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| placeable(c, p))
        .collect();
    let f = Frame::new(c, &pts);
    let mut o = frame_svg(c, &f, pts.is_empty());
    series_svg(&mut o, c, &f);
    o.push_str("</svg>\n");
    o
}

/// The document's head, title, grid, ticks, axes and labels.
fn frame_svg(c: &Chart, f: &Frame, empty: bool) -> String {
    let (pw, ph) = (f.pw, f.ph);
    let (xt, yt) = (&f.xt, &f.yt);
    let sx = |x: f64| f.sx(x);
    let sy = |y: f64| f.sy(y);
    let mut o = String::with_capacity(8 << 10);
    let _ = writeln!(o, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, "<title>{}</title>", escape(c.title));
    let _ = writeln!(
        o,
        r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#
    );
    let _ = writeln!(
        o,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + pw / 2.0,
        escape(c.title)
    );
    // Grid and ticks; crowded x labels thinned.
    let texts: Vec<String> = xt.iter().map(|&t| label(t)).collect();
    let xs: Vec<f64> = xt.iter().map(|&t| sx(t)).collect();
    let widths: Vec<f64> = texts.iter().map(|t| label_width(t)).collect();
    let major: Vec<bool> = xt
        .iter()
        .map(|&t| f.scale != Scale::Log10 || t.log10().fract().abs() < 1e-9)
        .collect();
    let keep = labelled(&xs, &widths, &major, 6.0);
    for ((&x, text), keep) in xs.iter().zip(&texts).zip(keep) {
        let _ = writeln!(
            o,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + ph,
        );
        if keep {
            let _ = writeln!(
                o,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{text}</text>"##,
                TOP + ph + 16.0,
            );
        }
    }
    for &t in yt {
        let y = sy(t);
        let _ = writeln!(
            o,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            label(t)
        );
    }
    let _ = writeln!(
        o,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 16.0,
        escape(c.x_label)
    );
    let _ = writeln!(
        o,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(c.y_label)
    );
    if empty {
        let _ = writeln!(
            o,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#888">no data</text>"##,
            LEFT + pw / 2.0,
            TOP + ph / 2.0
        );
    }
    o
}

/// Each series' line (and markers) and its legend entry.
fn series_svg(o: &mut String, c: &Chart, f: &Frame) {
    let sx = |x: f64| f.sx(x);
    let sy = |y: f64| f.sy(y);
    // Lines and legend.
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line: Vec<String> = s
            .points
            .iter()
            .filter(|p| placeable(c, p))
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            line.join(" "),
            escape(&s.name)
        );
        if c.markers {
            for p in &line {
                let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(o, r#"<circle cx="{x}" cy="{y}" r="3.5" fill="{color}"/>"#);
            }
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = W - RIGHT + 16.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tags balance, attribute values are quoted, and text has no raw `<`
    /// or stray `&`: enough of XML to catch what a hand writer gets wrong.
    pub(crate) fn well_formed(doc: &str) -> Result<usize, String> {
        let body = doc
            .strip_prefix(r#"<?xml version="1.0" encoding="UTF-8"?>"#)
            .ok_or("no XML declaration")?;
        let mut stack: Vec<String> = Vec::new();
        let mut rest = body;
        let mut elements = 0;
        while let Some(open) = rest.find('<') {
            check_text(&rest[..open])?;
            let close = rest[open..].find('>').ok_or("unclosed tag")? + open;
            let tag = &rest[open + 1..close];
            rest = &rest[close + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let top = stack.pop().ok_or("close without open")?;
                if top != name {
                    return Err(format!("</{name}> closes <{top}>"));
                }
                if stack.is_empty() && !rest.trim().is_empty() {
                    return Err("content after the root".into());
                }
                continue;
            }
            elements += 1;
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name = tag.split_whitespace().next().ok_or("empty tag")?;
            if stack.is_empty() && (name != "svg" || elements != 1) {
                return Err(format!("root is <{name}>"));
            }
            if tag.matches('"').count() % 2 != 0 || tag[name.len()..].contains('<') {
                return Err(format!("bad attributes in <{tag}>"));
            }
            if !self_closing {
                stack.push(name.to_string());
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed {stack:?}"));
        }
        Ok(elements)
    }

    fn check_text(t: &str) -> Result<(), String> {
        for (i, _) in t.match_indices('&') {
            let ent = &t[i..];
            if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                .iter()
                .any(|e| ent.starts_with(e))
            {
                return Err(format!("stray & in {t:?}"));
            }
        }
        Ok(())
    }

    #[test]
    fn charts_are_well_formed_and_escape_names() {
        let mut h = cluster::stats::latency_histogram();
        for v in [1500u64, 2000, 2100, 9000, 150_000] {
            h.record(v).unwrap();
        }
        let empty = cluster::stats::latency_histogram();
        let doc = latency_cdf_svg(
            "a <b> & \"c\"",
            &[("fg+comb".into(), &h), ("x<y&z".into(), &empty)],
        );
        let n = well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert!(n > 10);
        assert_eq!(doc.matches("<polyline").count(), 2);
        assert!(doc.contains("x&lt;y&amp;z"));
        // 1.5 µs .. 150 µs on a log axis: decades 1 .. 1000 µs.
        assert!(doc.contains(">1000</text>") && doc.contains(">1</text>"));
        let t = throughput_svg(
            "sweep",
            &[Series {
                name: "sherman".into(),
                points: vec![(4.0, 1e6), (8.0, 1.9e6), (16.0, 3.5e6)],
            }],
        );
        well_formed(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        assert_eq!(t.matches("<circle").count(), 3);
        let none = throughput_svg("nothing", &[]);
        well_formed(&none).unwrap();
        assert!(none.contains("no data"));
        assert!(well_formed("<?xml version=\"1.0\" encoding=\"UTF-8\"?><svg><g></svg>").is_err());
        assert!(well_formed("<?xml version=\"1.0\" encoding=\"UTF-8\"?><svg>a & b</svg>").is_err());
    }

    #[test]
    fn crowded_tick_labels_are_thinned_and_never_overlap() {
        // Six decades of 1-2-5 ticks on a 488 px axis: the paper's
        // latency-cdf-t22.svg, whose labels used to run into each other.
        let ticks = log_ticks(1.0, 1e6);
        let xs: Vec<f64> = ticks
            .iter()
            .map(|t| 72.0 + 488.0 * t.log10() / 6.0)
            .collect();
        let widths: Vec<f64> = ticks.iter().map(|&t| label_width(&label(t))).collect();
        let major: Vec<bool> = ticks.iter().map(|t| t.log10().fract() == 0.0).collect();
        let keep = labelled(&xs, &widths, &major, 6.0);
        let mut shown: Vec<(f64, f64)> = xs
            .iter()
            .zip(&widths)
            .zip(&keep)
            .filter(|(_, &k)| k)
            .map(|((&x, &w), _)| (x - w / 2.0, x + w / 2.0))
            .collect();
        shown.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert!(
            shown.windows(2).all(|p| p[1].0 >= p[0].1 + 6.0),
            "{shown:?}"
        );
        // Every decade keeps its label.
        for (t, k) in ticks.iter().zip(&keep) {
            if t.log10().fract() == 0.0 {
                assert!(k, "decade {t} lost its label");
            }
        }
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(linear_ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(
            log_ticks(1.0, 100.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(label(2.5), "2.5");
        assert_eq!(label(1000.0), "1000");
        assert_eq!(label(0.001), "0.001");
        assert_eq!(label(20_000.0), "20k");
        assert_eq!(label(500_000.0), "500k");
        assert_eq!(label(1_500_000.0), "1.5M");
        assert_eq!(label(0.00002), "2e-5");
    }
}
