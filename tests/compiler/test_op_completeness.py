"""Every op class the IR defines has a lowering rule in the backend's table and an
emulation rule in the emulator's, so an op added to compiler/ir without either fails
here by name rather than at the first kernel that uses it. Terminators (yield,
condition) are run by the op that holds their block, so they need neither; nor do
`tile`-stage ops (TILE_ONLY: dot), which a highlevel pass replaces before `layout`."""

import pytest

from weft.compiler import ir
from weft.compiler.backend import DEFAULT_RULES
from weft.runtime.emulator import EMULATION_RULES


def concrete_ops() -> list[type]:
    found, todo = [], [ir.Op]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not ir.Op and cls.__module__.startswith("weft.compiler.ir"):
            found.append(cls)
    return sorted(found, key=lambda cls: cls.NAME)


OPS = concrete_ops()


def test_the_ir_defines_the_ops_it_should():
    names = {cls.NAME for cls in OPS}
    assert len(names) == len(OPS), "two op classes share a NAME"
    assert {"reduce", "convert_layout", "warpgroup_mma", "warp_specialize", "yield"} <= names


@pytest.mark.parametrize("op_class", [cls for cls in OPS if not cls.TERMINATOR and not cls.TILE_ONLY],
                         ids=lambda cls: cls.NAME)
def test_every_op_has_a_lowering_and_an_emulation_rule(op_class):
    missing = [table for table, rules in (("backend (compiler/backend, @lowers)", DEFAULT_RULES),
                                          ("emulator (runtime/emulator, @RULES.register)", EMULATION_RULES))
               if op_class not in rules]
    assert not missing, f"{op_class.__name__} (`{op_class.NAME}`) has no rule in the {' or the '.join(missing)}"


@pytest.mark.parametrize("op_class", [cls for cls in OPS if cls.TERMINATOR], ids=lambda cls: cls.NAME)
def test_terminators_end_blocks_with_values(op_class):
    assert "values" in op_class.__dataclass_fields__


@pytest.mark.parametrize("op_class", [cls for cls in OPS if cls.TILE_ONLY], ids=lambda cls: cls.NAME)
def test_tile_only_ops_have_no_rules_to_drift(op_class):
    """A tile-only op that gained a rule is no longer tile-only: drop the flag instead."""
    assert op_class not in DEFAULT_RULES and op_class not in EMULATION_RULES
