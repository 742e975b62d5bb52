"""The emulation rule table: one function per op class, registered next to its op family.

A rule is `rule(cta, op) -> None`: it reads operands with `cta[value]` and binds results
with `cta.bind(value, x)`. `EMULATION_RULES` is the default table, filled by the op-family
modules when the package is imported; a test that needs an extra rule copies the table and
passes its copy to `emulate(..., rules=...)` instead of mutating the default.
"""

from __future__ import annotations

from typing import Callable

from .errors import EmulationError

Rule = Callable[..., None]


class RuleTable:
    def __init__(self, rules: dict | None = None):
        self._rules: dict[type, Rule] = dict(rules or {})

    def register(self, *op_types: type) -> Callable[[Rule], Rule]:
        """Decorator: `@RULES.register(ir.Binary)` makes the function the rule for Binary."""
        def decorate(rule: Rule) -> Rule:
            for op_type in op_types:
                self._rules[op_type] = rule
            return rule
        return decorate

    def lookup(self, op) -> Rule:
        for op_type in type(op).__mro__:
            rule = self._rules.get(op_type)
            if rule is not None:
                return rule
        raise EmulationError(
            f"the emulator has no rule for op `{op.NAME}` ({type(op).__name__}); register one "
            f"with RuleTable.register", op.loc)

    def copy(self) -> "RuleTable":
        return RuleTable(self._rules)

    def __contains__(self, op_type: type) -> bool:
        return op_type in self._rules

    def op_types(self) -> tuple[type, ...]:
        return tuple(self._rules)


EMULATION_RULES = RuleTable()
