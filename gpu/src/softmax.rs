//! Row softmax in one pass over the input for the normaliser (online max and sum), then one
//! pass writing the probabilities.
//!
//! # Parameters ([`SoftmaxParams`])
//! `x`, `y`: `[rows, n]` f32 (may alias). `-inf` entries get probability 0; an all `-inf` row
//! becomes all zeros.
//!
//! # Thread mapping
//! One block of `ROW_THREADS` (256) per row, grid = `rows`. Each thread keeps an
//! [`OnlineSoftmax`] state over its strided elements; states merge across the warp by shuffles
//! and across warps through a 64-float shared scratch.
//!
//! # Safety
//! The launcher validates sizes. All threads reach the barriers inside `block_softmax_state`.

use crate::math::OnlineSoftmax;
use crate::params::SoftmaxParams;
use crate::reduce::block_softmax_state;
use cuda_std::{kernel, shared_array, thread};

/// Softmax of each row of `x` into `y`. See the module docs.
#[kernel]
pub unsafe fn softmax_f32(p: SoftmaxParams) {
    let scratch = shared_array![f32; 64];
    let tid = thread::thread_idx_x() as usize;
    let step = thread::block_dim_x() as usize;
    let n = p.n as usize;
    let row = thread::block_idx_x() as usize;
    let x = (p.x as *const f32).add(row * n);
    let y = (p.y as *mut f32).add(row * n);
    let mut st = OnlineSoftmax::EMPTY;
    let mut i = tid;
    while i < n {
        st = st.push(*x.add(i));
        i += step;
    }
    let st = block_softmax_state(st, scratch);
    let mut i = tid;
    while i < n {
        *y.add(i) = st.prob(*x.add(i));
        i += step;
    }
}
