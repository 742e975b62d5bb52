"""Signature strings of TMA descriptors and where TMA places a box in shared memory."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from weft.compiler.types import (PointerType, ScalarType, TensorDescriptorType, bf16, fp32,
                                 parse_signature_type, parse_tensor_descriptor_signature,
                                 tensor_descriptor_signature, tensor_descriptor_swizzle,
                                 tensor_descriptor_type, tma_box_layout)
from weft.layouts import nvmma_shared


def test_scalar_and_pointer_signatures_are_unchanged():
    assert parse_signature_type("*fp32") == PointerType(fp32)
    assert parse_signature_type("i32") == ScalarType("i32")


@pytest.mark.parametrize("text, element, block, swizzle", [
    ("tensordesc<bf16[128,64]>", bf16, (128, 64), 128),
    ("tensordesc<bf16[128,64],swizzle=128>", bf16, (128, 64), 128),
    (" tensordesc< fp32 [ 64 , 8 ] , swizzle = 32 > ", fp32, (64, 8), 32),
    ("tensordesc<fp8e4m3[64,128]>", ScalarType("fp8e4m3"), (64, 128), 128),
    ("tensordesc<fp16[16,8]>", ScalarType("fp16"), (16, 8), 0),
    ("tensordesc<i32[256]>", ScalarType("i32"), (256,), 0),
    ("tensordesc<bf16[2,8,64]>", bf16, (2, 8, 64), 128),
])
def test_parse_descriptor_signatures(text, element, block, swizzle):
    type_ = parse_signature_type(text)
    assert isinstance(type_, TensorDescriptorType)
    assert (type_.element, type_.block_shape, tensor_descriptor_swizzle(type_)) == (element, block, swizzle)
    if len(block) > 1:
        assert type_.layout == nvmma_shared(block, swizzle, element.bits)
    assert type_.encoding is None  # a signature names a swizzle, not a layout description
    canonical = tensor_descriptor_signature(element, block, swizzle)
    assert parse_signature_type(canonical) == type_
    assert parse_tensor_descriptor_signature(canonical) == (element, block, swizzle)


@pytest.mark.parametrize("text, message", [
    ("tensordesc<bf16[128 64]>", "bad tensor descriptor signature"),
    ("tensordesc<bf16[]>", "bad tensor descriptor signature"),
    ("tensordesc<bf16[8,64],swizzle=128", "bad tensor descriptor signature"),
    ("tensordesc<bf17[8,64]>", "unknown scalar type 'bf17'"),
    ("tensordesc<i1[8,64]>", "TMA cannot move i1 elements"),
    ("tensordesc<bf16[8,64],swizzle=16>", r"swizzle 16 must be one of \(0, 32, 64, 128\)"),
    ("tensordesc<bf16[1,1,1,1,1,8]>", "a TMA box has 1 to 5 dims, got 6"),
    ("tensordesc<bf16[8,512]>", r"block_shape\[1\] = 512 must be an int from 1 to 256"),
    ("tensordesc<bf16[12,64]>", r"block_shape\[0\] = 12 must be a power of two"),
    ("tensordesc<bf16[8,4]>", "the inner box dim holds 8 bytes; TMA needs a multiple of 16"),
    ("tensordesc<bf16[64,32],swizzle=128>", r"64 bytes, but with swizzle 128 .* use block_shape\[-1\] = 64"),
    ("tensordesc<bf16[64,16],swizzle=64>", r"32 bytes, but with swizzle 64 .* or swizzle 32$"),
    ("tensordesc<bf16[4,32],swizzle=128>", "or swizzle 64 with at least 8 box rows"),
    ("tensordesc<bf16[4,64],swizzle=128>", "shape \\[4, 64\\] has 4 rows"),
    ("tensordesc<bf16[64],swizzle=128>", "a rank-1 box cannot be swizzled"),
])
def test_bad_descriptor_signatures(text, message):
    with pytest.raises(ValueError, match=message):
        parse_signature_type(text)


def _tma_offsets(block_shape, swizzle, element_bytes):
    """Brute force: the element offset TMA stores each box coordinate at (row-major, then
    byte-address bits [4, 7) XOR bits [7, 10) masked to the swizzle's width)."""
    k = {0: 0, 32: 1, 64: 2, 128: 3}[swizzle]
    mask = ((1 << k) - 1) << 4
    offsets = {}
    for coords in itertools.product(*(range(s) for s in block_shape)):
        address = int(np.ravel_multi_index(coords, block_shape)) * element_bytes
        offsets[coords] = (address ^ ((address >> 3) & mask)) // element_bytes
    return offsets


@pytest.mark.parametrize("block_shape, swizzle, bits", [
    ((8, 64), 128, 16), ((16, 32), 64, 16), ((8, 16), 32, 16), ((16, 32), 128, 32),
    ((32, 128), 128, 8), ((4, 4, 16), 128, 64), ((8, 8), 0, 16), ((64,), 0, 32),
])
def test_tma_box_layout_matches_the_hardware_swizzle(block_shape, swizzle, bits):
    layout = tma_box_layout(block_shape, swizzle, bits)
    for coords, offset in _tma_offsets(block_shape, swizzle, bits // 8).items():
        assert layout(offset=offset, block=0) == coords


def test_valid_boxes_land_in_their_nvmma_layout():
    """Every box the rules accept is placed by TMA exactly as nvmma_shared says."""
    for element, rank, swizzle in itertools.product(("fp8e4m3", "bf16", "fp32", "i64"), (2, 3),
                                                    (None, 0, 32, 64, 128)):
        for block in itertools.product((1, 2, 8, 16, 64, 256), repeat=rank):
            try:
                type_ = tensor_descriptor_type(ScalarType(element), block, swizzle)
            except ValueError as error:
                assert "not the NVMMA layout" not in str(error)
                continue
            bits = type_.element.bits
            swz = tensor_descriptor_swizzle(type_)
            assert type_.layout == tma_box_layout(block, swz, bits) == nvmma_shared(block, swz, bits)
