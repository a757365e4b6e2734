//! The machine's limit: physical memory plus swap, from `/proc/meminfo`.

/// `MemTotal` and `SwapTotal` in bytes.
pub(super) fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let mut words = rest.split_whitespace();
            let n: u64 = words.next()?.parse().ok()?;
            match words.next() {
                Some("kB") => n.checked_mul(1024),
                None => Some(n),
                Some(_) => None,
            }
        })
    };
    (field("MemTotal"), field("SwapTotal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo() {
        let meminfo = "MemTotal:       24731184 kB\nMemFree:  1 kB\nSwapTotal:   0 kB\n";
        assert_eq!(parse_meminfo(meminfo), (Some(24731184 * 1024), Some(0)));
        assert_eq!(parse_meminfo("MemTotal: x kB\n"), (None, None));
    }
}
