//! Memory access helpers written as inline PTX: 16-byte read-only global loads (the widest a
//! thread can issue), which the kernels that stream weights and the KV cache are built on.
//!
//! Loads and conversions are declared `pure` (and `readonly` / `nomem`), so the compiler may
//! schedule them like ordinary loads and arithmetic: without that, every inline-asm statement
//! keeps its place relative to the others, and a load could not be issued before the previous
//! load's value was converted — one memory latency per load. Fences and atomics stay ordered.

/// Four 32-bit words from global memory at `p` (16-byte aligned), through the read-only
/// (non-coherent) path: for data no kernel of the same launch writes.
#[inline(always)]
pub unsafe fn ld_nc_v4(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    core::arch::asm!(
        "ld.global.nc.v4.u32 {{{}, {}, {}, {}}}, [{}];",
        out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
        in(reg64) p,
        options(pure, readonly, nostack),
    );
    [a, b, c, d]
}

/// [`ld_nc_v4`] issued where it stands: not `pure`, so the compiler neither sinks it to its use
/// (past barriers) nor merges it with another load. For loads that must be in flight early.
#[inline(always)]
pub unsafe fn ld_nc_v4_now(p: *const u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    core::arch::asm!(
        "ld.global.nc.v4.u32 {{{}, {}, {}, {}}}, [{}];",
        out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d,
        in(reg64) p,
        options(readonly, nostack),
    );
    [a, b, c, d]
}

/// An f32 from global memory at `p` through L2 only (`ld.global.cg`): data another block of
/// the same launch wrote (after a fence), which this SM's L1 may not hold current.
#[inline(always)]
pub unsafe fn ld_cg(p: *const f32) -> f32 {
    let v: u32;
    core::arch::asm!("ld.global.cg.u32 {}, [{}];", out(reg32) v, in(reg64) p, options(pure, readonly, nostack));
    f32::from_bits(v)
}

/// Two f32 from global memory at `p` (8-byte aligned) through L2 only, as [`ld_cg`].
#[inline(always)]
pub unsafe fn ld_cg_f32x2(p: *const f32) -> [f32; 2] {
    let (x, y): (u32, u32);
    core::arch::asm!("ld.global.cg.v2.u32 {{{}, {}}}, [{}];", out(reg32) x, out(reg32) y, in(reg64) p, options(pure, readonly, nostack));
    [f32::from_bits(x), f32::from_bits(y)]
}

/// The shared-state-space address of a generic pointer into shared memory.
#[inline(always)]
pub unsafe fn shared_addr<T>(p: *const T) -> u64 {
    let s: u64;
    core::arch::asm!("cvta.to.shared.u64 {}, {};", out(reg64) s, in(reg64) p, options(pure, nomem, nostack));
    s
}

/// Four f32 from shared memory at shared-space address `a` (16-byte aligned). Not `pure`: the
/// data may have been written by other threads before a barrier, and the load must stay after it.
#[inline(always)]
pub unsafe fn ld_shared_f32x4(a: u64) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    core::arch::asm!("ld.shared.v4.f32 {{{}, {}, {}, {}}}, [{}];", out(reg32) x, out(reg32) y, out(reg32) z, out(reg32) w, in(reg64) a, options(readonly, nostack));
    [x, y, z, w]
}

/// Stores four 32-bit words to shared memory at shared-space address `a` (16-byte aligned).
#[inline(always)]
pub unsafe fn st_shared_v4(a: u64, v: [u32; 4]) {
    core::arch::asm!("st.shared.v4.b32 [{}], {{{}, {}, {}, {}}};", in(reg64) a, in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3], options(nostack));
}

/// Stores one f32 to shared memory at shared-space address `a`.
#[inline(always)]
pub unsafe fn st_shared_f32(a: u64, v: f32) {
    core::arch::asm!("st.shared.f32 [{}], {};", in(reg64) a, in(reg32) v, options(nostack));
}

/// A device-wide memory fence (`membar.gl`): this thread's earlier writes are visible to every
/// thread of the grid before its later ones.
#[inline(always)]
pub unsafe fn fence_device() {
    core::arch::asm!("membar.gl;");
}

/// Waits until the grids this one depends on have finished and their writes are visible
/// (programmatic dependent launch). The compute_80 PTX carries it as a comment the host turns
/// into `griddepcontrol.wait` when it loads the module on a compute 9.0 device, where a kernel
/// that has it is launched to overlap the one before (`host/src/kernels.rs`, `Ptx::text_for`).
/// Before it a kernel reads only what no kernel writes (weights); every read of another
/// kernel's output and every write comes after it.
#[inline(always)]
pub unsafe fn grid_dep_wait() {
    core::arch::asm!("// qwen3vl:griddepcontrol.wait", options(nostack));
}

/// Lets the next kernel in the stream launch once every block of this one has called it or
/// exited (its blocks then take the multiprocessors this one leaves and run up to their
/// [`grid_dep_wait`]; without it they launch when this kernel ends). A comment in the
/// compute_80 PTX, made `griddepcontrol.launch_dependents` as [`grid_dep_wait`] is. The GEMVs
/// call it after their dot products, before the epilogue: called at their start (after the
/// wait), the next kernel's blocks took multiprocessors while this one still streamed its
/// weights, and batch-1 decode (bf16, H200) fell from 678–681 to 631–637 tok/s; late it
/// measured 693–709.
#[inline(always)]
pub unsafe fn grid_dep_launch() {
    core::arch::asm!("// qwen3vl:griddepcontrol.launch_dependents", options(nostack));
}

/// Waits until every thread of every block of this thread-block cluster has arrived here: its
/// earlier shared-memory writes are then visible to the cluster ([`ld_cluster_f32x4`]), and no
/// block has left while another may still read its shared memory. sm_90 only: a comment in
/// the compute_80 PTX, made `barrier.cluster.arrive` / `wait` (release / acquire by default) as
/// [`grid_dep_wait`] is; a kernel that calls it launches only in clusters, on compute 9.0
/// (`host/src/cuda/module.rs`). Every thread must call it.
#[inline(always)]
pub unsafe fn cluster_sync() {
    core::arch::asm!("// qwen3vl:barrier.cluster.arrive.aligned;\n\t// qwen3vl:barrier.cluster.wait.aligned;", options(nostack));
}

/// The shared::cluster address of shared-space address `a` in the block of cluster rank
/// `rank` (`mapa`; sm_90 only, as [`cluster_sync`]).
#[inline(always)]
pub unsafe fn cluster_map(a: u64, rank: u32) -> u64 {
    let d: u64;
    core::arch::asm!("// qwen3vl:mapa.shared::cluster.u64 {}, {}, {};", out(reg64) d, in(reg64) a, in(reg32) rank, options(pure, nomem, nostack));
    d
}

/// Four f32 from a cluster block's shared memory at shared::cluster address `a` (16-byte
/// aligned; [`cluster_map`]; sm_90 only, as [`cluster_sync`]). Not `pure`: it must stay after
/// the cluster barrier.
#[inline(always)]
pub unsafe fn ld_cluster_f32x4(a: u64) -> [f32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    core::arch::asm!("// qwen3vl:ld.shared::cluster.v4.u32 {{{}, {}, {}, {}}}, [{}];", out(reg32) x, out(reg32) y, out(reg32) z, out(reg32) w, in(reg64) a, options(readonly, nostack));
    [f32::from_bits(x), f32::from_bits(y), f32::from_bits(z), f32::from_bits(w)]
}

/// Whether this block is the last of `blocks` blocks to arrive at `counter` (a u32 in global
/// memory, zero before the first of them arrives). Every thread's earlier global writes are
/// fenced first, so the last block sees them all (through L2: [`ld_cg`]). The last block puts
/// the counter back to zero at once (every block has arrived, and the next launch that uses it
/// starts after this one ends). Every thread of the block must call it (it has barriers).
#[inline(always)]
pub unsafe fn last_to_arrive(counter: *mut u32, blocks: usize) -> bool {
    let last = cuda_std::shared_array![u32; 1];
    fence_device();
    cuda_std::thread::sync_threads();
    if cuda_std::thread::thread_idx_x() == 0 {
        let is_last = atomic_inc(counter) as usize == blocks - 1;
        if is_last {
            *counter = 0;
        }
        *last = is_last as u32;
    }
    cuda_std::thread::sync_threads();
    let is_last = *last != 0;
    if is_last {
        fence_device();
    }
    is_last
}

/// `*p += 1` atomically in global memory; returns the old value.
#[inline(always)]
pub unsafe fn atomic_inc(p: *mut u32) -> u32 {
    let old: u32;
    core::arch::asm!("atom.global.add.u32 {}, [{}], 1;", out(reg32) old, in(reg64) p);
    old
}

/// Four f32 from global memory at `p` (16-byte aligned), read-only path.
#[inline(always)]
pub unsafe fn ld_nc_f32x4(p: *const f32) -> [f32; 4] {
    let w = ld_nc_v4(p as *const u32);
    [f32::from_bits(w[0]), f32::from_bits(w[1]), f32::from_bits(w[2]), f32::from_bits(w[3])]
}

/// Two f16 packed in a 32-bit word (low half first, as stored) widened to f32 with the
/// hardware conversion (exact).
#[inline(always)]
pub fn f16x2_to_f32(w: u32) -> (f32, f32) {
    let (a, b): (u32, u32);
    unsafe {
        core::arch::asm!(
            "{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, {w}; cvt.f32.f16 {a}, lo; cvt.f32.f16 {b}, hi; }}",
            w = in(reg32) w, a = out(reg32) a, b = out(reg32) b,
            options(pure, nomem, nostack),
        );
    }
    (f32::from_bits(a), f32::from_bits(b))
}

/// f32 narrowed to f16 bits, rounding to nearest even (the same bits as
/// `crate::math::f32_to_f16_bits`).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let h: u16;
    unsafe {
        core::arch::asm!("cvt.rn.f16.f32 {h}, {x};", h = out(reg16) h, x = in(reg32) x.to_bits(), options(pure, nomem, nostack));
    }
    h
}

/// Four f32 aligned to 16 bytes: the element of shared arrays read with vector loads
/// (`shared_array![F32x4; n / 4]`, then used as `*mut f32`).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct F32x4(pub [f32; 4]);

/// Two f32 aligned to 8 bytes: one 8-byte vector store (`*(p as *mut F32x2) = ...`).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct F32x2(pub [f32; 2]);

/// 8 bytes of packed 16-bit values, stored as one vector.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct U32x2(pub [u32; 2]);

/// 16 bytes of packed 16-bit values, stored as one vector.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct U32x4(pub [u32; 4]);

/// Four f32 at `p` (16-byte aligned) through a generic address: global memory or a shared
/// memory stage.
#[inline(always)]
pub unsafe fn ld_f32x4(p: *const f32) -> [f32; 4] {
    (*(p as *const F32x4)).0
}

/// A 16-byte vector of weights (4 × f32, 8 × f16 or 8 × bf16) and its dot product with f32
/// activations.
pub trait VecElem: Copy {
    /// Elements in 16 bytes.
    const PER_VEC: usize;
    /// `Σ w[e] · x[e]` over the vector's elements; `x` 16-byte aligned (global or shared).
    unsafe fn dot(w: [u32; 4], x: *const f32) -> f32;
}

impl VecElem for f32 {
    const PER_VEC: usize = 4;
    #[inline(always)]
    unsafe fn dot(w: [u32; 4], x: *const f32) -> f32 {
        let a = ld_f32x4(x);
        f32::from_bits(w[0]) * a[0] + f32::from_bits(w[1]) * a[1] + f32::from_bits(w[2]) * a[2] + f32::from_bits(w[3]) * a[3]
    }
}

impl VecElem for crate::math::Bf16 {
    const PER_VEC: usize = 8;
    #[inline(always)]
    unsafe fn dot(w: [u32; 4], x: *const f32) -> f32 {
        let (a, b) = (ld_f32x4(x), ld_f32x4(x.add(4)));
        let lo = |v: u32| f32::from_bits(v << 16);
        let hi = |v: u32| f32::from_bits(v & 0xffff_0000);
        let s0 = lo(w[0]) * a[0] + hi(w[0]) * a[1] + lo(w[1]) * a[2] + hi(w[1]) * a[3];
        let s1 = lo(w[2]) * b[0] + hi(w[2]) * b[1] + lo(w[3]) * b[2] + hi(w[3]) * b[3];
        s0 + s1
    }
}

impl VecElem for crate::math::F16 {
    const PER_VEC: usize = 8;
    #[inline(always)]
    unsafe fn dot(w: [u32; 4], x: *const f32) -> f32 {
        let (a, b) = (ld_f32x4(x), ld_f32x4(x.add(4)));
        let (w0, w1) = f16x2_to_f32(w[0]);
        let (w2, w3) = f16x2_to_f32(w[1]);
        let (w4, w5) = f16x2_to_f32(w[2]);
        let (w6, w7) = f16x2_to_f32(w[3]);
        (w0 * a[0] + w1 * a[1] + w2 * a[2] + w3 * a[3]) + (w4 * b[0] + w5 * b[1] + w6 * b[2] + w7 * b[3])
    }
}

/// An element of the KV cache: f32, or f16 (half the bytes; written rounded to nearest even,
/// read back exactly).
pub trait KvElem: Copy {
    unsafe fn store(p: *mut Self, x: f32);
    unsafe fn load(p: *const Self) -> f32;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: f32) {
        *p = x;
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        *p
    }
}

impl KvElem for crate::math::F16 {
    #[inline(always)]
    unsafe fn store(p: *mut Self, x: f32) {
        *p = crate::math::F16(f32_to_f16(x));
    }
    #[inline(always)]
    unsafe fn load(p: *const Self) -> f32 {
        f16x2_to_f32((*p).0 as u32).0
    }
}

/// Eight consecutive KV-cache elements (16-byte aligned) widened to f32: one 16-byte load of
/// f16, two of f32.
pub trait KvVec8: KvElem {
    unsafe fn load8(p: *const Self) -> [f32; 8];
}

impl KvVec8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> [f32; 8] {
        let (a, b) = (ld_nc_f32x4(p), ld_nc_f32x4(p.add(4)));
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
}

impl KvVec8 for crate::math::F16 {
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> [f32; 8] {
        let w = ld_nc_v4(p as *const u32);
        let (a, b) = f16x2_to_f32(w[0]);
        let (c, d) = f16x2_to_f32(w[1]);
        let (e, f) = f16x2_to_f32(w[2]);
        let (g, h) = f16x2_to_f32(w[3]);
        [a, b, c, d, e, f, g, h]
    }
}

/// `2^x` (`ex2.approx.ftz.f32`: relative error about 2^-22; `-inf` gives 0), the exponential of
/// the flash kernels, whose scores are pre-multiplied by log2(e).
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    let y: u32;
    unsafe {
        core::arch::asm!("ex2.approx.ftz.f32 {}, {};", out(reg32) y, in(reg32) x.to_bits(), options(pure, nomem, nostack));
    }
    f32::from_bits(y)
}

/// `c + Σ a[i] · b[i]` over the four signed bytes of `a` and `b` (`dp4a.s32.s32`, sm_61+):
/// the integer dot product of the quantized kernels (exact).
#[inline(always)]
pub fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    let d: i32;
    unsafe {
        core::arch::asm!("dp4a.s32.s32 {}, {}, {}, {};", out(reg32) d, in(reg32) a, in(reg32) b, in(reg32) c, options(pure, nomem, nostack));
    }
    d
}

/// `Σ dp4a` over four words: the dot product of 16 signed bytes with 16 signed bytes.
#[inline(always)]
pub fn dot16(a: [u32; 4], b: [u32; 4]) -> i32 {
    dp4a(a[3], b[3], dp4a(a[2], b[2], dp4a(a[1], b[1], dp4a(a[0], b[0], 0))))
}

/// `x · y` rounded to f32 (`mul.rn`, never fused into a later add) and then to the nearest
/// integer, ties to even (`cvt.rni`): the host's `nearest_int(x * y)` bit for bit.
#[inline(always)]
pub fn round_mul(x: f32, y: f32) -> i32 {
    let r: i32;
    unsafe {
        core::arch::asm!(
            "{{ .reg .f32 t; mul.rn.f32 t, {x}, {y}; cvt.rni.s32.f32 {r}, t; }}",
            x = in(reg32) x.to_bits(), y = in(reg32) y.to_bits(), r = out(reg32) r,
            options(pure, nomem, nostack),
        );
    }
    r
}

/// A 16-bit word from global memory at `p` (2-byte aligned), read-only path.
#[inline(always)]
pub unsafe fn ld_nc_u16(p: *const u16) -> u16 {
    let v: u16;
    core::arch::asm!("ld.global.nc.u16 {}, [{}];", out(reg16) v, in(reg64) p, options(pure, readonly, nostack));
    v
}

/// Two 32-bit words from global memory at `p` (8-byte aligned), read-only path.
#[inline(always)]
pub unsafe fn ld_nc_v2(p: *const u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    core::arch::asm!("ld.global.nc.v2.u32 {{{}, {}}}, [{}];", out(reg32) a, out(reg32) b, in(reg64) p, options(pure, readonly, nostack));
    [a, b]
}
