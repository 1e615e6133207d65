//! Which replica runs a request (`serve --data-parallel N`), after SGLang's cache-aware
//! policy: a prompt whose leading blocks a replica ran recently goes to that replica (its
//! engine likely holds them in its prefix cache and computes only the rest), unless that
//! replica is much busier than the least loaded one; other prompts go to the least loaded
//! replica. Load is queued + running requests.
//!
//! What each replica ran is tracked approximately, without asking the engines: the chain
//! hashes of a prompt's whole blocks (the engine's block size and hashing, see
//! `host::engine::blocks::chain`) map to the replica that last ran them, in a map bounded by
//! the replicas' cache size (the oldest half dropped when it overflows). Since a block's hash
//! names its whole prefix, the deepest block of a prompt found in the map names a replica that
//! ran all of the prompt up to there.

use host::engine::blocks::chain;
use std::collections::HashMap;

/// When a cached prefix wins over load (SGLang: `cache_threshold`, `balance_abs_threshold`,
/// `balance_rel_threshold`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoutePolicy {
    /// The cached prefix must cover at least this fraction of the prompt.
    pub cache_threshold: f64,
    /// The replica holding the prefix is passed over when its load exceeds the least loaded
    /// replica's by more than this many requests...
    pub balance_abs: usize,
    /// ...and is more than this many times it.
    pub balance_rel: f64,
}

impl Default for RoutePolicy {
    fn default() -> RoutePolicy {
        RoutePolicy { cache_threshold: 0.5, balance_abs: 8, balance_rel: 1.5 }
    }
}

/// Why a replica was chosen (logged at debug level, counted in tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// There is one replica.
    Only,
    /// It ran the prompt's leading blocks.
    Prefix,
    /// Another replica ran the prefix but is much busier.
    Busy,
    /// No replica ran enough of the prompt: the least loaded one.
    Load,
}

/// A routing decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub replica: usize,
    /// Prompt tokens (whole blocks) the chosen replica is thought to hold, 0 unless `Prefix`.
    pub cached_tokens: usize,
    pub why: Why,
}

/// The images of a prompt, for the hashes: blocks from the one holding `first` (the first
/// image token's position) on are keyed by `key` too, as the engine keys them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Media {
    pub first: usize,
    pub key: u64,
}

pub struct Router {
    replicas: usize,
    /// Tokens per block (the engine's).
    block: usize,
    policy: RoutePolicy,
    /// Block chain hash → (replica that last ran it, when).
    owners: HashMap<u64, (usize, u64)>,
    /// Most entries kept.
    capacity: usize,
    /// Counts recorded blocks (each entry's age).
    tick: u64,
    /// Where the search for the least loaded replica starts: rotates with each choice by load,
    /// so that equal loads (idle replicas) take turns.
    turn: usize,
}

impl Router {
    /// A router over `replicas` replicas whose engines cache blocks of `block` tokens,
    /// remembering at most `capacity` blocks (at least 1,024).
    pub fn new(replicas: usize, block: usize, capacity: usize, policy: RoutePolicy) -> Router {
        Router { replicas: replicas.max(1), block: block.max(1), policy, owners: HashMap::new(), capacity: capacity.max(1024), tick: 0, turn: 0 }
    }

    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Blocks remembered now.
    pub fn remembered(&self) -> usize {
        self.owners.len()
    }

    /// The chain hashes of `prompt`'s whole blocks.
    fn hashes(&self, prompt: &[u32], media: Option<Media>) -> Vec<u64> {
        let mut parent = 0u64;
        prompt
            .chunks_exact(self.block)
            .enumerate()
            .map(|(k, toks)| {
                let salt = match media {
                    Some(m) if (k + 1) * self.block > m.first => m.key,
                    _ => 0,
                };
                parent = chain(parent ^ salt, toks);
                parent
            })
            .collect()
    }

    /// The least loaded replica, ties taking turns.
    fn least_loaded(&mut self, load: &[usize]) -> usize {
        let n = self.replicas;
        let start = self.turn % n;
        self.turn = self.turn.wrapping_add(1);
        (0..n).map(|i| (start + i) % n).min_by_key(|&r| load[r]).unwrap_or(0)
    }

    /// Picks the replica for `prompt` given each replica's `load` (queued + running; one entry
    /// per replica) and remembers that it runs the prompt's blocks.
    pub fn route(&mut self, prompt: &[u32], media: Option<Media>, load: &[usize]) -> Choice {
        debug_assert_eq!(load.len(), self.replicas);
        if self.replicas == 1 {
            return Choice { replica: 0, cached_tokens: 0, why: Why::Only };
        }
        let hashes = self.hashes(prompt, media);
        // 1. the deepest leading block some replica ran
        let mut owner = None;
        for (k, h) in hashes.iter().enumerate() {
            match self.owners.get(h) {
                Some(&(r, _)) if r < self.replicas => owner = Some((r, (k + 1) * self.block)),
                _ => break,
            }
        }
        // 2. there, unless too little of the prompt or that replica much busier
        let min = load.iter().copied().min().unwrap_or(0);
        let choice = match owner {
            Some((r, cached)) if cached as f64 >= self.policy.cache_threshold * prompt.len() as f64 => {
                if load[r] > min + self.policy.balance_abs && load[r] as f64 > self.policy.balance_rel * min as f64 {
                    Choice { replica: self.least_loaded(load), cached_tokens: 0, why: Why::Busy }
                } else {
                    Choice { replica: r, cached_tokens: cached, why: Why::Prefix }
                }
            }
            _ => Choice { replica: self.least_loaded(load), cached_tokens: 0, why: Why::Load },
        };
        // 3. its blocks are the chosen replica's now
        for h in hashes {
            self.tick += 1;
            self.owners.insert(h, (choice.replica, self.tick));
        }
        if self.owners.len() > self.capacity {
            let keep_after = self.tick.saturating_sub((self.capacity / 2) as u64);
            self.owners.retain(|_, &mut (_, t)| t > keep_after);
        }
        choice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(seed: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| seed.wrapping_mul(7919).wrapping_add(i * 31) % 150_000).collect()
    }

    fn router(n: usize) -> Router {
        Router::new(n, 16, 4096, RoutePolicy::default())
    }

    #[test]
    fn one_replica_takes_everything() {
        let mut r = router(1);
        assert_eq!(r.route(&prompt(1, 100), None, &[50]), Choice { replica: 0, cached_tokens: 0, why: Why::Only });
    }

    #[test]
    fn new_prompts_go_to_the_least_loaded_replica_and_ties_take_turns() {
        let mut r = router(3);
        assert_eq!(r.route(&prompt(1, 64), None, &[4, 1, 2]).replica, 1);
        assert_eq!(r.route(&prompt(2, 64), None, &[0, 3, 0]).why, Why::Load);
        let idle: Vec<usize> = (10..16).map(|s| r.route(&prompt(s, 64), None, &[0, 0, 0]).replica).collect();
        for k in 0..3 {
            assert!(idle.contains(&k), "idle replicas take turns: {:?}", idle);
        }
    }

    #[test]
    fn a_repeated_prompt_goes_where_its_prefix_is_cached() {
        let mut r = router(2);
        let long = prompt(3, 200);
        let first = r.route(&long, None, &[0, 0]).replica;
        // the same prompt, and one that extends it (a chat's next turn), follow it even
        // when the other replica is a little less busy
        let mut load = [0, 0];
        load[first] = 3;
        let again = r.route(&long, None, &load);
        assert_eq!((again.replica, again.why, again.cached_tokens), (first, Why::Prefix, 192));
        let mut next_turn = long.clone();
        next_turn.extend(prompt(4, 40));
        assert_eq!(r.route(&next_turn, None, &load).replica, first);
        // a prompt sharing less than half its length goes by load
        let mut other = long[..32].to_vec();
        other.extend(prompt(5, 200));
        assert_eq!(r.route(&other, None, &load), Choice { replica: 1 - first, cached_tokens: 0, why: Why::Load });
    }

    #[test]
    fn a_much_busier_replica_loses_its_prefix() {
        let mut r = router(2);
        let long = prompt(6, 160);
        assert_eq!(r.route(&long, None, &[0, 0]).replica, 0);
        // busier by 8 or less (the absolute threshold): the prefix wins
        assert_eq!(r.route(&long, None, &[10, 2]).why, Why::Prefix);
        // busier by more than 8 but less than 1.5 times: still the prefix
        assert_eq!(r.route(&long, None, &[28, 19]).why, Why::Prefix);
        // both: the least loaded replica, which now owns the blocks
        assert_eq!(r.route(&long, None, &[20, 2]), Choice { replica: 1, cached_tokens: 0, why: Why::Busy });
        assert_eq!(r.route(&long, None, &[0, 0]), Choice { replica: 1, cached_tokens: 160, why: Why::Prefix });
    }

    #[test]
    fn images_key_the_blocks_from_the_first_image_token_on() {
        let mut r = router(2);
        let p = prompt(7, 128);
        let (a, b) = (Some(Media { first: 40, key: 11 }), Some(Media { first: 40, key: 22 }));
        assert_eq!(r.route(&p, a, &[0, 0]).replica, 0);
        // the same text with other images shares only the blocks before the image (32 of 128
        // tokens): below the threshold, so it goes by load
        assert_eq!(r.route(&p, b, &[1, 0]), Choice { replica: 1, cached_tokens: 0, why: Why::Load });
        assert_eq!(r.route(&p, a, &[1, 1]), Choice { replica: 0, cached_tokens: 128, why: Why::Prefix });
    }

    #[test]
    fn the_map_stays_bounded_and_keeps_the_newest_blocks() {
        let mut r = Router::new(2, 16, 1024, RoutePolicy::default());
        for s in 0..400 {
            r.route(&prompt(100 + s, 160), None, &[0, 0]);
            assert!(r.remembered() <= 1024 + 10, "{} blocks remembered", r.remembered());
        }
        let last = prompt(100 + 399, 160);
        assert_eq!(r.route(&last, None, &[0, 0]).why, Why::Prefix, "the newest prompt is still known");
        assert_eq!(r.route(&prompt(100, 160), None, &[0, 0]).why, Why::Load, "the oldest is forgotten");
    }

    #[test]
    fn short_prompts_have_no_whole_block_and_go_by_load() {
        let mut r = router(2);
        let p = prompt(8, 10);
        r.route(&p, None, &[0, 0]);
        assert_eq!(r.route(&p, None, &[0, 1]), Choice { replica: 0, cached_tokens: 0, why: Why::Load });
        assert_eq!(r.route(&p, None, &[1, 0]).replica, 1);
    }
}
