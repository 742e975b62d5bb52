"""The exp unit's rate for ex2.approx.ftz.f32, ex2.approx.f16x2 and ex2.approx.ftz.bf16x2,
in results per clock per SM, from a kernel of eight independent chains per thread.

    python -m benchmarks.probe_exp_unit     (on the GPU machine; needs CuPy)

Asks whether packed 16-bit exps would relieve flash attention's exp unit at head_dim 64
(where it is as busy as the tensor cores): ptxas splits a packed ex2 into two MUFU.EX2
ops (cuobjdump), and this measures whether those run at twice the rate. They do not: the
three run at the same rate (docs/attention-journal.md has the measurement).
"""

from __future__ import annotations

SOURCE = r'''
extern "C" __global__ void chains(unsigned *out, int iters) {
    REG r[8];
    for (int i = 0; i < 8; i++) r[i] = INIT;
    for (int it = 0; it < iters; it++) {
        #pragma unroll
        for (int i = 0; i < 8; i++) asm volatile(OP " %0, %0;" : CONSTRAINT(r[i]));
    }
    unsigned acc = 0;
    for (int i = 0; i < 8; i++) acc ^= BITS(r[i]);
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;  // keeps the chains live
}
'''
# name: (PTX op, results per op, register type, initial value, asm constraint, bits of a register)
OPS = {
    "f32": ("ex2.approx.ftz.f32", 1, "float", "-1.0f - 0.001f * (threadIdx.x + i)", '"+f"', "__float_as_uint"),
    "f16x2": ("ex2.approx.f16x2", 2, "unsigned", "0x3c003c00u ^ (threadIdx.x * 77 + i)", '"+r"', ""),
    "bf16x2": ("ex2.approx.ftz.bf16x2", 2, "unsigned", "0x3f803f80u ^ (threadIdx.x * 77 + i)", '"+r"', ""),
}


def main() -> int:
    import cupy as cp
    import numpy as np

    device = cp.cuda.Device(0)
    sms = device.attributes["MultiProcessorCount"]
    clock = device.attributes["ClockRate"] * 1e3  # the maximum boost clock, Hz
    blocks, threads, iters, repeats = sms * 4, 512, 4096, 5
    for name, (op, per_op, reg, init, constraint, bits) in OPS.items():
        options = ("-arch=sm_90a", f"-DREG={reg}", f"-DINIT={init}", f'-DOP="{op}"',
                   f"-DCONSTRAINT={constraint}", f"-DBITS={bits}")
        kernel = cp.RawModule(code=SOURCE, options=options).get_function("chains")
        out = cp.zeros(blocks * threads, cp.uint32)
        kernel((blocks,), (threads,), (out, np.int32(iters)))  # warm-up and load
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(repeats):
            kernel((blocks,), (threads,), (out, np.int32(iters)))
        end.record()
        end.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, end) / 1e3 / repeats
        results = blocks * threads * iters * 8 * per_op
        print(f"{name:7s} {op:24s} {results / seconds / 1e12:7.2f} T results/s, "
              f"{results / seconds / sms / clock:6.2f} results/clk/SM at the {clock / 1e6:.0f} MHz maximum clock")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
