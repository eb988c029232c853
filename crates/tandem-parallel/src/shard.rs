//! Splitting a global batch into per-replica shards.

use std::ops::Range;

/// Cuts `len` samples into `parts` contiguous, disjoint shards whose sizes differ by at most
/// one (the first `len % parts` shards get the extra sample). Every sample lands in exactly
/// one shard; when `len < parts` the last shards are empty.
pub fn shard_ranges(len: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let (base, extra) = (len / parts, len % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let size = base + usize::from(i < extra);
            let range = start..start + size;
            start += size;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_sample_once() {
        for len in 0..20 {
            for parts in 1..5 {
                let shards = shard_ranges(len, parts);
                assert_eq!(shards.len(), parts);
                let covered: Vec<usize> = shards.iter().flat_map(|r| r.clone()).collect();
                assert_eq!(covered, (0..len).collect::<Vec<_>>());
                let sizes: Vec<usize> = shards.iter().map(|r| r.len()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            }
        }
    }
}
