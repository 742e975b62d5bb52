"""kernels/attention backward on the GPU (marked gpu): dq, dk and dv against float32 torch
autograd of attention, across head dims, dtypes, causal masks, GQA/MQA, tails, both
layouts and both dQ accumulations (atomics, TMA reduce-add); and every kernel variant through ptxas for sm_90a with no spills (needs ptxas,
not a GPU)."""

import math

import pytest

from weft.compiler.backend import ptxas
from weft.kernels.attention import flash_attention, flash_attention_backward
from weft.kernels.attention.backward import flash_attention_backward_kernel
from weft.kernels.attention.backward_host import backward_constexprs, columns_split_config

from .attention_torch import random_attention_inputs, torch_gradients

needs_ptxas = pytest.mark.skipif(ptxas.find_ptxas() is None, reason="ptxas not found")
# (dq_reduce, pipelined) of the kernel's variants; the ones after the default run in bf16 only.
VARIANTS = [("tma", False), ("atomics", False), ("tma", True), ("atomics", True)]


def _variant_config(head_dim: int, dtype_name: str, dq_reduce: str, pipelined: bool):
    """head_dim's default config for the variant, or a skip: fp16 runs the default only,
    and head_dim 256's one-slot ring with dQ by TMA cannot pipeline."""
    if (dq_reduce, pipelined) != VARIANTS[0] and dtype_name in ("float16", "fp16"):
        pytest.skip("variants run in bf16 only")
    if pipelined and columns_split_config(head_dim, dq_reduce).stages < 2:
        pytest.skip("the pipelined walk needs two Q/dO slots")
    return columns_split_config(head_dim, dq_reduce, pipelined)


GPU_CASES = [
    # (batch, heads, kv_heads, seq_q, seq_k, head_dim, layout)
    (2, 4, 4, 1024, 1024, 64, "bhsd"),
    (2, 4, 4, 1024, 1024, 128, "bhsd"),
    (1, 4, 4, 1024, 1024, 256, "bhsd"),
    (1, 6, 2, 1000, 777, 128, "bhsd"),     # GQA, odd lengths, seq_q > seq_k
    (2, 4, 1, 333, 1111, 64, "bshd"),      # MQA, seq_q < seq_k
    (1, 4, 2, 517, 517, 256, "bshd"),      # GQA at 256, tails
    (1, 2, 2, 1, 513, 128, "bhsd"),        # a single query
    (1, 2, 2, 300, 100, 64, "bhsd"),       # causal: the first 200 rows see no key
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch, heads, kv_heads, seq_q, seq_k, head_dim, layout", GPU_CASES)
@pytest.mark.parametrize("dq_reduce, pipelined", VARIANTS)
def test_gpu_gradients_match_torch(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name,
                                   dq_reduce, pipelined):
    config = _variant_config(head_dim, dtype_name, dq_reduce, pipelined)
    check_gradients_on_the_gpu(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name,
                               config)


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [-0.2, 0.0, 0.5])
def test_gpu_softmax_scale_edge_cases(scale):
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, do = (torch.randn(1, 4, 300, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, 2, 400, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    out, lse = flash_attention(q, k, v, causal=True, softmax_scale=scale, return_lse=True)
    grads = flash_attention_backward(q, k, v, out, lse, do, causal=True, softmax_scale=scale)
    refs = torch_gradients(q, k, v, do, True, scale, "bhsd")
    for got, ref in zip(grads, refs):
        assert ((got.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item() <= 2e-2


def _compile(head_dim: int, dtype: str, causal: bool, launch: int, dq_reduce: str = "tma",
             pipelined: bool = False):
    """The main backward kernel of head_dim's default config for the variant, as the host
    launches it."""
    config = _variant_config(head_dim, dtype, dq_reduce, pipelined)
    dq = "*fp32" if dq_reduce == "atomics" else "tensordesc<fp32[1,1,64,64],swizzle=128>"
    box = lambda rows: f"tensordesc<{dtype}[1,1,{rows},64]>"  # noqa: E731
    signature = {"q_desc": box(config.block_m), "k_desc": box(config.block_n), "v_desc": box(config.block_n),
                 "do_desc": box(config.block_m), "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": dq,
                 "dk_ptr": f"*{dtype}", "dv_ptr": f"*{dtype}", "dkv_stride_b": "i32", "dkv_stride_h": "i32",
                 "dkv_stride_s": "i32", "softmax_scale": "fp32", "seq_q": "i32", "seq_k": "i32", "heads": "i32",
                 "kv_group": "i32"}
    return flash_attention_backward_kernel.compile(signature=signature,
                                                   constexprs=backward_constexprs(config, causal, launch),
                                                   num_warps=4, **config.launch_options())


@needs_ptxas
# fp16 builds the same kernel as bf16 but for the element type: in the slow set (CI time).
@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("launch", [0, 1])
# The columns split is no longer the default: its variants beyond dQ by TMA on the plain
# walk assemble in the slow set (CI time).
@pytest.mark.parametrize("dq_reduce, pipelined", [VARIANTS[0]] + [pytest.param(*v, marks=pytest.mark.slow)
                                                                 for v in VARIANTS[1:]])
def test_every_backward_variant_assembles_without_spills(head_dim, causal, dtype, launch, dq_reduce, pipelined):
    if launch >= columns_split_config(head_dim).launches:
        pytest.skip(f"head_dim {head_dim} takes one launch")
    if (dq_reduce, pipelined) != VARIANTS[0] and not causal:  # both compile masked and unmasked steps
        pytest.skip("variants assemble causal only")
    compiled = _compile(head_dim, dtype, causal, launch, dq_reduce, pipelined)
    ptx = compiled.asm["ptx"]
    dq_add = {"atomics": "red.relaxed.gpu.global.add.f32",
              "tma": "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"}
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor.4d", "mbarrier.try_wait", "setmaxnreg.inc",
                        "setmaxnreg.dec", "ex2.approx", "fence.proxy.async", dq_add[dq_reduce]):
        assert instruction in ptx, instruction
    assert dq_add["atomics" if dq_reduce == "tma" else "tma"] not in ptx
    # P and dS reach their GEMMs through shared memory: no register layout conversion.
    assert "convert_layout" not in compiled.asm["layout"]
    meta = compiled.metadata
    assert meta["spill_stores"] == 0 and meta["spill_loads"] == 0, meta
    assert meta["performance_warnings"] == []
    assert meta["total_warps"] == 4 * columns_split_config(head_dim).consumers + 4


def check_gradients_on_the_gpu(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, causal, dtype_name, config):
    """dq, dk and dv of flash_attention_backward with `config` against float32 torch
    autograd, on random inputs of the case (also test_attention_backward_keys.py's and
    _persistent.py's check)."""
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator(device="cuda").manual_seed(seq_q * 7 + seq_k + head_dim)
    q, k, v, do = random_attention_inputs(batch, heads, kv_heads, seq_q, seq_k, head_dim, layout, dtype, gen,
                                          with_output_grad=True)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True, layout=layout)
    grads = flash_attention_backward(q, k, v, out, lse, do, causal=causal, layout=layout,
                                     config=config)
    refs = torch_gradients(q, k, v, do, causal, 1.0 / math.sqrt(head_dim), layout)
    for name, got, ref, like in zip(("dq", "dk", "dv"), grads, refs, (q, k, v)):
        assert got.shape == like.shape and got.dtype == dtype, name
        assert torch.isfinite(got).all(), name
        error = ((got.float() - ref).norm() / ref.norm().clamp_min(1e-6)).item()
        assert error <= 2e-2, (name, error)
        worst = (got.float() - ref).abs().max().item()
        assert worst <= 5e-2 * max(ref.abs().max().item(), 1e-6), (name, worst)
