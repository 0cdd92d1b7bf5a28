//! Output: aligned tables by default (coloured only on a terminal), or JSON or YAML of the
//! same data for scripts.

use std::io::{IsTerminal, Write};

use serde::Serialize;

use crate::connect::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
    Yaml,
}

/// Whether tables are coloured: only when stdout is a terminal and `NO_COLOR` is unset.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    pub fn detect() -> Self {
        Self {
            colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    Green,
    Yellow,
    Red,
    Dim,
}

impl Colour {
    fn code(self) -> &'static str {
        match self {
            Colour::Green => "32",
            Colour::Yellow => "33",
            Colour::Red => "31",
            Colour::Dim => "2",
        }
    }
}

/// One cell: its text, and a colour used only on a terminal.
#[derive(Clone, Debug)]
pub struct Cell {
    text: String,
    colour: Option<Colour>,
}

impl<T: std::fmt::Display> From<T> for Cell {
    fn from(text: T) -> Self {
        Cell {
            text: text.to_string(),
            colour: None,
        }
    }
}

pub fn coloured(text: impl std::fmt::Display, colour: Colour) -> Cell {
    Cell {
        text: text.to_string(),
        colour: Some(colour),
    }
}

/// Columns aligned to their widest cell, two spaces apart, as kubectl prints them.
#[derive(Debug)]
pub struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Self {
            headers: headers.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<Cell>) {
        self.rows.push(cells);
    }

    pub fn render(&self, style: Style) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.text.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, cells: Vec<(&str, Option<Colour>)>| {
            let last = cells.len().saturating_sub(1);
            for (i, (text, colour)) in cells.into_iter().enumerate() {
                let pad = if i == last {
                    0
                } else {
                    widths[i] - text.chars().count() + 2
                };
                match colour.filter(|_| style.colour) {
                    Some(c) => out.push_str(&format!("\x1b[{}m{text}\x1b[0m", c.code())),
                    None => out.push_str(text),
                }
                out.push_str(&" ".repeat(pad));
            }
            out.push('\n');
        };
        line(&mut out, self.headers.iter().map(|h| (*h, None)).collect());
        for row in &self.rows {
            line(
                &mut out,
                row.iter()
                    .take(columns)
                    .map(|c| (c.text.as_str(), c.colour))
                    .collect(),
            );
        }
        out
    }
}

/// Prints `value` as `output` asks: `table` renders it for people.
pub fn print<T: Serialize>(
    output: Output,
    value: &T,
    table: fn(&T, Style) -> String,
) -> Result<()> {
    let text = render(output, value, table)?;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| Error::Output(e.to_string()))
}

pub fn render<T: Serialize>(
    output: Output,
    value: &T,
    table: fn(&T, Style) -> String,
) -> Result<String> {
    match output {
        Output::Table => Ok(table(value, Style::detect())),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| Error::Output(e.to_string())),
        Output::Yaml => serde_norway::to_string(value).map_err(|e| Error::Output(e.to_string())),
    }
}

/// A duration for people: `850ms`, `12.3s`, `4m10s`, `2h5m`.
pub fn human(seconds: f64) -> String {
    if !seconds.is_finite() {
        return "-".into();
    }
    if seconds < 1.0 {
        return format!("{:.0}ms", seconds * 1000.0);
    }
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    let whole = seconds as u64;
    if whole < 3600 {
        return format!("{}m{}s", whole / 60, whole % 60);
    }
    format!("{}h{}m", whole / 3600, (whole % 3600) / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_colour_only_when_asked() {
        let mut table = Table::new(&["NAME", "STATE"]);
        table.row(vec!["a-long-name".into(), coloured("ok", Colour::Green)]);
        table.row(vec!["b".into(), coloured("failed", Colour::Red)]);
        let plain = table.render(Style { colour: false });
        assert_eq!(
            plain,
            "NAME         STATE\na-long-name  ok\nb            failed\n"
        );
        let tty = table.render(Style { colour: true });
        assert!(tty.contains("\x1b[31mfailed\x1b[0m"), "{tty:?}");
    }

    #[test]
    fn durations_read_like_kubectls() {
        assert_eq!(human(0.0123), "12ms");
        assert_eq!(human(12.34), "12.3s");
        assert_eq!(human(250.0), "4m10s");
        assert_eq!(human(7500.0), "2h5m");
    }
}
