//! Completion indexes of an Indexed Job: the compressed interval strings of
//! `status.completedIndexes`, `status.failedIndexes` and `successPolicy` rules ("1,3-5,7"),
//! and the index a Pod carries (`indexed_job_utils.go`).

use std::{collections::BTreeSet, fmt};

use k8s_openapi::api::core::v1::Pod;

/// The annotation (and label) holding a Pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// How many times the Pod's index has failed before this Pod (counted failures).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// How many of the index's failures the Pod failure policy ignored.
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";

/// Sorted, disjoint, non-adjacent closed intervals of indexes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intervals(Vec<(u32, u32)>);

impl Intervals {
    /// Parses `"1,3-5,7"`, keeping indexes below `completions`: an interval starting at or
    /// past it ends the parse, one ending past it is cut. A part that is not a number is
    /// skipped, as kube-controller-manager skips a corrupted interval.
    pub fn parse(text: &str, completions: u32) -> Self {
        let mut result = Self::default();
        if text.is_empty() {
            return result;
        }
        for part in text.split(',') {
            let mut limits = part.splitn(2, '-');
            let Some(Ok(first)) = limits.next().map(str::parse::<u32>) else {
                continue;
            };
            if first >= completions {
                break;
            }
            let last = match limits.next() {
                Some(last) => match last.parse::<u32>() {
                    Ok(last) => last.min(completions - 1),
                    Err(_) => continue,
                },
                None => first,
            };
            if last < first {
                continue;
            }
            result.push(first, last);
        }
        result
    }

    /// Appends an interval at or after the last one, merged with it when they touch.
    fn push(&mut self, first: u32, last: u32) {
        match self.0.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => self.0.push((first, last)),
        }
    }

    /// These and `other` together.
    pub fn merge(&self, other: &Self) -> Self {
        let mut all: Vec<(u32, u32)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut result = Self::default();
        for (first, last) in all {
            result.push(first, last);
        }
        result
    }

    /// These and the single `indexes`.
    pub fn with(&self, indexes: impl IntoIterator<Item = u32>) -> Self {
        let set: BTreeSet<u32> = indexes.into_iter().collect();
        let mut single = Self::default();
        for ix in set {
            single.push(ix, ix);
        }
        self.merge(&single)
    }

    /// How many indexes.
    pub fn total(&self) -> u32 {
        self.0.iter().map(|(first, last)| last - first + 1).sum()
    }

    pub fn has(&self, ix: u32) -> bool {
        let at = self.0.partition_point(|(_, last)| *last < ix);
        self.0.get(at).is_some_and(|(first, _)| *first <= ix)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many indexes of `rule` are also here.
    fn overlap(&self, rule: &Self) -> u32 {
        let mut count = 0;
        for (rf, rl) in &rule.0 {
            for (f, l) in &self.0 {
                let (lo, hi) = ((*f).max(*rf), (*l).min(*rl));
                if lo <= hi {
                    count += hi - lo + 1;
                }
            }
        }
        count
    }

    /// Whether every index of `rule` is here, or at least `count` of them
    /// (`matchSucceededIndexesRule`).
    pub fn covers(&self, rule: &Self, count: Option<u32>) -> bool {
        let contains = self.overlap(rule);
        contains == rule.total() || count.is_some_and(|c| contains >= c)
    }

    /// The first `count` indexes below `completions` that are not here.
    pub fn first_missing(&self, count: usize, completions: u32) -> Vec<u32> {
        let mut result = Vec::with_capacity(count);
        let mut candidate = 0;
        for (first, last) in &self.0 {
            while candidate < completions && result.len() < count && candidate < *first {
                result.push(candidate);
                candidate += 1;
            }
            candidate = candidate.max(last + 1);
        }
        while candidate < completions && result.len() < count {
            result.push(candidate);
            candidate += 1;
        }
        result
    }
}

/// `"1,3-5,7"`; two adjacent indexes as `"3,4"`, as kube-controller-manager writes them.
impl fmt::Display for Intervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (first, last)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{first}")?;
            if last == &(first + 1) {
                write!(f, ",{last}")?;
            } else if last > first {
                write!(f, "-{last}")?;
            }
        }
        Ok(())
    }
}

fn annotation<'p>(pod: &'p Pod, key: &str) -> Option<&'p str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The Pod's completion index, if it carries a valid one (`getCompletionIndex`).
pub fn completion_index(pod: &Pod) -> Option<u32> {
    annotation(pod, COMPLETION_INDEX)?.parse().ok()
}

/// A count annotation; missing, not a number or out of `int32` range counts as 0.
fn count_annotation(pod: &Pod, key: &str) -> u32 {
    annotation(pod, key)
        .and_then(|v| v.parse::<i64>().ok())
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| i32::try_from(*v).is_ok())
        .unwrap_or(0)
}

/// The index's counted failures before this Pod.
pub fn index_failure_count(pod: &Pod) -> u32 {
    count_annotation(pod, INDEX_FAILURE_COUNT)
}

/// The index's failures before this Pod, counted or ignored.
pub fn index_absolute_failure_count(pod: &Pod) -> u32 {
    index_failure_count(pod).saturating_add(count_annotation(pod, INDEX_IGNORED_FAILURE_COUNT))
}

/// The most characters of a `generateName` (`names.MaxGeneratedNameLength`): 63 less the
/// five random characters the apiserver appends.
const MAX_GENERATED_NAME: usize = 58;

/// `<job>-<index>-`, the Job's name cut so that it fits (`podGenerateNameWithIndex`).
pub fn generate_name_with_index(job: &str, index: u32) -> String {
    let suffix = format!("-{index}-");
    let prefix = format!("{job}{suffix}");
    if prefix.len() <= MAX_GENERATED_NAME {
        return prefix;
    }
    let mut keep = MAX_GENERATED_NAME - suffix.len();
    while !job.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}{suffix}", &job[..keep])
}
