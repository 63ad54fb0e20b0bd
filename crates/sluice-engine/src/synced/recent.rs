//! Keys a rule asked the store about lately, in fixed memory: two generations of a Bloom
//! filter, the older dropped once the newer has taken [`GENERATION_KEYS`] keys. A key spray
//! cannot make it grow, and can make a key look recent only by its false positives (about 1%
//! with both generations full).

use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const BITS: usize = 1 << 18;
const WORDS: usize = BITS / 64;
const HASHES: u64 = 3;
/// Keys a generation takes before the older one is cleared and reused.
pub(crate) const GENERATION_KEYS: usize = 16_384;

/// Two generations of 32 KiB each.
pub(crate) struct RecentKeys {
    generations: [Box<[AtomicU64]>; 2],
    current: AtomicUsize,
    inserted: AtomicUsize,
    /// Random per process: which bits a key sets cannot be worked out from the code.
    hasher: foldhash::fast::RandomState,
}

impl RecentKeys {
    pub(crate) fn new() -> Self {
        let generation = || (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        Self {
            generations: [generation(), generation()],
            current: AtomicUsize::new(0),
            inserted: AtomicUsize::new(0),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn bits(&self, key: &str) -> [usize; HASHES as usize] {
        let h = self.hasher.hash_one(key);
        let (h1, h2) = (h & 0xffff_ffff, (h >> 32) | 1);
        std::array::from_fn(|i| (h1.wrapping_add((i as u64).wrapping_mul(h2)) as usize) % BITS)
    }

    fn has(generation: &[AtomicU64], bits: &[usize]) -> bool {
        bits.iter()
            .all(|&b| generation[b / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0)
    }

    /// Whether `key` was inserted in this generation or the one before (or is a false
    /// positive).
    pub(crate) fn contains(&self, key: &str) -> bool {
        let bits = self.bits(key);
        self.generations.iter().any(|g| Self::has(g, &bits))
    }

    /// Remembers `key`. Racing inserts around a rotation may lose a key: it then looks new,
    /// which only costs it its priority.
    pub(crate) fn insert(&self, key: &str) {
        let bits = self.bits(key);
        let current = self.current.load(Ordering::Acquire);
        let generation = &self.generations[current];
        if Self::has(generation, &bits) {
            return;
        }
        for b in bits {
            generation[b / 64].fetch_or(1 << (b % 64), Ordering::Relaxed);
        }
        if self.inserted.fetch_add(1, Ordering::AcqRel) + 1 >= GENERATION_KEYS
            && self
                .current
                .compare_exchange(current, 1 - current, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            for word in self.generations[1 - current].iter() {
                word.store(0, Ordering::Relaxed);
            }
            self.inserted.store(0, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_remembered_for_one_to_two_generations_with_few_false_positives() {
        let recent = RecentKeys::new();
        recent.insert("alice");
        assert!(recent.contains("alice"));
        assert!(!recent.contains("bob"));
        for i in 0..GENERATION_KEYS - 1 {
            recent.insert(&format!("spray-{i}"));
        }
        assert!(recent.contains("alice"), "one generation later");
        // A key that looks inserted already (a false positive) does not count: a few more
        // than a generation's worth make sure of the second rotation.
        for i in 0..GENERATION_KEYS + 1000 {
            recent.insert(&format!("more-{i}"));
        }
        assert!(!recent.contains("alice"), "two generations later");
        let false_positives = (0..10_000)
            .filter(|i| recent.contains(&format!("new-{i}")))
            .count();
        assert!(false_positives < 300, "{false_positives} of 10,000");
    }
}
