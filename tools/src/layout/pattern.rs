//! Type name patterns: exact names and globs.
//!
//! A pattern matches a type's full name (`ringfence_ring::sqe::Sqe`,
//! `alloc::vec::Vec<u8, alloc::alloc::Global>`, `rf_sample`). `*` matches
//! any run of characters, `::` included, and `?` matches one character;
//! anything else must match exactly. Whitespace is ignored on both sides, so
//! `Vec<u8,alloc::alloc::Global>` finds `Vec<u8, alloc::alloc::Global>`. A
//! leading C keyword (`struct rf_sample`) is dropped.

/// A type name or glob to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypePattern {
    /// The pattern as given.
    raw: String,
    /// The pattern without whitespace and without a leading C keyword.
    compact: Vec<char>,
    /// Whether it contains `*` or `?`.
    is_glob: bool,
}

impl TypePattern {
    /// Parses a pattern. Every string is a valid pattern.
    pub fn new(raw: &str) -> Self {
        let trimmed = raw.trim();
        let trimmed = ["struct ", "union ", "enum ", "class "]
            .iter()
            .find_map(|kw| trimmed.strip_prefix(kw))
            .unwrap_or(trimmed);
        let compact: Vec<char> = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
        let is_glob = compact.iter().any(|&c| c == '*' || c == '?');
        Self {
            raw: raw.to_owned(),
            compact,
            is_glob,
        }
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the pattern has wildcards (and so may match many types).
    pub fn is_glob(&self) -> bool {
        self.is_glob
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        let name: Vec<char> = name.chars().filter(|c| !c.is_whitespace()).collect();
        if self.is_glob {
            glob(&self.compact, &name)
        } else {
            self.compact == name
        }
    }

    /// Up to `limit` of `names` that look like what the pattern asks for,
    /// best first: same last path segment, then a segment that contains or
    /// is contained in the wanted one, then one within a small edit
    /// distance.
    pub fn near_matches<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        limit: usize,
    ) -> Vec<String> {
        let wanted = last_segment(&self.raw).to_lowercase();
        let wanted: String = wanted.chars().filter(|&c| c != '*' && c != '?').collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let mut scored: Vec<(usize, &str)> = names
            .into_iter()
            .filter_map(|name| {
                let segment = last_segment(name).to_lowercase();
                let score = if segment == wanted {
                    0
                } else if segment.contains(&wanted)
                    || (segment.len() >= 3 && wanted.contains(&segment))
                {
                    1
                } else {
                    let distance = edit_distance(&segment, &wanted);
                    if distance <= 2 && distance < wanted.len() {
                        1 + distance
                    } else {
                        return None;
                    }
                };
                Some((score, name))
            })
            .collect();
        scored.sort_unstable();
        scored.dedup_by(|a, b| a.1 == b.1);
        scored
            .into_iter()
            .take(limit)
            .map(|(_, name)| name.to_owned())
            .collect()
    }
}

/// The last `::` segment of a name, generic arguments removed:
/// `a::b::Vec<c::D>` gives `Vec`.
fn last_segment(name: &str) -> &str {
    let base = name.split('<').next().unwrap_or(name);
    base.rsplit("::").next().unwrap_or(base).trim()
}

/// Glob match of `pattern` (`*`, `?`) against all of `text`, iterative with
/// single-star backtracking: linear in practice, never exponential.
fn glob(pattern: &[char], text: &[char]) -> bool {
    let (mut p, mut t) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    p = sp + 1;
                    t = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&c| c == '*')
}

/// Levenshtein distance, for near-match suggestions only.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_ignore_whitespace_and_c_keywords() {
        let p = TypePattern::new("ringfence_ring::sqe::Sqe");
        assert!(!p.is_glob());
        assert!(p.matches("ringfence_ring::sqe::Sqe"));
        assert!(!p.matches("ringfence_ring::sqe::Sqe2"));
        assert!(!p.matches("x::ringfence_ring::sqe::Sqe"));
        let p = TypePattern::new("alloc::vec::Vec<u8,alloc::alloc::Global>");
        assert!(p.matches("alloc::vec::Vec<u8, alloc::alloc::Global>"));
        assert!(TypePattern::new("struct rf_sample").matches("rf_sample"));
    }

    #[test]
    fn globs_match_paths_and_generics() {
        let p = TypePattern::new("*::Sqe");
        assert!(p.is_glob());
        assert!(p.matches("ringfence_ring::sqe::Sqe"));
        assert!(!p.matches("ringfence_ring::sqe::SqeFlags"));
        assert!(!p.matches("Sqe"));
        let p = TypePattern::new("ringfence_ring::*");
        assert!(p.matches("ringfence_ring::layout::RegionHeader"));
        assert!(!p.matches("core::ringfence_ring::X"));
        let p = TypePattern::new("*Wrap<*>");
        assert!(p.matches("fixture::Wrap<u32>"));
        assert!(!p.matches("fixture::Wrap"));
        assert!(TypePattern::new("rf_?qe").matches("rf_sqe"));
        assert!(TypePattern::new("*").matches(""));
        assert!(TypePattern::new("a*b*c").matches("aXXbYYbZc"));
        assert!(!TypePattern::new("a*b*c").matches("aXXbYYbZ"));
    }

    #[test]
    fn glob_backtracking_stays_fast() {
        let text = "a".repeat(5_000);
        let p = TypePattern::new(&format!("{}b", "*a".repeat(20)));
        assert!(!p.matches(&text));
    }

    #[test]
    fn near_matches_rank_same_segment_first() {
        let names = [
            "ringfence_ring::sqe::Sqe",
            "ringfence_ring::cqe::Cqe",
            "ringfence_ring::value::SqeFlags",
            "core::option::Option<u8>",
        ];
        let p = TypePattern::new("ringfence::Sqe");
        assert_eq!(
            p.near_matches(names, 5),
            [
                "ringfence_ring::sqe::Sqe",
                "ringfence_ring::value::SqeFlags",
                "ringfence_ring::cqe::Cqe"
            ]
        );
        let p = TypePattern::new("ringfence_ring::cqe::Cqee");
        assert_eq!(p.near_matches(names, 1), ["ringfence_ring::cqe::Cqe"]);
        assert!(TypePattern::new("Zzzzzz").near_matches(names, 5).is_empty());
        assert!(TypePattern::new("*").near_matches(names, 5).is_empty());
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("sqe", "sqe"), 0);
        assert_eq!(edit_distance("sqe", "cqe"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
