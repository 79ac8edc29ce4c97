//! Line charts for `loch-bench run --plot`: the latency CDF of each
//! system, and throughput against client threads, as SVG and PNG. One
//! layout (frame, ticks, thinned labels, legend) is drawn through a small
//! `Canvas` for both: SVG 1.1 written here (a few hundred bytes of markup;
//! exact, text selectable, no font needed), PNG by plotters' bitmap backend
//! with a TrueType font found on the machine. The SVG is a complete,
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
const COLORS: [Rgb; 8] = [
    Rgb(0x00, 0x72, 0xB2),
    Rgb(0xD5, 0x5E, 0x00),
    Rgb(0x00, 0x9E, 0x73),
    Rgb(0xCC, 0x79, 0xA7),
    Rgb(0xE6, 0x9F, 0x00),
    Rgb(0x56, 0xB4, 0xE9),
    Rgb(0x00, 0x00, 0x00),
    Rgb(0xF0, 0xE4, 0x42),
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

/// A chart in both formats: the SVG always, the PNG where a font was found.
pub struct Drawn {
    pub svg: String,
    pub png: Result<Vec<u8>, PngError>,
}

fn both(c: &Chart) -> Drawn {
    Drawn {
        svg: svg(c),
        png: png(c),
    }
}

/// A latency CDF, one line per named histogram.
pub fn latency_cdf(title: &str, systems: &[(String, &Histogram<u64>)]) -> Drawn {
    let series: Vec<Series> = systems
        .iter()
        .map(|(name, h)| Series {
            name: name.clone(),
            points: cdf_points(h),
        })
        .collect();
    both(&Chart {
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
pub fn throughput(title: &str, series: &[Series]) -> Drawn {
    let mops: Vec<Series> = series
        .iter()
        .map(|s| Series {
            name: s.name.clone(),
            points: s.points.iter().map(|&(x, y)| (x, y / 1e6)).collect(),
        })
        .collect();
    both(&Chart {
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

/// An sRGB colour.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct Rgb(u8, u8, u8);

const BLACK: Rgb = Rgb(0, 0, 0);
const WHITE: Rgb = Rgb(255, 255, 255);
const GRID: Rgb = Rgb(0xdd, 0xdd, 0xdd);
const MUTED: Rgb = Rgb(0x88, 0x88, 0x88);

/// Where a text's x coordinate is: its start, middle or end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Anchor {
    Start,
    Middle,
    End,
}

/// How a text is set: 12 px black unless changed; `vertical` text reads
/// bottom to top.
#[derive(Copy, Clone, Debug)]
struct Font {
    size: f64,
    anchor: Anchor,
    vertical: bool,
    color: Rgb,
}

impl Font {
    const fn at(anchor: Anchor) -> Font {
        Font {
            size: 12.0,
            anchor,
            vertical: false,
            color: BLACK,
        }
    }
}

/// The few shapes a chart is drawn with, in chart pixels (y down). The SVG
/// and PNG writers implement them; the chart's layout is drawn once,
/// through this, for both.
trait Canvas {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Option<Rgb>, stroke: Option<Rgb>);
    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: Rgb, width: f64);
    /// `at.1` is the text's baseline.
    fn text(&mut self, at: (f64, f64), text: &str, font: Font);
    /// A series' line; `name` labels it where the format can (a tooltip).
    fn polyline(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64, name: &str);
    fn dot(&mut self, x: f64, y: f64, r: f64, color: Rgb);
}

/// The points a chart places, and its frame.
fn layout(c: &Chart) -> (Frame, bool) {
    let pts: Vec<(f64, f64)> = c
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|p| placeable(c, p))
        .collect();
    (Frame::new(c, &pts), pts.is_empty())
}

/// The chart as an SVG document.
pub fn svg(c: &Chart) -> String {
    let (f, empty) = layout(c);
    let mut o = Svg(String::with_capacity(8 << 10));
    let _ = writeln!(o.0, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        o.0,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o.0, "<title>{}</title>", escape(c.title));
    draw(&mut o, c, &f, empty);
    o.0.push_str("</svg>\n");
    o.0
}

/// Title, grid, ticks, axes, labels, then each series' line (and markers)
/// and its legend entry.
fn draw(o: &mut dyn Canvas, c: &Chart, f: &Frame, empty: bool) {
    let (pw, ph) = (f.pw, f.ph);
    o.rect(0.0, 0.0, W, H, Some(WHITE), None);
    o.text(
        (LEFT + pw / 2.0, 24.0),
        c.title,
        Font {
            size: 15.0,
            ..Font::at(Anchor::Middle)
        },
    );
    // Grid and ticks; crowded x labels thinned.
    let texts: Vec<String> = f.xt.iter().map(|&t| label(t)).collect();
    let xs: Vec<f64> = f.xt.iter().map(|&t| f.sx(t)).collect();
    let widths: Vec<f64> = texts.iter().map(|t| label_width(t)).collect();
    let major: Vec<bool> =
        f.xt.iter()
            .map(|&t| f.scale != Scale::Log10 || t.log10().fract().abs() < 1e-9)
            .collect();
    let keep = labelled(&xs, &widths, &major, 6.0);
    for ((&x, text), keep) in xs.iter().zip(&texts).zip(keep) {
        o.line((x, TOP), (x, TOP + ph), GRID, 1.0);
        if keep {
            o.text((x, TOP + ph + 16.0), text, Font::at(Anchor::Middle));
        }
    }
    for &t in &f.yt {
        let y = f.sy(t);
        o.line((LEFT, y), (LEFT + pw, y), GRID, 1.0);
        o.text((LEFT - 6.0, y + 4.0), &label(t), Font::at(Anchor::End));
    }
    o.rect(LEFT, TOP, pw, ph, None, Some(BLACK));
    o.text(
        (LEFT + pw / 2.0, H - 16.0),
        c.x_label,
        Font::at(Anchor::Middle),
    );
    o.text(
        (18.0, TOP + ph / 2.0),
        c.y_label,
        Font {
            vertical: true,
            ..Font::at(Anchor::Middle)
        },
    );
    if empty {
        o.text(
            (LEFT + pw / 2.0, TOP + ph / 2.0),
            "no data",
            Font {
                color: MUTED,
                ..Font::at(Anchor::Middle)
            },
        );
    }
    for (i, s) in c.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter(|p| placeable(c, p))
            .map(|&(x, y)| (f.sx(x), f.sy(y)))
            .collect();
        o.polyline(&line, color, 2.0, &s.name);
        if c.markers {
            for &(x, y) in &line {
                o.dot(x, y, 3.5, color);
            }
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx = W - RIGHT + 16.0;
        o.line((lx, ly), (lx + 24.0, ly), color, 3.0);
        o.text((lx + 30.0, ly + 4.0), &s.name, Font::at(Anchor::Start));
    }
}

/// SVG 1.1 markup, one element a line.
struct Svg(String);

impl std::fmt::Display for Rgb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

impl Canvas for Svg {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Option<Rgb>, stroke: Option<Rgb>) {
        let fill = fill.map_or("none".to_string(), |c| c.to_string());
        let stroke = stroke.map_or(String::new(), |c| format!(r#" stroke="{c}""#));
        let _ = writeln!(
            self.0,
            r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"{stroke}/>"#
        );
    }

    fn line(&mut self, a: (f64, f64), b: (f64, f64), color: Rgb, width: f64) {
        let _ = writeln!(
            self.0,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="{width}"/>"#,
            a.0, a.1, b.0, b.1
        );
    }

    fn text(&mut self, (x, y): (f64, f64), text: &str, font: Font) {
        let Font {
            size,
            anchor,
            vertical,
            color,
        } = font;
        let anchor = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        let turn = if vertical {
            format!(r#" transform="rotate(-90 {x:.1} {y:.1})""#)
        } else {
            String::new()
        };
        let _ = writeln!(
            self.0,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" font-size="{size}" fill="{color}"{turn}>{}</text>"#,
            escape(text)
        );
    }

    fn polyline(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64, name: &str) {
        let pts: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            self.0,
            r#"<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{}"><title>{}</title></polyline>"#,
            pts.join(" "),
            escape(name)
        );
    }

    fn dot(&mut self, x: f64, y: f64, r: f64, color: Rgb) {
        let _ = writeln!(
            self.0,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{color}"/>"#
        );
    }
}

/// Why a PNG could not be drawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PngError(pub String);

/// The font family PNG text is drawn in, once registered.
const PNG_FAMILY: &str = "loch-sans";

/// Where PNG text comes from: `LOCH_PLOT_FONT` if set, else the first of
/// the usual places of a sans-serif TrueType font (Debian and Ubuntu's
/// fonts-dejavu-core, Fedora's, Liberation, macOS). Read and registered
/// once per process; the file's bytes live as long as the process.
fn png_font() -> Result<(), PngError> {
    const FONT_BYTES_MAX: u64 = 64 << 20;
    static FONT: std::sync::OnceLock<Result<(), PngError>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        const PLACES: &[&str] = &[
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
            "/Library/Fonts/Arial.ttf",
            "/System/Library/Fonts/Supplemental/Arial.ttf",
        ];
        let chosen = match std::env::var_os("LOCH_PLOT_FONT") {
            Some(p) => std::path::PathBuf::from(p),
            None => PLACES
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    PngError(
                        "no TrueType font for PNG text: set LOCH_PLOT_FONT=FILE.ttf, or install \
                         one (Debian and Ubuntu: fonts-dejavu-core)"
                            .into(),
                    )
                })?,
        };
        // A font, not whatever the variable names: at most 64 MiB, from a
        // regular file or a pipe (/dev/zero would never end).
        let font_err = |e: String| PngError(format!("PNG font `{}`: {e}", chosen.display()));
        let bytes = bootstrap::config::read_input_at_most(&chosen, FONT_BYTES_MAX)
            .map_err(|e| font_err(e.to_string()))?;
        if bytes.len() as u64 > FONT_BYTES_MAX {
            return Err(font_err(format!(
                "larger than {} MiB",
                FONT_BYTES_MAX >> 20
            )));
        }
        // One font per process, kept for its life: plotters holds
        // registered fonts by 'static reference.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(PNG_FAMILY, plotters::style::FontStyle::Normal, bytes)
            .map_err(|_| {
                PngError(format!(
                    "PNG font `{}` is not a TrueType or OpenType font",
                    chosen.display()
                ))
            })
    })
    .clone()
}

/// The chart as a PNG image of the same layout as its SVG, drawn by
/// plotters' bitmap backend.
pub fn png(c: &Chart) -> Result<Vec<u8>, PngError> {
    png_font()?;
    let (f, empty) = layout(c);
    let (w, h) = (W as u32, H as u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let mut o = Bitmap {
            b: plotters::prelude::BitMapBackend::with_buffer(&mut rgb, (w, h)),
            failed: None,
        };
        draw(&mut o, c, &f, empty);
        if let Some(e) = o.failed {
            return Err(PngError(format!("drawing the PNG: {e}")));
        }
    }
    let mut out = Vec::with_capacity(64 << 10);
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc
        .write_header()
        .map_err(|e| PngError(format!("encoding the PNG: {e}")))?;
    wr.write_image_data(&rgb)
        .map_err(|e| PngError(format!("encoding the PNG: {e}")))?;
    wr.finish()
        .map_err(|e| PngError(format!("encoding the PNG: {e}")))?;
    Ok(out)
}

/// plotters' RGB bitmap, keeping the first drawing error.
struct Bitmap<'a> {
    b: plotters::prelude::BitMapBackend<'a>,
    failed: Option<String>,
}

impl Bitmap<'_> {
    fn keep<E: std::fmt::Display>(&mut self, r: Result<(), E>) {
        if let (Err(e), None) = (r, &self.failed) {
            self.failed = Some(e.to_string());
        }
    }
}

fn px(p: (f64, f64)) -> (i32, i32) {
    (p.0.round() as i32, p.1.round() as i32)
}

fn color(c: Rgb) -> plotters::style::RGBColor {
    plotters::style::RGBColor(c.0, c.1, c.2)
}

impl Canvas for Bitmap<'_> {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Option<Rgb>, stroke: Option<Rgb>) {
        use plotters::prelude::*;
        let (a, b) = (px((x, y)), px((x + w, y + h)));
        if let Some(c) = fill {
            let r = self.b.draw_rect(a, b, &color(c).filled(), true);
            self.keep(r);
        }
        if let Some(c) = stroke {
            let r = self.b.draw_rect(a, b, &color(c).stroke_width(1), false);
            self.keep(r);
        }
    }

    fn line(&mut self, a: (f64, f64), b: (f64, f64), c: Rgb, width: f64) {
        use plotters::prelude::*;
        let style = color(c).stroke_width(width.round() as u32);
        let r = self.b.draw_line(px(a), px(b), &style);
        self.keep(r);
    }

    fn text(&mut self, (x, y): (f64, f64), text: &str, font: Font) {
        let Font {
            size,
            anchor,
            vertical,
            color: c,
        } = font;
        use plotters::prelude::*;
        use plotters::style::text_anchor::{HPos, Pos, VPos};
        let h = match anchor {
            Anchor::Start => HPos::Left,
            Anchor::Middle => HPos::Center,
            Anchor::End => HPos::Right,
        };
        let mut style = (PNG_FAMILY, size)
            .into_font()
            .color(&color(c))
            .pos(Pos::new(h, VPos::Top));
        // The font backend puts the baseline half a size below the
        // position, so the position is half a size above the baseline
        // (left of it for vertical text, whose "down" is to the right).
        let at = if vertical {
            style = style.transform(FontTransform::Rotate270);
            (x - size / 2.0, y)
        } else {
            (x, y - size / 2.0)
        };
        let r = self.b.draw_text(text, &style, px(at));
        self.keep(r);
    }

    fn polyline(&mut self, pts: &[(f64, f64)], c: Rgb, width: f64, _name: &str) {
        use plotters::prelude::*;
        let style = color(c).stroke_width(width.round() as u32);
        let r = self.b.draw_path(pts.iter().map(|&p| px(p)), &style);
        self.keep(r);
    }

    fn dot(&mut self, x: f64, y: f64, r: f64, c: Rgb) {
        use plotters::prelude::*;
        let res = self
            .b
            .draw_circle(px((x, y)), r.round() as u32, &color(c).filled(), true);
        self.keep(res);
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
        let doc = latency_cdf(
            "a <b> & \"c\"",
            &[("fg+comb".into(), &h), ("x<y&z".into(), &empty)],
        )
        .svg;
        let n = well_formed(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        assert!(n > 10);
        assert_eq!(doc.matches("<polyline").count(), 2);
        assert!(doc.contains("x&lt;y&amp;z"));
        // 1.5 µs .. 150 µs on a log axis: decades 1 .. 1000 µs.
        assert!(doc.contains(">1000</text>") && doc.contains(">1</text>"));
        let t = throughput(
            "sweep",
            &[Series {
                name: "sherman".into(),
                points: vec![(4.0, 1e6), (8.0, 1.9e6), (16.0, 3.5e6)],
            }],
        )
        .svg;
        well_formed(&t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        assert_eq!(t.matches("<circle").count(), 3);
        let none = throughput("nothing", &[]).svg;
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

    /// The PNG is a real image of the chart: a valid PNG of the chart's
    /// size, each series' colour on it, and text drawn (dark pixels in the
    /// title's band, which no line reaches). Needs a TrueType font, which
    /// `.ci/run` installs (fonts-dejavu-core).
    #[test]
    fn png_charts_draw_lines_and_text() {
        let mut h = cluster::stats::latency_histogram();
        for v in [1500u64, 2000, 2100, 9000, 150_000] {
            h.record(v).unwrap();
        }
        let drawn = latency_cdf("Latency CDF", &[("sherman".into(), &h), ("fg".into(), &h)]);
        let bytes = drawn.png.unwrap_or_else(|e| panic!("{}", e.0));
        let dec = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (W as u32, H as u32));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let at = |x: u32, y: u32| {
            let i = ((y * info.width + x) * 3) as usize;
            Rgb(buf[i], buf[i + 1], buf[i + 2])
        };
        let mut seen = std::collections::HashSet::new();
        let mut dark_in_title = 0;
        for y in 0..info.height {
            for x in 0..info.width {
                let c = at(x, y);
                seen.insert(c);
                if y < 30 && c.0 < 100 && c.1 < 100 && c.2 < 100 {
                    dark_in_title += 1;
                }
            }
        }
        // The second series is drawn over the first; the legend shows both.
        assert!(seen.contains(&COLORS[0]) && seen.contains(&COLORS[1]));
        assert!(
            dark_in_title > 50,
            "no title text: {dark_in_title} dark pixels"
        );
        // A font that is not one is a clear error, not a panic: checked
        // on the loader's parse, as the process keeps its first font.
        assert!(plotters::style::register_font(
            "not-a-font",
            plotters::style::FontStyle::Normal,
            b"not a font"
        )
        .is_err());
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
