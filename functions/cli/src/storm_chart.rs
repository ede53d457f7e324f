//! The storm as an SVG, written by hand: offered and served attempts per second, the
//! consumer's capacity and the gate's threshold. Long storms (hours of retries) get a
//! logarithmic time axis so the first waves stay visible.

use std::fmt::Write;

use hookwise_core::storm::StormReport;

const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 250.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 40.0;
const OFFERED: &str = "#e4572e";
const SERVED: &str = "#2e86ab";
const CAPACITY: &str = "#2a9d49";
const THRESHOLD: &str = "#f4a259";

/// One storm, one chart.
pub fn single(report: &StormReport, threshold: Option<u64>) -> String {
    let (w, h) = (900.0, 440.0);
    let mut svg = header(w, h + 26.0);
    let title = format!(
        "Retry storm: policy {}, {} jitter, N = {}{}, peak {} /s at t = {} s",
        report.policy,
        report.jitter,
        report.population,
        protection(report),
        report.peak_offered_rps,
        report.peak_second
    );
    text(&mut svg, w / 2.0, 22.0, 15.0, "middle", &title);
    let ymax = y_max(std::slice::from_ref(report), threshold);
    panel(
        &mut svg,
        0.0,
        10.0,
        w,
        h,
        report,
        report.series.offered.len(),
        ymax,
        None,
        threshold,
    );
    legend(&mut svg, LEFT, h + 18.0, threshold.is_some());
    svg.push_str("</svg>\n");
    svg
}

/// Several strategies on the same inputs: small multiples on one scale, and a summary table.
pub fn compare(reports: &[StormReport], threshold: Option<u64>) -> String {
    let cols = reports.len().clamp(1, 3);
    let rows = reports.len().div_ceil(cols);
    let w = PANEL_W * cols as f64;
    let table_h = 30.0 + 18.0 * reports.len() as f64;
    let h = 40.0 + PANEL_H * rows as f64 + 30.0 + table_h;
    let mut svg = header(w, h);
    let first = &reports[0];
    let title = format!(
        "Retry storm by jitter strategy: policy {}, N = {}, capacity {} /s{} (same seed)",
        first.policy,
        first.population,
        first.series.capacity.first().copied().unwrap_or(0),
        protection(first)
    );
    text(&mut svg, w / 2.0, 24.0, 16.0, "middle", &title);
    let ymax = y_max(reports, threshold);
    // One time scale for all panels, so the drain times compare by eye.
    let span = reports.iter().map(|r| r.series.offered.len()).max().unwrap_or(2);
    for (i, r) in reports.iter().enumerate() {
        let (x, y) = (PANEL_W * (i % cols) as f64, 34.0 + PANEL_H * (i / cols) as f64);
        let label = format!(
            "{} jitter: peak {} /s at {} s",
            r.jitter, r.peak_offered_rps, r.peak_second
        );
        panel(&mut svg, x, y, PANEL_W, PANEL_H, r, span, ymax, Some(&label), threshold);
    }
    let top = 34.0 + PANEL_H * rows as f64;
    legend(&mut svg, LEFT, top + 14.0, threshold.is_some());

    let cols_x = [
        LEFT,
        LEFT + 160.0,
        LEFT + 260.0,
        LEFT + 390.0,
        LEFT + 510.0,
        LEFT + 620.0,
        LEFT + 720.0,
    ];
    let heads = [
        "jitter",
        "peak /s",
        "attempts",
        "delivered",
        "dead",
        "drain s",
        "p99 delivery s",
    ];
    let y0 = top + 44.0;
    for (x, head) in cols_x.iter().zip(heads) {
        let _ = write!(
            svg,
            r#"<text x="{x:.1}" y="{y0:.1}" font-size="12" font-weight="bold">{head}</text>"#
        );
    }
    for (i, r) in reports.iter().enumerate() {
        let y = y0 + 18.0 * (i + 1) as f64;
        let cells = [
            r.jitter.clone(),
            r.peak_offered_rps.to_string(),
            r.total_attempts.to_string(),
            r.delivered.to_string(),
            r.dead.to_string(),
            r.drain_seconds.to_string(),
            r.p99_delivery_seconds.map_or("-".into(), |s| s.to_string()),
        ];
        for (x, cell) in cols_x.iter().zip(cells) {
            let _ = write!(
                svg,
                r#"<text x="{x:.1}" y="{y:.1}" font-size="12">{}</text>"#,
                escape(&cell)
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// ", rate limit 100/s, breaker on": what met the retries before the consumer, if anything.
pub fn protection(r: &StormReport) -> String {
    if r.protection.is_empty() {
        String::new()
    } else {
        format!(", {}", r.protection)
    }
}

fn header(w: f64, h: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="Helvetica, Arial, sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    ) + "\n"
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn text(svg: &mut String, x: f64, y: f64, size: f64, anchor: &str, s: &str) {
    let _ = writeln!(
        svg,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="{size}" text-anchor="{anchor}">{}</text>"#,
        escape(s)
    );
}

fn y_max(reports: &[StormReport], threshold: Option<u64>) -> f64 {
    let mut m = threshold.unwrap_or(0);
    for r in reports {
        m = m
            .max(r.peak_offered_rps)
            .max(r.series.capacity.iter().copied().max().unwrap_or(0));
    }
    (m.max(1) as f64) * 1.08
}

/// 1, 2 or 5 times a power of ten, giving about `n` steps over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|f| f * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn human(n: f64) -> String {
    if n >= 1e6 {
        format!("{}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{}k", n / 1e3)
    } else {
        format!("{n}")
    }
}

/// Linear time for short storms, log(1 + t) for long ones.
struct TimeAxis {
    len: f64,
    log: bool,
    width: f64,
}

impl TimeAxis {
    fn x(&self, t: f64) -> f64 {
        if self.log {
            (1.0 + t).log10() / (1.0 + self.len).log10() * self.width
        } else {
            t / self.len * self.width
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    r: &StormReport,
    span: usize,
    ymax: f64,
    label: Option<&str>,
    threshold: Option<u64>,
) {
    let s = &r.series;
    let (pw, ph) = (w - LEFT - RIGHT, h - TOP - BOTTOM);
    let (left, top) = (x0 + LEFT, y0 + TOP);
    let len = span.max(s.offered.len()).max(2) as f64;
    let axis = TimeAxis {
        len,
        log: len > 2_000.0,
        width: pw,
    };
    let y = |v: f64| top + ph - v / ymax * ph;

    if let Some(label) = label {
        text(svg, left + pw / 2.0, y0 + 22.0, 13.0, "middle", label);
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{left:.1}" y="{top:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#999"/>"##
    );

    // Y grid and labels.
    let step = nice_step(ymax, 5.0);
    let mut v = 0.0;
    while v <= ymax {
        let yy = y(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0,
            human(v)
        );
        v += step;
    }
    // X ticks.
    let ticks: Vec<f64> = if axis.log {
        (0..)
            .map(|k| 10f64.powi(k))
            .take_while(|t| *t <= len)
            .chain(std::iter::once(0.0))
            .collect()
    } else {
        let step = nice_step(len, 6.0).max(1.0);
        (0..).map(|k| k as f64 * step).take_while(|t| *t <= len).collect()
    };
    for t in ticks {
        let xx = left + axis.x(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 4.0,
            top + ph + 16.0,
            human(t)
        );
    }
    let xlabel = if axis.log { "second (log scale)" } else { "second" };
    text(svg, left + pw / 2.0, top + ph + 32.0, 11.0, "middle", xlabel);

    // Seconds merged into pixel columns: the busiest second of each column is drawn.
    let mut bins: Vec<(f64, f64, u64, u64, u64)> = Vec::new();
    for t in 0..s.offered.len() {
        let (a, b) = (axis.x(t as f64), axis.x(t as f64 + 1.0));
        match bins.last_mut() {
            Some(bin) if a.floor() == bin.0.floor() && b - a < 1.0 => {
                bin.1 = b;
                bin.2 = bin.2.max(s.offered[t]);
                bin.3 = bin.3.max(s.served[t]);
                bin.4 = bin.4.min(s.capacity[t]);
            }
            _ => bins.push((a, b, s.offered[t], s.served[t], s.capacity[t])),
        }
    }
    for (a, b, offered, served, _) in &bins {
        let bw = (b - a).max(1.0);
        for (value, colour) in [(*offered, OFFERED), (*served, SERVED)] {
            if value > 0 {
                let yy = y(value as f64);
                let _ = write!(
                    svg,
                    r#"<rect x="{:.1}" y="{yy:.1}" width="{bw:.1}" height="{:.1}" fill="{colour}"/>"#,
                    left + a,
                    top + ph - yy
                );
            }
        }
    }
    svg.push('\n');
    // The capacity, as a step line.
    let mut points = String::new();
    let mut last: Option<u64> = None;
    for (a, b, _, _, cap) in &bins {
        if last != Some(*cap) {
            if let Some(prev) = last {
                let _ = write!(points, "{:.1},{:.1} ", left + a, y(prev as f64));
            }
            let _ = write!(points, "{:.1},{:.1} ", left + a, y(*cap as f64));
            last = Some(*cap);
        }
        let _ = b;
    }
    if let Some(cap) = last {
        let _ = write!(points, "{:.1},{:.1}", left + pw, y(cap as f64));
    }
    let _ = writeln!(
        svg,
        r#"<polyline points="{points}" fill="none" stroke="{CAPACITY}" stroke-width="2" stroke-dasharray="6 3"/>"#
    );
    if let Some(t) = threshold {
        let yy = y(t as f64);
        let _ = writeln!(
            svg,
            r#"<line x1="{left:.1}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="{THRESHOLD}" stroke-width="2" stroke-dasharray="2 3"/>"#,
            left + pw
        );
    }
}

fn legend(svg: &mut String, x: f64, y: f64, threshold: bool) {
    let mut items = vec![
        (OFFERED, "offered attempts/s"),
        (SERVED, "served attempts/s"),
        (CAPACITY, "consumer capacity"),
    ];
    if threshold {
        items.push((THRESHOLD, "gate threshold"));
    }
    let mut cx = x;
    for (colour, label) in items {
        let _ = write!(
            svg,
            r#"<rect x="{cx:.1}" y="{:.1}" width="12" height="12" fill="{colour}"/>"#,
            y - 10.0
        );
        let _ = write!(
            svg,
            r#"<text x="{:.1}" y="{y:.1}" font-size="12">{label}</text>"#,
            cx + 16.0
        );
        cx += 170.0;
    }
    svg.push('\n');
}
