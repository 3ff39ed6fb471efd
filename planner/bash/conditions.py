"""What the interpreter decides without running anything: `[ ... ]` / `[[ ... ]]` tests over
known strings, and integer arithmetic."""

from __future__ import annotations

import fnmatch


def arith_eval(expr: str) -> int | None:
    """Integer arithmetic over + - * // % and parentheses; None if it is not that (or divides
    by zero)."""
    import ast
    import operator as op
    ops = {ast.Add: op.add, ast.Sub: op.sub, ast.Mult: op.mul, ast.FloorDiv: op.floordiv, ast.Mod: op.mod}

    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            return -ev(n.operand) if isinstance(n.op, ast.USub) else ev(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in ops:
            b = ev(n.right)
            if isinstance(n.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                raise ZeroDivisionError
            return ops[type(n.op)](ev(n.left), b)
        raise ValueError
    try:
        return ev(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
        return None


def decide(vals):
    """[ ... ] / [[ ... ]] over known strings: -z -n = == != -eq -ne -lt -le -gt -ge, !, &&, ||.
    File tests (-f -d -e ...) cannot be known: None."""
    items = [v for v in vals if v not in (("op", "["), ("op", "]"), ("op", "[["), ("op", "]]"), ("op", "test"))]

    def one(seq):
        neg = False
        while seq and seq[0] == ("op", "!"):
            neg = not neg
            seq = seq[1:]
        r = decide_primary(seq)
        return None if r is None else (not r if neg else r)
    # split on && / || (-a / -o) left to right
    groups, ops, cur = [], [], []
    for v in items:
        if v in (("op", "&&"), ("op", "-a"), ("op", "||"), ("op", "-o")):
            groups.append(cur)
            ops.append("&&" if v[1] in ("&&", "-a") else "||")
            cur = []
        else:
            cur.append(v)
    groups.append(cur)
    result = one(groups[0])
    for o, g in zip(ops, groups[1:]):
        r = one(g)
        if o == "&&":
            result = False if (result is False or r is False) else (None if None in (result, r) else True)
        else:
            result = True if (result is True or r is True) else (None if None in (result, r) else False)
    return result


def decide_primary(seq):
    if len(seq) == 1:
        return seq[0][0] == "val" and seq[0][1] != ""
    if len(seq) == 2 and seq[0][0] == "op":
        o, v = seq[0][1], seq[1][1]
        if o == "-z":
            return v == ""
        if o == "-n":
            return v != ""
        return None          # -f, -d, -e, -v, ...: need the machine
    if len(seq) == 3 and seq[1][0] == "op":
        a, o, b = seq[0][1], seq[1][1], seq[2][1]
        if o in ("=", "=="):
            return fnmatch.fnmatchcase(a, b) if any(c in b for c in "*?[") else a == b
        if o == "!=":
            return a != b
        nums = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                "-gt": int.__gt__, "-ge": int.__ge__}
        if o in nums:
            try:
                return nums[o](int(a or 0), int(b or 0))
            except ValueError:
                return None
    return None
