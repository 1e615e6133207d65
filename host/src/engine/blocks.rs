//! The KV block allocator with a prefix cache: fixed-size blocks of one pool, handed to
//! sequences as they grow and taken back when they finish, are cancelled or are preempted.
//!
//! A block whose rows are all written can be registered under the hash of its tokens and of
//! every token before them ([`chain`]); a later sequence whose prompt starts the same way takes
//! it ([`BlockPool::lookup`]) instead of computing those keys and values again. Blocks are
//! reference-counted: a block no sequence holds any more stays cached while it is registered,
//! and is evicted (least recently released first) only when no never-used block is left.

use crate::{Error, Result};
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// The hash of a block of `tokens` following a prefix whose hash is `parent` (0 for the first
/// block): it names the block's whole prefix, so equal hashes mean equal keys and values.
pub fn chain(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// What a registered block holds, checked on every hit (a hash collision is then a miss).
struct Entry {
    hash: u64,
    parent: u64,
    tokens: Vec<u32>,
}

/// Free, cached and used blocks of the paged KV cache (ids `0 .. total`).
pub struct BlockPool {
    /// Blocks holding nothing anyone may ask for.
    free: Vec<u32>,
    total: usize,
    /// Sequences holding each block.
    refs: Vec<u32>,
    /// The registered content of each block.
    entry: Vec<Option<Entry>>,
    index: HashMap<u64, u32>,
    /// Registered blocks no sequence holds, by the tick they were released (oldest first).
    idle: BTreeMap<u64, u32>,
    /// The tick each idle block was released at (its key in `idle`).
    idle_at: Vec<u64>,
    tick: u64,
}

impl BlockPool {
    /// A pool of `total` free blocks.
    pub fn new(total: usize) -> Result<BlockPool> {
        if total == 0 || total > u32::MAX as usize {
            return Err(Error::Limit { op: "KV blocks", msg: format!("a pool of {} blocks (at least 1)", total) });
        }
        Ok(BlockPool {
            // handed out lowest id first
            free: (0..total as u32).rev().collect(),
            total,
            refs: vec![0; total],
            entry: (0..total).map(|_| None).collect(),
            index: HashMap::new(),
            idle: BTreeMap::new(),
            idle_at: vec![0; total],
            tick: 0,
        })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Blocks a sequence may take: never used, or cached and held by none.
    pub fn free(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Blocks sequences hold.
    pub fn used(&self) -> usize {
        self.total - self.free()
    }

    /// Registered blocks held by no sequence (kept for later prompts, evicted when needed).
    pub fn cached_idle(&self) -> usize {
        self.idle.len()
    }

    /// One block, or `None` when all are in use: a never-used one first, else the cached block
    /// released longest ago (its registration dropped).
    pub fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (&t, &b) = self.idle.iter().next()?;
                self.idle.remove(&t);
                if let Some(e) = self.entry[b as usize].take() {
                    self.index.remove(&e.hash);
                }
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }

    /// `n` blocks, or none at all when fewer are free.
    pub fn take_n(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free() {
            return None;
        }
        Some((0..n).filter_map(|_| self.take()).collect())
    }

    /// Gives blocks back: each is free again when no other sequence holds it (kept cached when
    /// registered).
    pub fn give(&mut self, blocks: &mut Vec<u32>) {
        for b in blocks.drain(..).rev() {
            let i = b as usize;
            debug_assert!(i < self.total && self.refs[i] > 0, "block {} given back but not held", b);
            self.refs[i] = self.refs[i].saturating_sub(1);
            if self.refs[i] > 0 {
                continue;
            }
            if self.entry[i].is_some() {
                self.tick += 1;
                self.idle.insert(self.tick, b);
                self.idle_at[i] = self.tick;
            } else {
                self.free.push(b);
            }
        }
    }

    /// The registered block of hash `hash` holding `tokens` after the prefix `parent`, taken
    /// (one more holder) when there is one.
    pub fn lookup(&mut self, hash: u64, parent: u64, tokens: &[u32]) -> Option<u32> {
        let b = *self.index.get(&hash)?;
        let i = b as usize;
        match &self.entry[i] {
            Some(e) if e.parent == parent && e.tokens == tokens => {}
            _ => return None,
        }
        if self.refs[i] == 0 {
            self.idle.remove(&self.idle_at[i]);
        }
        self.refs[i] += 1;
        Some(b)
    }

    /// Registers held block `b`, its rows all written, as holding `tokens` after the prefix
    /// `parent` (hash `hash`). Nothing happens when another block holds that content already or
    /// `b` is registered.
    pub fn register(&mut self, b: u32, hash: u64, parent: u64, tokens: &[u32]) {
        let i = b as usize;
        debug_assert!(self.refs[i] > 0);
        if self.entry[i].is_some() || self.index.contains_key(&hash) {
            return;
        }
        self.index.insert(hash, b);
        self.entry[i] = Some(Entry { hash, parent, tokens: tokens.to_vec() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_come_and_go_whole() {
        let mut p = BlockPool::new(4).unwrap();
        let mut a = p.take_n(3).unwrap();
        assert_eq!(a, vec![0, 1, 2]);
        assert!(p.take_n(2).is_none());
        assert_eq!(p.free(), 1);
        let mut b = vec![p.take().unwrap()];
        assert!(p.take().is_none());
        p.give(&mut a);
        assert!(a.is_empty());
        assert_eq!((p.free(), p.used()), (3, 1));
        p.give(&mut b);
        assert_eq!(p.free(), 4);
        assert!(BlockPool::new(0).is_err());
    }

    #[test]
    fn registered_blocks_are_shared_kept_and_evicted_oldest_first() {
        let mut p = BlockPool::new(3).unwrap();
        let (t0, t1) = ([1u32, 2], [3u32, 4]);
        let (h0, h1) = (chain(0, &t0), chain(chain(0, &t0), &t1));
        let mut a = p.take_n(2).unwrap();
        p.register(a[0], h0, 0, &t0);
        p.register(a[1], h1, h0, &t1);
        // a second holder of the first block; a wrong parent or tokens is a miss
        assert_eq!(p.lookup(h0, 0, &t0), Some(a[0]));
        assert_eq!(p.lookup(h0, 7, &t0), None);
        assert_eq!(p.lookup(h1, h0, &[3, 5]), None);
        let mut b = vec![a[0]];
        p.give(&mut a);
        // block 0 is still held by b, block 1 is idle and cached; block 2 never used
        assert_eq!((p.free(), p.used(), p.cached_idle()), (2, 1, 1));
        p.give(&mut b);
        assert_eq!((p.free(), p.used(), p.cached_idle()), (3, 0, 2));
        // a hit takes an idle block back
        let hit = p.lookup(h1, h0, &t1).unwrap();
        assert_eq!((p.free(), p.cached_idle()), (2, 1));
        // the never-used block goes first, then the idle one released longest ago
        assert_eq!(p.take(), Some(2));
        let evicted = p.take().unwrap();
        assert_ne!(evicted, hit);
        assert_eq!(p.lookup(h0, 0, &t0), None, "evicted");
        assert!(p.take().is_none());
        p.give(&mut vec![hit, evicted, 2]);
        assert_eq!((p.free(), p.cached_idle()), (3, 1));
    }
}
