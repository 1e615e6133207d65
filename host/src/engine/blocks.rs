//! The KV block allocator: fixed-size blocks of one pool, handed to sequences as they grow and
//! taken back when they finish, are cancelled or are preempted.

use crate::{Error, Result};

/// Free and used blocks of the paged KV cache (ids `0 .. total`).
pub struct BlockPool {
    free: Vec<u32>,
    total: usize,
}

impl BlockPool {
    /// A pool of `total` free blocks.
    pub fn new(total: usize) -> Result<BlockPool> {
        if total == 0 || total > u32::MAX as usize {
            return Err(Error::Limit { op: "KV blocks", msg: format!("a pool of {} blocks (at least 1)", total) });
        }
        // handed out lowest id first
        Ok(BlockPool { free: (0..total as u32).rev().collect(), total })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn free(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total - self.free.len()
    }

    /// One block, or `None` when all are in use.
    pub fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// `n` blocks, or none at all when fewer are free.
    pub fn take_n(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        Some((0..n).filter_map(|_| self.free.pop()).collect())
    }

    /// Gives blocks back.
    pub fn give(&mut self, blocks: &mut Vec<u32>) {
        debug_assert!(blocks.iter().all(|b| (*b as usize) < self.total && !self.free.contains(b)));
        self.free.extend(blocks.drain(..).rev());
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
}
