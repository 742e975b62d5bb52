"""CTA pairs (Config.cluster_m / cluster_n, kernels/matmul/cluster.py) beside unpaired
tiles, weft's autotuned pick and cuBLAS, on the shapes where the unpaired kernel trails
cuBLAS (a row stride of 3000 elements, K of 5000, long K: there also split, unpaired and
paired) and on 4096^3.

    python3 -m benchmarks.matmul_clusters [--shapes 1000x3000x5000kn,4096x4096x4096kn] [--no-pick] [--only halves,pairM]
    python3 -m benchmarks.matmul_clusters --sanitize   # small pairs only: compute-sanitizer's workload

Per shape, every system's output is checked against a float32 torch reference (a wrong
or failing one is reported, not timed); then all are timed in ROUNDS interleaved rounds
by CUDA-graph replays of 10 calls (matmul_classes.py `_graph_ms`), each system's best
round kept. One table: TFLOP/s by graph time, and the ratio to cuBLAS (> 1: faster).
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.matmul_classes import _graph_ms, config_label

# (M, N, K, B layout): "kn" B [K, N] row-major; "nk" B = W.t() for W [N, K] (K-major).
SHAPES = [
    (1000, 3000, 5000, "kn"), (1024, 3072, 5120, "kn"), (1000, 3000, 5120, "kn"), (1024, 3072, 5000, "kn"),
    (1000, 3072, 5120, "kn"), (1024, 3000, 5120, "kn"), (1000, 3000, 5000, "nk"),
    (512, 512, 32768, "kn"), (768, 1024, 32768, "nk"), (4096, 4096, 4096, "kn"),
]
ROUNDS = 3
TOLERANCE = 2e-2  # max |error| / max |reference|, bf16 output


def candidates():
    """(label, Config): unpaired 128x256, 128x192 and 128x128 tiles, and pairs of each
    along M and along N with 3 and 4 stages (those that fit in shared memory); and 128x256
    tiles with 4 stages, unpaired and paired, their output staged half at a time
    (Config.staged_halves: the whole tile's staging leaves room for 3), and one pair of
    them with 3."""
    from weft.kernels.matmul import Config

    configs = [Config(128, 256, 64, 3, group_m=8), Config(128, 192, 64, 4, group_m=8), Config(128, 128, 64, 4, group_m=8)]
    for block_n in (256, 192, 128):
        for stages in (3, 4):
            for cluster_m, cluster_n in ((2, 1), (1, 2)):
                configs.append(Config(128, block_n, 64, stages, group_m=8, cluster_m=cluster_m, cluster_n=cluster_n))
    for cluster_m, cluster_n in ((1, 1), (2, 1), (1, 2)):
        configs.append(Config(128, 256, 64, 4, group_m=8, staged_halves=True, cluster_m=cluster_m, cluster_n=cluster_n))
    # Beside the 3-stage pair of whole tiles: what writing the tile in halves costs.
    configs.append(Config(128, 256, 64, 3, group_m=8, staged_halves=True, cluster_m=2))
    fitting = []
    for config in configs:
        try:
            config.check_fits(16, 16)
        except ValueError:
            continue
        fitting.append((_label(config), config))
    return fitting


def split_candidates(m: int, n: int, k: int, sm_count: int):
    """(label, Config) for long K (K >= LONG_K x max(M, N)): unpaired 128x128 tiles split
    with TMA adds, and pairs of 128x128 and 128x256 tiles split so that their (pair, part)
    units fill one or two waves of clusters (about half the SMs' count)."""
    from weft.kernels.matmul import Config
    from weft.kernels.matmul.config import LONG_K, _deepest, _tiles, split_for

    if k < LONG_K * max(m, n):
        return []
    k_steps = -(-k // 64)
    configs = [Config(128, 128, 64, 8, group_m=8, split_k=split_for(_tiles(m, n, 128, 128), k_steps, sm_count),
                      split_reduce="tma")]
    for block_n in (128, 256):
        for cluster_m, cluster_n in ((2, 1), (1, 2)):
            pairs = _tiles(m, n, 128 * cluster_m, block_n * cluster_n)
            for waves in (1, 2):
                parts = split_for(pairs, k_steps, sm_count // 2, waves)
                if parts > 1:
                    configs.append(Config(128, block_n, 64, 8, group_m=8, split_k=parts, split_reduce="tma",
                                          cluster_m=cluster_m, cluster_n=cluster_n))
    return [(_label(config), config) for config in dict.fromkeys(_deepest(c, 16, 16) for c in configs)]


def _label(config) -> str:
    pair = "" if config.cluster_m * config.cluster_n == 1 else f" pair{'M' if config.cluster_m == 2 else 'N'}"
    return config_label(config) + pair


def _operands(torch, m, n, k, layout, gen):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    return a, (b.t() if layout == "nk" else b.t().contiguous())


def _error(out, ref) -> float:
    return float(((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item())


def run(shapes, pick: bool, only: list[str] | None = None) -> int:
    import torch

    from weft.kernels.matmul import matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    wrong = 0
    print(f"{'M x N x K':>18} {'B':>3} {'system':<34} {'us':>8} {'TFLOP/s':>8} {'vs cuBLAS':>9} {'error':>8}", flush=True)
    for m, n, k, layout in shapes:
        a, b = _operands(torch, m, n, k, layout, gen)
        ref = a.float() @ b.float()
        systems = {"cuBLAS": lambda: torch.matmul(a, b)}
        if pick:
            systems["weft pick"] = lambda: matmul(a, b)
        sm_count = torch.cuda.get_device_properties(a.device).multi_processor_count
        for label, config in candidates() + split_candidates(m, n, k, sm_count):
            if only is None or any(part in label for part in only):
                systems[label] = lambda config=config: matmul(a, b, config=config)
        errors, timed = {}, {}
        for name, fn in systems.items():
            try:
                errors[name] = _error(fn(), ref)
            except Exception as failure:  # report it, time the others
                errors[name] = f"FAILED {type(failure).__name__}: {failure}"[:160]
                continue
            if errors[name] < TOLERANCE:
                timed[name] = fn
        best = {name: float("inf") for name in timed}
        for _ in range(ROUNDS):
            for name, fn in timed.items():
                best[name] = min(best[name], _graph_ms(torch, fn))
        shape = f"{m}x{n}x{k}"
        for name in systems:
            if name not in timed:
                wrong += 1
                error = errors[name]
                print(f"{shape:>18} {layout:>3} {name:<34} {error if isinstance(error, str) else f'WRONG {error:.2e}'}",
                      flush=True)
                continue
            tflops = 2 * m * n * k / (best[name] * 1e-3) / 1e12
            ratio = best["cuBLAS"] / best[name] if "cuBLAS" in best else float("nan")
            print(f"{shape:>18} {layout:>3} {name:<34} {1e3 * best[name]:8.1f} {tflops:8.0f} {ratio:9.3f} "
                  f"{errors[name]:8.1e}", flush=True)
    return wrong


def sanitize() -> int:
    """Small pairs of each direction and layout, with tails and a partner tile past the
    edge, each checked against torch: the workload for memcheck and racecheck."""
    import torch

    from weft.kernels.matmul import Config, matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    wrong = 0
    for m, n, k, layout in ((200, 300, 264, "kn"), (100, 136, 200, "nk"), (300, 520, 136, "kn")):
        a, b = _operands(torch, m, n, k, layout, gen)
        ref = a.float() @ b.float()
        for config in (Config(128, 128, 64, 2, cluster_m=2), Config(128, 128, 64, 2, cluster_n=2),
                       Config(128, 256, 64, 2, cluster_m=2), Config(64, 128, 64, 3, num_warps=4, cluster_n=2),
                       Config(128, 128, 64, 2, cluster_n=2, split_k=3, split_reduce="tma")):
            error = _error(matmul(a, b, config=config), ref)
            wrong += error >= TOLERANCE
            print(f"{m}x{n}x{k} {layout} {_label(config)}: "
                  f"max rel error {error:.2e} {'ok' if error < TOLERANCE else 'WRONG'}", flush=True)
    torch.cuda.synchronize()
    return wrong


def _parse_shape(text: str):
    layout = text[-2:]
    m, n, k = (int(x) for x in text[:-2].split("x"))
    return m, n, k, layout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", help="comma-separated MxNxK followed by kn or nk (default: all)")
    parser.add_argument("--no-pick", action="store_true", help="skip weft's autotuned pick (its tuning compiles "
                        "every candidate of the shape)")
    parser.add_argument("--only", help="comma-separated pieces of candidate labels: time only the candidates "
                        "whose label holds one (e.g. 'halves,s3 w8 g8 pairM')")
    parser.add_argument("--sanitize", action="store_true", help="run the small sanitizer workload only")
    args = parser.parse_args()
    if args.sanitize:
        return 1 if sanitize() else 0
    shapes = [_parse_shape(s) for s in args.shapes.split(",")] if args.shapes else SHAPES
    return 1 if run(shapes, not args.no_pick, args.only.split(",") if args.only else None) else 0


if __name__ == "__main__":
    sys.exit(main())
