"""Probe on the GPU: TMA loads and stores of a [64, 64] box at negative row coordinates
(tile mode), each case in its own process (a trap poisons the CUDA context). Measured on
the H200 (docs/attention-journal.md): loads there read zeros, a store there traps with "illegal
instruction", even partly inside; the emulator refuses such stores.

    python3 -m benchmarks.probe_tma_negative      (from the repository root)
"""
import subprocess
import sys

CASE = """
import numpy as np, torch
from weft import lowlevel as ll
from weft.lowlevel import mbarrier, tma
from weft.runtime.tensor_descriptor import TensorDescriptor

@ll.jit
def shifted_copy(src, dst, dy, ds):
    smem = ll.allocate_shared_memory(src.dtype, src.block_shape, src.layout)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, src.nbytes)
    tma.async_copy_global_to_shared(src, [dy, 0], bar, smem)
    mbarrier.wait(bar, 0)
    tma.async_copy_shared_to_global(dst, [ds, 0], smem)
    tma.store_wait(0)
    mbarrier.invalidate(bar)

x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float16)
src = torch.from_numpy(x).cuda(); dst = torch.zeros_like(src)
layout = ll.NVMMASharedLayout(128, 16)
a = TensorDescriptor.from_tensor(src, [64, 64], layout)
b = TensorDescriptor.from_tensor(dst, [64, 64], layout)
dy, ds = DY, DS
shifted_copy[(1,)](a, b, dy, ds)
torch.cuda.synchronize()
out = dst.cpu().numpy()
box = np.zeros((64, 64), np.float16)
for r in range(64):
    if 0 <= dy + r < 128: box[r] = x[dy + r]
want = np.zeros_like(x)
for r in range(64):
    if 0 <= ds + r < 128: want[ds + r] = box[r]
print("OK" if np.array_equal(out, want) else "WRONG")
"""
for dy, ds in [(0, 0), (-32, 0), (-64, 0), (-100, 0), (0, -32), (0, -64), (-32, -32)]:
    path = f"/tmp/tma_case_{dy}_{ds}.py"
    open(path, "w").write(CASE.replace("DY", str(dy)).replace("DS", str(ds)))
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=120)
    tail = (r.stdout + r.stderr).strip().splitlines()
    print(f"load row {dy:5d} store row {ds:5d}: rc {r.returncode} {tail[-1] if tail else ''}", flush=True)
