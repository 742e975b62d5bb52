"""rewrite.rewrite_block / rewrite_kernel on hand-built IR: a rule sees every op once,
nested blocks first, with those blocks already rewritten; what it returns (one op, several,
or none) takes the op's place; block arguments and everything the rule keeps stay as they
were; rewrite_kernel passes its keyword changes on to the kernel."""

from __future__ import annotations

from weft.compiler.ir import Binary, Block, Constant, For, If, Kernel, Value, Yield
from weft.compiler.passes.rewrite import rewrite_block, rewrite_kernel
from weft.compiler.types import i1, i32


def scalar(name: str) -> Value:
    return Value(i32, name)


def loop_kernel() -> tuple[Kernel, dict]:
    """k = 0; for i in range(n): k = k + i (then, if c: k * k); return k"""
    n, c = scalar("n"), Value(i1, "c")
    v = {name: scalar(name) for name in ("zero", "one", "i", "k", "sum", "sq", "branch", "out")}
    if_op = If(results=(v["branch"],), condition=c,
               then_body=Block((), (Binary(result=v["sq"], kind="mul", lhs=v["sum"], rhs=v["sum"]),
                                    Yield(values=(v["sq"],)))),
               else_body=Block((), (Yield(values=(v["sum"],)),)))
    body = Block((v["i"], v["k"]), (Binary(result=v["sum"], kind="add", lhs=v["k"], rhs=v["i"]), if_op,
                                   Yield(values=(v["branch"],))))
    ops = (Constant(result=v["zero"], value=0), Constant(result=v["one"], value=1),
           For(results=(v["out"],), lower=v["zero"], upper=n, step=v["one"], inits=(v["zero"],), body=body))
    return Kernel("loop", (n, c), Block((), ops), 4), v


def test_the_identity_rule_rebuilds_an_equal_kernel():
    kernel, _ = loop_kernel()
    assert rewrite_kernel(kernel, lambda op: op) == kernel


def test_the_rule_sees_nested_ops_first_and_each_op_once():
    kernel, _ = loop_kernel()
    seen = []
    rewrite_block(kernel.body, lambda op: seen.append(op.NAME) or op)
    assert seen == ["constant", "constant", "binary", "binary", "yield", "yield", "if", "yield", "for"]


def test_a_replacement_reaches_the_blocks_nested_inside():
    kernel, v = loop_kernel()

    def adds_to_subs(op):
        return Binary(result=op.result, kind="sub", lhs=op.lhs, rhs=op.rhs) if isinstance(op, Binary) else op
    loop = rewrite_kernel(kernel, adds_to_subs).body.ops[2]
    add, branch, _ = loop.body.ops
    assert (add.kind, add.lhs, add.rhs, add.result) == ("sub", v["k"], v["i"], v["sum"])
    assert branch.then_body.ops[0].kind == "sub"
    assert loop.body.args == (v["i"], v["k"]) and loop.results == (v["out"],)
    assert kernel.body.ops[2].body.ops[0].kind == "add"  # the input is not touched


def test_the_rule_sees_its_own_rewrites_of_the_nested_blocks():
    """The For the rule receives already holds the rewritten body."""
    kernel, _ = loop_kernel()
    bodies = []

    def rule(op):
        if isinstance(op, Binary) and op.kind == "mul":
            return ()
        if isinstance(op, For):
            bodies.append([inner.NAME for inner in op.body.walk()])
        return op
    rewrite_block(kernel.body, rule)
    assert bodies == [["binary", "if", "yield", "yield", "yield"]]


def test_a_rule_may_drop_an_op_or_put_several_in_its_place():
    kernel, v = loop_kernel()
    two = scalar("two")

    def rule(op):
        if isinstance(op, Constant) and op.value == 1:
            return (Constant(result=two, value=2), Binary(result=op.result, kind="sub", lhs=two, rhs=two))
        if isinstance(op, Constant):
            return []
        return op
    ops = rewrite_block(kernel.body, rule).ops
    assert [op.NAME for op in ops] == ["constant", "binary", "for"]
    assert ops[0].result is two and ops[1].result is v["one"]


def test_rewrite_kernel_passes_its_changes_to_the_kernel():
    kernel, _ = loop_kernel()
    rewritten = rewrite_kernel(kernel, lambda op: op, shared_bytes=4096)
    assert rewritten.shared_bytes == 4096 and kernel.shared_bytes == 0
    assert rewritten.params == kernel.params and rewritten.name == "loop"
