"""`matmul(a, b, out_dtype=None)`: C = A @ B on Hopper tensor cores, written in weft.lowlevel.

torch CUDA tensors run on the GPU (the config autotuned once per problem shape among
the candidates of its shape class, config.configs_for: one row (gemv.py, no tensor
cores), decode, few tiles, large; few tiles split K across CTAs, split_k.py and
split_k_tma.py; 128x192 tiles, two_piece.py, where they fill the SMs' waves better than
128x256 and 128x128 ones; stream-K, stream_k.py, where a tile shape's last wave is
partial: its tiles shared by K step among all CTAs). CTA pairs (cluster.py; given as
config=Config(cluster_m=2) or cluster_n=2, not among the autotuner's candidates): the two
CTAs of a cluster, on neighbouring tiles, load the B or A tile they share once, by TMA
multicast. Config(staged_halves=True) writes the tile through a half-tile buffer
(staged_halves.py), which leaves 128x256 tiles room for 4 ring stages. numpy arrays or CPU torch tensors run the same
kernels on the CPU emulator. Any M, N, K: TMA reads zeros past the edges; operands
whose rows do not start on 16 bytes are copied into rows that do. Split-K adds its
parts with fp32 atomics or TMA bulk reduce-add, so its last bits can vary between calls; under
torch.use_deterministic_algorithms(True) the autotuner picks no split-K config (stream-K
adds a tile's pieces in a fixed order, whichever finishes last: it stays).

    from weft.kernels.matmul import matmul
    c = matmul(a, b)                       # bf16/fp16 in, fp32 accumulate, a's dtype out
    c = matmul(a8, b8, out_dtype=torch.bfloat16)   # fp8 (e4m3/e5m2); b must be K-major

A is [M, K] with K contiguous. B is [K, N], either row-major (N contiguous) or K-major
(a transposed view of an [N, K] tensor, as torch._scaled_mm wants for fp8).
"""

from __future__ import annotations

from .config import Config, configs_for, shared_bytes
from .host import matmul, reference_matmul

__all__ = ["Config", "configs_for", "matmul", "reference_matmul", "shared_bytes"]
