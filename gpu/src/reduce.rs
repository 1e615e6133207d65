//! Warp- and block-level reductions built on the NVVM shuffle intrinsic
//! (cuda_std 0.2.2 has no shuffle helpers).

use cuda_std::thread;

extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    fn shfl_bfly_f32(mask: u32, v: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.f32"]
    fn shfl_idx_f32(mask: u32, v: f32, lane: u32, clamp: u32) -> f32;
}

const FULL: u32 = 0xffff_ffff;

/// `v` from the lane whose id is this lane's xor `lane_mask`. Every lane of the warp must call it.
#[inline(always)]
pub fn shfl_xor(v: f32, lane_mask: u32) -> f32 {
    unsafe { shfl_bfly_f32(FULL, v, lane_mask, 0x1f) }
}

/// `v` from lane `src` (each lane may name its own). Every lane of the warp must call it.
#[inline(always)]
pub fn shfl_idx(v: f32, src: u32) -> f32 {
    unsafe { shfl_idx_f32(FULL, v, src, 0x1f) }
}

/// Sum over the 32 lanes of a warp; every lane gets the result.
#[inline(always)]
pub fn warp_sum(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        v += shfl_xor(v, m);
        m >>= 1;
    }
    v
}

/// Maximum over the 32 lanes of a warp; every lane gets the result.
#[inline(always)]
pub fn warp_max(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        let o = shfl_xor(v, m);
        if o > v {
            v = o;
        }
        m >>= 1;
    }
    v
}

/// Merge of online-softmax states over the 32 lanes of a warp; every lane gets the result.
#[inline(always)]
pub fn warp_softmax_state(mut s: crate::math::OnlineSoftmax) -> crate::math::OnlineSoftmax {
    let mut m = 16;
    while m > 0 {
        let other = crate::math::OnlineSoftmax { max: shfl_xor(s.max, m), sum: shfl_xor(s.sum, m) };
        s = s.merge(other);
        m >>= 1;
    }
    s
}

/// `op` over the whole block, each warp first reduced by `warp_op` (blockDim.x a multiple of
/// 32, at most 1024); every thread gets the result. `scratch` is shared memory of at least 32
/// floats. Every thread of the block must call it (it contains barriers); it leaves `scratch`
/// free for reuse.
#[inline(always)]
unsafe fn block_reduce(v: f32, scratch: *mut f32, warp_op: impl Fn(f32) -> f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let tid = thread::thread_idx_x() as usize;
    let warps = (thread::block_dim_x() / 32) as usize;
    let v = warp_op(v);
    if tid % 32 == 0 {
        *scratch.add(tid / 32) = v;
    }
    thread::sync_threads();
    let mut acc = *scratch;
    let mut i = 1;
    while i < warps {
        acc = op(acc, *scratch.add(i));
        i += 1;
    }
    thread::sync_threads();
    acc
}

/// Sum over the whole block; the contract of [`block_reduce`].
#[inline(always)]
pub unsafe fn block_sum(v: f32, scratch: *mut f32) -> f32 {
    block_reduce(v, scratch, warp_sum, |a, b| a + b)
}

/// Maximum over the whole block; the contract of [`block_reduce`].
#[inline(always)]
pub unsafe fn block_max(v: f32, scratch: *mut f32) -> f32 {
    block_reduce(v, scratch, warp_max, |a, b| if b > a { b } else { a })
}

/// Online-softmax merge over the whole block; same contract as [`block_sum`], with `scratch`
/// of at least 64 floats.
#[inline(always)]
pub unsafe fn block_softmax_state(
    s: crate::math::OnlineSoftmax,
    scratch: *mut f32,
) -> crate::math::OnlineSoftmax {
    let tid = thread::thread_idx_x() as usize;
    let warps = (thread::block_dim_x() / 32) as usize;
    let s = warp_softmax_state(s);
    if tid % 32 == 0 {
        *scratch.add(2 * (tid / 32)) = s.max;
        *scratch.add(2 * (tid / 32) + 1) = s.sum;
    }
    thread::sync_threads();
    let mut total = crate::math::OnlineSoftmax::EMPTY;
    let mut i = 0;
    while i < warps {
        total = total.merge(crate::math::OnlineSoftmax { max: *scratch.add(2 * i), sum: *scratch.add(2 * i + 1) });
        i += 1;
    }
    thread::sync_threads();
    total
}
