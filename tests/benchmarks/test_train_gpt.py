"""benchmarks/train_gpt.py, the DDP training script of docs/training.md: it runs under
torchrun on CPU (gloo, SDPA attention: weft's attention on CPU tensors runs the emulator,
far too slow for CI), and its check fails when the two runs disagree. The 2-GPU run with
weft's attention is the lead's (docs/training.md)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_gpt.py"
TINY = ["--steps", "3", "--layers", "1", "--width", "64", "--heads", "1", "--seq", "32", "--batch", "1",
        "--vocab", "64"]


def _script():
    spec = importlib.util.spec_from_file_location("train_gpt", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_ranks_train_on_cpu_with_gloo():
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "benchmarks.train_gpt", "--attention", "sdpa", *TINY],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("2 ranks (gloo)")
    losses = [float(line.split()[1]) for line in lines[2:5]]
    assert all(3.0 < loss < 5.0 for loss in losses)  # near log(64) = 4.16 at the start
    assert "ms per step" in lines[5]


def test_the_check_names_each_disagreement():
    script = _script()
    args = script.parse(TINY)
    grads = [torch.ones(3), torch.full((2,), 2.0)]
    agreeing = {"weft": ([4.0, 3.9, 3.8], grads, 0.1), "sdpa": ([4.01, 3.9, 3.79], grads, 0.1)}
    assert script.compare(agreeing, args) == []
    off = [torch.ones(3), torch.tensor([2.0, 2.5])]
    disagreeing = {"weft": ([4.0, 3.5, float("nan")], off, 0.1), "sdpa": agreeing["sdpa"]}
    problems = script.compare(disagreeing, args)
    assert [p.split(":")[0] for p in problems] == ["step 2", "step 3", "gradients after step 1 differ by 0.25 (relative), more than 0.05"]
