//! Cron schedules as kube-controller-manager reads them (`github.com/robfig/cron/v3`'s
//! standard parser): five fields (minute, hour, day of month, month, day of week) with
//! lists, ranges, steps and names; the descriptors `@yearly` (`@annually`), `@monthly`,
//! `@weekly`, `@daily` (`@midnight`), `@hourly` and `@every <duration>`; and a `TZ=` or
//! `CRON_TZ=` prefix naming the time zone.
//!
//! A day matches when both day fields match, or, when neither is `*` (or `?`), when either
//! does, as in cron. The next time is found on the wall clock of the schedule's time zone: a
//! time a DST change skips runs as the clock moved (02:30 at 03:30 when 02:00 became 03:00),
//! one it repeats runs once, at its first occurrence.

use std::{fmt, time::Duration};

use jiff::{
    Timestamp, ToSpan,
    civil::{Date, DateTime},
    tz::TimeZone,
};

/// A schedule that cannot be read, with robfig/cron's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(String);

fn error(message: impl Into<String>) -> ScheduleError {
    ScheduleError(message.into())
}

/// A parsed schedule: when it fires.
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
    tz: TimeZone,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Fields(Fields),
    /// `@every`: a constant delay, whole seconds.
    Every(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Fields {
    minute: u64,
    hour: u64,
    dom: u64,
    month: u64,
    dow: u64,
    /// The day-of-month field was `*` or `?` (no step).
    dom_star: bool,
    dow_star: bool,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("kind", &self.kind)
            .field("tz", &self.tz.iana_name())
            .finish()
    }
}

struct Bounds {
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Bounds = Bounds {
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Bounds = Bounds {
    min: 0,
    max: 23,
    names: &[],
};
const DOM: Bounds = Bounds {
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Bounds = Bounds {
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const DOW: Bounds = Bounds {
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Bounds {
    /// A number, or a name (its position plus `min`).
    fn value(&self, text: &str) -> Result<u32, ScheduleError> {
        let lower = text.to_ascii_lowercase();
        if let Some(at) = self.names.iter().position(|n| *n == lower) {
            return Ok(self.min + u32::try_from(at).unwrap_or(0));
        }
        text.parse::<u32>()
            .map_err(|_| error(format!("failed to parse int from {text}")))
    }

    /// One field: comma-separated ranges. The bits set, and whether it was `*` / `?`.
    fn field(&self, text: &str) -> Result<(u64, bool), ScheduleError> {
        let mut bits = 0;
        let mut star = false;
        for part in text.split(',') {
            let (range_bits, range_star) = self.range(part)?;
            bits |= range_bits;
            star |= range_star;
        }
        Ok((bits, star))
    }

    fn range(&self, text: &str) -> Result<(u64, bool), ScheduleError> {
        let mut slash = text.split('/');
        let range = slash.next().unwrap_or_default();
        let step = slash.next();
        if slash.next().is_some() {
            return Err(error(format!("too many slashes: {text}")));
        }
        let mut hyphen = range.split('-');
        let low = hyphen.next().unwrap_or_default();
        let high = hyphen.next();
        if hyphen.next().is_some() {
            return Err(error(format!("too many hyphens: {range}")));
        }
        let (start, mut end, mut star) = if low == "*" || low == "?" {
            (self.min, self.max, true)
        } else {
            let start = self.value(low)?;
            let end = match high {
                Some(high) => self.value(high)?,
                None => start,
            };
            (start, end, false)
        };
        let step = match step {
            None => 1,
            Some(step) => {
                let step: u32 = step
                    .parse()
                    .map_err(|_| error(format!("failed to parse int from {step}")))?;
                if step == 0 {
                    return Err(error(format!(
                        "step of range should be a positive number: {text}"
                    )));
                }
                // "N/step" is "N-max/step".
                if high.is_none() && !star {
                    end = self.max;
                }
                if step > 1 {
                    star = false;
                }
                step
            }
        };
        if start < self.min {
            return Err(error(format!(
                "beginning of range ({start}) below minimum ({}): {text}",
                self.min
            )));
        }
        if end > self.max {
            return Err(error(format!(
                "end of range ({end}) above maximum ({}): {text}",
                self.max
            )));
        }
        if start > end {
            return Err(error(format!(
                "beginning of range ({start}) beyond end of range ({end}): {text}"
            )));
        }
        let bits = (start..=end)
            .step_by(step as usize)
            .fold(0u64, |bits, v| bits | (1 << v));
        Ok((bits, star))
    }
}

/// A Go duration (`1h30m`, `90s`, `1.5h`), as `@every` takes it.
fn go_duration(text: &str) -> Result<Duration, ScheduleError> {
    let bad = || {
        error(format!(
            "failed to parse duration @every {text}: invalid duration"
        ))
    };
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        total += number * nanos;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_nanos(total as u64))
}

impl Schedule {
    /// Parses `spec` as robfig/cron's standard parser does, in `tz` unless the spec names
    /// its own (`TZ=` / `CRON_TZ=`).
    pub fn parse(spec: &str, tz: TimeZone) -> Result<Self, ScheduleError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err(error("empty spec string"));
        }
        let (tz, spec) = if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let (prefix, rest) = spec.split_once(' ').unwrap_or((spec, ""));
            let name = prefix.split_once('=').map_or("", |(_, name)| name);
            let zone = TimeZone::get(name)
                .map_err(|e| error(format!("provided bad location {name}: {e}")))?;
            (zone, rest.trim())
        } else {
            (tz, spec)
        };
        if let Some(descriptor) = spec.strip_prefix('@') {
            let fields = match descriptor {
                "yearly" | "annually" => "0 0 1 1 *",
                "monthly" => "0 0 1 * *",
                "weekly" => "0 0 * * 0",
                "daily" | "midnight" => "0 0 * * *",
                "hourly" => "0 * * * *",
                other => {
                    if let Some(every) = other.strip_prefix("every ") {
                        let delay = go_duration(every.trim())?;
                        // At least a second, in whole seconds.
                        let delay = Duration::from_secs(delay.as_secs().max(1));
                        return Ok(Self {
                            kind: Kind::Every(delay),
                            tz,
                        });
                    }
                    return Err(error(format!("unrecognized descriptor: {spec}")));
                }
            };
            return Self::fields(fields, tz);
        }
        Self::fields(spec, tz)
    }

    fn fields(spec: &str, tz: TimeZone) -> Result<Self, ScheduleError> {
        let parts: Vec<&str> = spec.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(error(format!(
                "expected exactly 5 fields, found {}: {spec}",
                parts.len()
            )));
        }
        let (minute, _) = MINUTE.field(parts[0])?;
        let (hour, _) = HOUR.field(parts[1])?;
        let (dom, dom_star) = DOM.field(parts[2])?;
        let (month, _) = MONTH.field(parts[3])?;
        let (dow, dow_star) = DOW.field(parts[4])?;
        Ok(Self {
            kind: Kind::Fields(Fields {
                minute,
                hour,
                dom,
                month,
                dow,
                dom_star,
                dow_star,
            }),
            tz,
        })
    }

    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// The first time after `after` the schedule fires; `None` if none within five years
    /// (a schedule for the 30th of February, say).
    pub fn next(&self, after: Timestamp) -> Option<Timestamp> {
        match &self.kind {
            Kind::Every(delay) => {
                let whole = Timestamp::from_second(after.as_second()).ok()?;
                whole.checked_add(*delay).ok()
            }
            Kind::Fields(fields) => fields.next(after, &self.tz),
        }
    }
}

fn has(bits: u64, value: i8) -> bool {
    u32::try_from(value).is_ok_and(|v| v < 64 && bits & (1 << v) != 0)
}

impl Fields {
    fn day_matches(&self, date: Date) -> bool {
        let dom = has(self.dom, date.day());
        let dow = has(self.dow, date.weekday().to_sunday_zero_offset());
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    fn next(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = after.to_zoned(tz.clone()).datetime();
        let minute = local.date().at(local.hour(), local.minute(), 0, 0);
        let mut at: DateTime = minute.checked_add(1.minute()).ok()?;
        let last_year = at.year().saturating_add(5);
        while at.year() <= last_year {
            if !has(self.month, at.month()) {
                let (year, month) = if at.month() == 12 {
                    (at.year() + 1, 1)
                } else {
                    (at.year(), at.month() + 1)
                };
                at = Date::new(year, month, 1).ok()?.at(0, 0, 0, 0);
                continue;
            }
            if !self.day_matches(at.date()) {
                at = at.date().tomorrow().ok()?.at(0, 0, 0, 0);
                continue;
            }
            if !has(self.hour, at.hour()) {
                at = at
                    .date()
                    .at(at.hour(), 0, 0, 0)
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if !has(self.minute, at.minute()) {
                at = at.checked_add(1.minute()).ok()?;
                continue;
            }
            let fires = tz.to_ambiguous_zoned(at).compatible().ok()?.timestamp();
            if fires > after {
                return Some(fires);
            }
            at = at.checked_add(1.minute()).ok()?;
        }
        None
    }
}
