//! The plot of the benchmark report (`benches/plot.svg`), drawn with plotters' SVG backend.
//!
//! One row per workload, top to bottom in the order they ran. In each row, one horizontal bar
//! per implementation other than Burn + `Mlx`, from the 1x line to `time / time(Burn + Mlx)` on
//! a log2 axis clamped to [1/64, 64]: a bar to the right of 1x means `Mlx` is faster.

use super::report::{Medians, Workload, BACKENDS};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Bar colour of each implementation, in the order of [`BACKENDS`] (`Mlx`, the reference, has
/// no bar).
const COLORS: [RGBColor; BACKENDS.len()] = [
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
];

/// The axis runs from `2^-MAX_LOG2` to `2^MAX_LOG2`; larger ratios are drawn at the edge.
const MAX_LOG2: i32 = 6;
/// Width of the SVG, in pixels (as are the sizes below).
const WIDTH: u32 = 1100;
/// Width of the column of workload names on the left of the chart.
const LABEL_WIDTH: u32 = 500;
/// Height of one workload's row.
const ROW_HEIGHT: u32 = 44;
/// Height of the title and legend above the chart.
const HEADER_HEIGHT: u32 = 56;
/// Height of the x axis's labels below the chart.
const AXIS_HEIGHT: u32 = 36;
/// Units of the y axis per bar, the gap below it included.
const BAR_UNITS: i32 = 3;
/// Units of the y axis per workload: a bar per implementation other than Mlx, and a margin.
const ROW_UNITS: i32 = BAR_UNITS * (BACKENDS.len() as i32 - 1) + 2;

/// Turns plotters' drawing errors into the report's I/O errors.
fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("drawing benches/plot.svg: {e}"))
}

/// The x axis's label of a ratio that is a power of two: `4x`, `1x`, `1/8x`.
fn ratio_label(ratio: f64) -> String {
    let e = ratio.log2().round() as i32;
    if e >= 0 {
        format!("{}x", 1u32 << e)
    } else {
        format!("1/{}x", 1u32 << -e)
    }
}

/// The SVG text of the chart: per workload of `workloads` (with its medians at the same index
/// of `times`), one bar per implementation that ran it, ratio to Burn + `Mlx` on a log axis.
pub fn ratio_chart(workloads: &[Workload], times: &[Medians]) -> std::io::Result<String> {
    let rows = workloads.len();
    let height = HEADER_HEIGHT + ROW_HEIGHT * rows.max(1) as u32 + AXIS_HEIGHT;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(io_error)?;
        let (header, body) = root.split_vertically(HEADER_HEIGHT);
        draw_header(&header)?;

        // The y axis counts bar units from the bottom: workload `i` (the first at the top) owns
        // the units `[(rows - 1 - i) * ROW_UNITS, (rows - i) * ROW_UNITS)`.
        let (lo, hi) = (2f64.powi(-MAX_LOG2), 2f64.powi(MAX_LOG2));
        let ticks: Vec<f64> = (-MAX_LOG2..=MAX_LOG2).map(|e| 2f64.powi(e)).collect();
        let row_base = |i: usize| (rows - 1 - i) as i32 * ROW_UNITS;
        let centres: Vec<i32> = (0..rows).map(|i| row_base(i) + ROW_UNITS / 2).collect();
        let top = rows as i32 * ROW_UNITS;
        let mut chart = ChartBuilder::on(&body)
            .margin_right(20)
            .y_label_area_size(LABEL_WIDTH)
            .x_label_area_size(AXIS_HEIGHT - 8)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(ticks),
                (0..top).with_key_points(centres),
            )
            .map_err(io_error)?;
        let name_of_row = |y: &i32| {
            let from_top = rows as i32 - 1 - y.div_euclid(ROW_UNITS);
            usize::try_from(from_top)
                .ok()
                .and_then(|i| workloads.get(i))
                .map_or_else(String::new, |w| w.label.clone())
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(0xdd, 0xdd, 0xdd))
            .x_label_formatter(&|r| ratio_label(*r))
            .y_label_formatter(&name_of_row)
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(io_error)?;

        // Thin lines between the workloads' rows.
        let separators = (1..rows as i32).map(|r| {
            PathElement::new(
                vec![(lo, r * ROW_UNITS), (hi, r * ROW_UNITS)],
                RGBColor(0xee, 0xee, 0xee),
            )
        });
        chart.draw_series(separators).map_err(io_error)?;

        // The 1x line: no difference from Burn + Mlx.
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0), (1.0, top)],
                BLACK.stroke_width(1),
            )))
            .map_err(io_error)?;

        // Top to bottom in a row: one unit of margin, then per implementation a bar of
        // `BAR_UNITS - 1` units and a unit of gap.
        let bars = times.iter().enumerate().flat_map(|(i, row)| {
            let row_top = row_base(i) + ROW_UNITS - 1;
            (1..BACKENDS.len()).filter_map(move |b| {
                let ratio = (row[b]? / row[0]?).clamp(lo, hi);
                let bar_top = row_top - (b as i32 - 1) * BAR_UNITS;
                Some(Rectangle::new(
                    [(1.0, bar_top), (ratio, bar_top - (BAR_UNITS - 1))],
                    COLORS[b].filled(),
                ))
            })
        });
        chart.draw_series(bars).map_err(io_error)?;
        root.present().map_err(io_error)?;
    }
    Ok(svg)
}

/// The title and, under it, one colour key per implementation drawn as bars.
fn draw_header<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> std::io::Result<()>
where
    DB::ErrorType: 'static,
{
    let title = "time / time(Burn + Mlx), log scale (right of 1x: Mlx faster)";
    let title_style = ("sans-serif", 17)
        .into_font()
        .into_text_style(area)
        .pos(Pos::new(HPos::Center, VPos::Top));
    area.draw(&Text::new(title, (WIDTH as i32 / 2, 6), title_style))
        .map_err(io_error)?;
    let key_width = 150;
    let first = (WIDTH as i32 - key_width * (BACKENDS.len() as i32 - 1)) / 2;
    for (k, (_, name)) in BACKENDS.iter().enumerate().skip(1) {
        let x = first + key_width * (k as i32 - 1);
        area.draw(&Rectangle::new([(x, 32), (x + 10, 42)], COLORS[k].filled()))
            .map_err(io_error)?;
        area.draw(&Text::new(*name, (x + 14, 31), ("sans-serif", 13)))
            .map_err(io_error)?;
    }
    Ok(())
}
