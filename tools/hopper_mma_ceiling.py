#!/usr/bin/env python3
"""Tensor-core throughput ceilings of one GPU, for issue 17's Hopper question: does `wgmma`
(sm_90a) give more than the `mma.sync` our compute_80 kernels use?

Two register/shared-only loops, no global traffic, written as PTX and loaded through the driver
(libcuda via ctypes: no toolkit, no Rust needed on the GPU machine):
- `mma_sync`: each warp runs 8 independent `mma.sync.m16n8k16` bf16 → f32 chains;
- `wgmma`: each warpgroup runs `wgmma.mma_async.m64n{N}k16` bf16 → f32 from shared-memory
  descriptors (sm_90a only), GROUP instructions per commit group.
Prints TFLOP/s of each (CUDA events, median of 5 after a warm-up). The data are whatever shared
memory and registers hold: throughput does not depend on values.

    python3 tools/hopper_mma_ceiling.py
"""
import ctypes
import statistics
import sys

cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]


def check(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: {r} {s.value.decode() if s.value else ''}")


MMA_ITERS = 4096
# dynamic shared memory of the wgmma kernel: A at 0, B at 8 KiB, room past both
SHARED = 32 * 1024
MMA_PTX = f"""
.version 7.0
.target sm_80
.address_size 64
.visible .entry mma_sync(.param .u64 out) {{
  .reg .b32 a<4>; .reg .b32 b<2>; .reg .f32 c<32>; .reg .u32 i; .reg .pred p; .reg .u64 o; .reg .u32 t;
  mov.u32 t, %tid.x;
  mov.b32 a0, t; mov.b32 a1, t; mov.b32 a2, t; mov.b32 a3, t; mov.b32 b0, t; mov.b32 b1, t;
""" + "".join(f"  mov.f32 c{j}, 0f00000000;\n" for j in range(32)) + f"""
  mov.u32 i, 0;
L:
""" + "".join(
    f"  mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{c{4*j}, c{4*j+1}, c{4*j+2}, c{4*j+3}}}, {{a0, a1, a2, a3}}, {{b0, b1}}, {{c{4*j}, c{4*j+1}, c{4*j+2}, c{4*j+3}}};\n"
    for j in range(8)) + f"""
  add.u32 i, i, 1;
  setp.lt.u32 p, i, {MMA_ITERS};
  @p bra L;
  ld.param.u64 o, [out];
  add.f32 c0, c0, c5; add.f32 c0, c0, c10; add.f32 c0, c0, c15; add.f32 c0, c0, c20; add.f32 c0, c0, c25; add.f32 c0, c0, c30;
  st.global.f32 [o], c0;
  ret;
}}
"""


def wgmma_ptx(n, group, iters):
    regs = n // 2  # f32 accumulators per thread: 64 x n / 128 threads
    acc = ", ".join(f"d{j}" for j in range(regs))
    body = "".join(f"  wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{acc}}}, da, db, p1, 1, 1, 0, 0;\n" for _ in range(group))
    return f"""
.version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 128 .b8 smem[];
.visible .entry wgmma(.param .u64 out) {{
  .reg .f32 d<{regs}>; .reg .b64 da; .reg .b64 db; .reg .u64 s; .reg .u32 i; .reg .pred p; .reg .pred p1; .reg .u64 o; .reg .u64 lo;
  mov.u64 s, smem;
  shr.u64 lo, s, 4;
  and.b64 lo, lo, 16383;
  // descriptors: start address >> 4, leading byte offset 128 (>> 4 = 8) at bit 16, stride byte
  // offset 256 (>> 4 = 16) at bit 32, no swizzle; B starts 8 KiB after A
  or.b64 da, lo, 524288;
  or.b64 da, da, 68719476736;
  add.u64 db, da, 512;
""" + "".join(f"  mov.f32 d{j}, 0f00000000;\n" for j in range(regs)) + f"""
  mov.u32 i, 0;
  setp.eq.u32 p1, i, 0;
L:
  wgmma.fence.sync.aligned;
{body}  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
  add.u32 i, i, 1;
  setp.lt.u32 p, i, {iters};
  @p bra L;
  ld.param.u64 o, [out];
  add.f32 d0, d0, d{regs - 1};
  st.global.f32 [o], d0;
  ret;
}}
"""


def load(ptx, name, shared=0):
    mod = ctypes.c_void_p()
    log = ctypes.create_string_buffer(8192)
    # CU_JIT_ERROR_LOG_BUFFER = 5, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
    opts = (ctypes.c_int * 2)(5, 6)
    vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(8192))
    r = cu.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(ptx.encode()), 2, opts, vals)
    if r != 0:
        raise RuntimeError(f"{name}: module load failed ({r}): {log.value.decode(errors='replace')}")
    f = ctypes.c_void_p()
    check(cu.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), "cuModuleGetFunction")
    if shared > 48 * 1024:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        check(cu.cuFuncSetAttribute(f, 8, shared), "cuFuncSetAttribute")
    return f


def time_kernel(f, grid, block, shared, out):
    arg = ctypes.c_uint64(out.value)
    args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    e0, e1 = ctypes.c_void_p(), ctypes.c_void_p()
    check(cu.cuEventCreate(ctypes.byref(e0), 0), "cuEventCreate")
    check(cu.cuEventCreate(ctypes.byref(e1), 0), "cuEventCreate")
    times = []
    for run in range(6):
        check(cu.cuEventRecord(e0, None), "cuEventRecord")
        check(cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, shared, None, args, None), "cuLaunchKernel")
        check(cu.cuEventRecord(e1, None), "cuEventRecord")
        check(cu.cuEventSynchronize(e1), "cuEventSynchronize")
        ms = ctypes.c_float()
        check(cu.cuEventElapsedTime(ctypes.byref(ms), e0, e1), "cuEventElapsedTime")
        if run > 0:
            times.append(ms.value)
    return statistics.median(times)


def main():
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, dev)
    sms, major = ctypes.c_int(), ctypes.c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev)  # MULTIPROCESSOR_COUNT
    cu.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    out = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(out), 4096), "cuMemAlloc")
    print(f"device: {name.value.decode()}, {sms.value} SMs, compute {major.value}.x")
    f = load(MMA_PTX, "mma_sync")
    for warps in (4, 8):
        for per_sm in (1, 2, 4):
            grid = sms.value * per_sm
            ms = time_kernel(f, grid, 32 * warps, 0, out)
            flop = grid * warps * MMA_ITERS * 8 * 16 * 8 * 16 * 2
            print(f"mma.sync m16n8k16 bf16: {grid} blocks x {warps} warps: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s")
    if major.value < 9:
        print("wgmma: needs compute 9.0 (sm_90a); not measured")
        return
    for n, group in ((128, 4), (128, 16), (256, 4), (256, 16)):
        iters = 4096 // group
        try:
            f = load(wgmma_ptx(n, group, iters), "wgmma", SHARED)
        except RuntimeError as e:
            print(f"wgmma m64n{n}k16: {e}")
            continue
        for per_sm in (1, 2):
            grid = sms.value * per_sm
            ms = time_kernel(f, grid, 128, SHARED, out)
            flop = grid * iters * group * 64 * n * 16 * 2
            print(f"wgmma m64n{n}k16 bf16 ({group} per group): {grid} warpgroups: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
