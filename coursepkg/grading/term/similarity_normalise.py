"""The second signal of ``coursepkg similarity``: the code in a normal form, in which what does
not change the computation is made canonical or dropped, compared by token n-grams.

A student who hides a copy rewrites it without changing what it computes: names changed,
functions reordered, ``a + b`` turned into ``b + a``, ``x += y`` into ``x = x + y``,
``torch.softmax(s, dim=-1)`` into ``s.softmax(-1)``, lines added that do nothing. Dolos (the
first signal) sees past the renaming and the reordering, less past the rest. Here each answer
is parsed (:mod:`ast`) and put in a normal form:

* docstrings, comments, annotations, ``pass`` and statements that are a bare value dropped;
* dead code dropped: the branch of an ``if`` on a constant that never runs, ``while False``,
  what follows a ``return``/``raise``/``break``/``continue``, assignments inside a function to
  a name (or to an attribute of ``self``) that nothing reads;
* no-ops folded: ``x + 0``, ``x * 1``, ``x / 1``, ``x ** 1``, ``+x``, ``--x``, ``x = x``;
* one spelling each: ``x += y`` is ``x = x + y``, ``a > b`` is ``b < a``, ``torch.f(x, ...)``
  and ``F.f(x, ...)`` are ``x.f(...)`` (for tensor methods), ``torch.matmul(a, b)`` is
  ``a @ b``, ``view`` is ``reshape``, ``x.size(d)`` is ``x.shape[d]``, ``math.sqrt(d)`` is
  ``d ** 0.5``, a value used once right after it is named is written in place;
* the operands of ``+``, ``*``, ``==``, ``!=``, ``&``, ``|`` sorted (``a - b`` is ``a + -b``),
  by their form with every name the student chose made anonymous;
* every name the student defines (arguments, variables, functions, classes, attributes set on
  ``self``) is one token, ``ID``.

:func:`normal_similarity` is then the share of token n-grams two answers have in common
(Dice's coefficient over the sets of :data:`NGRAM`-grams, those of the template removed).
An answer that does not parse is compared by its tokens alone (no normal form).
"""

from __future__ import annotations

import ast
import builtins
import copy
import io
import keyword
import tokenize

__all__ = ["NGRAM", "fingerprints", "normal_form", "normal_similarity", "normal_tokens"]

#: The n-gram length (in tokens) of :func:`fingerprints`.
NGRAM = 8
_MODULES = {"torch", "F", "nn", "math", "np", "numpy", "functional"}
# functions of torch / torch.nn.functional that are also tensor methods: f(x, ...) == x.f(...)
_METHODS = set(
    "abs all any argmax argmin bmm clamp clone cos cumsum div exp expand flatten gather "
    "log log_softmax masked_fill matmul max mean min mul neg norm permute pow relu reshape "
    "rsqrt sigmoid sin softmax split sqrt square squeeze std sub sum tanh topk transpose tril "
    "triu unsqueeze var view where".split()
)
_COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
_FLIP = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}


def _is_const(node: ast.AST, value: object) -> bool:
    return (
        isinstance(node, ast.Constant)
        and type(node.value) in (int, float)
        and node.value == value
        and not isinstance(node.value, bool)
    )


def _anonymous(node: ast.AST) -> str:
    """A sort key for an operand that no renaming changes."""
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            n.id = "ID"
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ID":
            n.attr = "ID"
    return ast.dump(node, annotate_fields=False)


class _Spelling(ast.NodeTransformer):
    """One spelling for each way of writing the same computation (bottom-up)."""

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        self.generic_visit(node)
        load = copy.deepcopy(node.target)
        for n in ast.walk(load):
            if hasattr(n, "ctx"):
                n.ctx = ast.Load()
        value = self.visit_BinOp(ast.BinOp(load, node.op, node.value))
        return ast.copy_location(ast.Assign([node.target], value), node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        self.generic_visit(node)
        if node.value is None:
            return None
        return ast.copy_location(ast.Assign([node.target], node.value), node)

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.UAdd):
            return node.operand
        if isinstance(node.op, ast.USub | ast.Not) and isinstance(node.operand, ast.UnaryOp):
            if type(node.operand.op) is type(node.op):
                return node.operand.operand
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        left, op, right = node.left, node.op, node.right
        if isinstance(op, ast.Add | ast.Sub) and _is_const(right, 0):
            return left
        if isinstance(op, ast.Add) and _is_const(left, 0):
            return right
        if isinstance(op, ast.Mult | ast.Div | ast.FloorDiv | ast.Pow) and _is_const(right, 1):
            return left
        if isinstance(op, ast.Mult) and _is_const(left, 1):
            return right
        if isinstance(op, ast.Sub):  # a - b == a + -b
            op, right = ast.Add(), ast.UnaryOp(ast.USub(), right)
            if isinstance(right.operand, ast.UnaryOp) and isinstance(right.operand.op, ast.USub):
                right = right.operand.operand
        if not isinstance(op, _COMMUTATIVE):
            return node
        terms = _terms(left, op) + _terms(right, op)
        terms.sort(key=_anonymous)
        out = terms[0]
        for term in terms[1:]:
            out = ast.BinOp(out, copy.deepcopy(op), term)
        return out

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1:
            return node
        (op,), (right,) = node.ops, node.comparators
        left = node.left
        if type(op) in _FLIP:
            left, op, right = right, _FLIP[type(op)](), left
        symmetric = ast.Eq | ast.NotEq | ast.Is | ast.IsNot
        if isinstance(op, symmetric) and _anonymous(right) < _anonymous(left):
            left, right = right, left
        return ast.Compare(left, [op], [right])

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        return _canonical_call(node)


def _terms(node: ast.AST, op: ast.operator) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and type(node.op) is type(op):
        return _terms(node.left, op) + _terms(node.right, op)
    return [node]


def _module_call(func: ast.AST) -> str | None:
    """``f`` when ``func`` is ``torch.f``, ``F.f``, ``nn.functional.f`` or ``math.f``."""
    if not isinstance(func, ast.Attribute):
        return None
    base = func.value
    if isinstance(base, ast.Attribute):
        base = base.value if base.attr == "functional" else None
    return func.attr if isinstance(base, ast.Name) and base.id in _MODULES else None


def _canonical_call(node: ast.Call) -> ast.AST:
    name = _module_call(node.func)
    if name == "sqrt" and len(node.args) == 1 and not node.keywords:
        return ast.BinOp(node.args[0], ast.Pow(), ast.Constant(0.5))
    if name == "matmul" and len(node.args) == 2 and not node.keywords:
        return ast.BinOp(node.args[0], ast.MatMult(), node.args[1])
    if name in _METHODS and node.args and not isinstance(node.args[0], ast.Starred):
        node = ast.Call(ast.Attribute(node.args[0], name, ast.Load()), node.args[1:], node.keywords)
    func = node.func
    if not isinstance(func, ast.Attribute):
        return node
    if func.attr == "view":
        func.attr = "reshape"
    if func.attr == "size" and len(node.args) == 1 and not node.keywords:
        shape = ast.Attribute(func.value, "shape", ast.Load())
        return ast.Subscript(shape, node.args[0], ast.Load())
    if func.attr in ("transpose", "swapaxes") and len(node.args) == 2:
        func.attr = "transpose"
        node.args.sort(key=_anonymous)
    # a lone keyword given by name or by position: dim=-1 is -1
    if not node.args and len(node.keywords) == 1 and node.keywords[0].arg in ("dim", "axis"):
        node.args, node.keywords = [node.keywords[0].value], []
    return node


def _constant_truth(test: ast.AST) -> bool | None:
    if isinstance(test, ast.Constant):
        return bool(test.value)
    return None


def _dead_code(body: list[ast.stmt]) -> list[ast.stmt]:
    """``body`` without what never runs or does nothing (recursively)."""
    out: list[ast.stmt] = []
    for stmt in body:
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and (inner or field == "body"):  # a body is never empty
                setattr(stmt, field, _dead_code(inner))
        if isinstance(stmt, ast.If | ast.While) and _constant_truth(stmt.test) is not None:
            if isinstance(stmt, ast.While) and not _constant_truth(stmt.test):
                continue
            if isinstance(stmt, ast.If):
                out.extend(stmt.body if _constant_truth(stmt.test) else stmt.orelse)
                continue
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and not isinstance(stmt.value, ast.Call | ast.Await):
            continue  # a docstring, a bare name or value: nothing
        if isinstance(stmt, ast.Assert) and _constant_truth(stmt.test):
            continue
        if isinstance(stmt, ast.Assign) and _self_assign(stmt):
            continue
        out.append(stmt)
        if isinstance(stmt, ast.Return | ast.Raise | ast.Break | ast.Continue):
            break
    return out or [ast.Pass()]


def _self_assign(stmt: ast.Assign) -> bool:
    """``x = x`` (the same target and value)."""
    return len(stmt.targets) == 1 and _anonymous_exact(stmt.targets[0]) == _anonymous_exact(
        stmt.value
    )


def _anonymous_exact(node: ast.AST) -> str:
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if hasattr(n, "ctx"):
            n.ctx = ast.Load()
    return ast.dump(node, annotate_fields=False)


def _loads(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names read anywhere in ``tree``, and the attribute names read."""
    names = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)
    }
    attrs = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Store)
    }
    return names, attrs


def _unused(target: ast.AST, names: set[str], attrs: set[str]) -> bool:
    if isinstance(target, ast.Name):
        return target.id not in names
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return target.value.id == "self" and target.attr not in attrs
    if isinstance(target, ast.Tuple):
        return all(_unused(t, names, attrs) for t in target.elts)
    return False


def _drop_unused(tree: ast.Module) -> bool:
    """Drop assignments whose targets nothing reads; True when any was dropped."""
    names, attrs = _loads(tree)
    dropped = False
    inside = [n for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) for n in ast.walk(fn)]
    for node in inside:  # the module's own names may be read by the tests
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            kept = [
                s
                for s in body
                if not (
                    isinstance(s, ast.Assign) and all(_unused(t, names, attrs) for t in s.targets)
                )
            ]
            if len(kept) < len(body):
                dropped = True
                setattr(node, field, kept or [ast.Pass()])
    return dropped


def _inline_once(tree: ast.Module) -> None:
    """``v = e`` followed by a statement that reads ``v`` once, and nothing else reading or
    setting ``v`` in the function: ``e`` written in place of ``v``."""
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        counts: dict[str, int] = {}
        for n in ast.walk(fn):
            if isinstance(n, ast.Name):
                counts[n.id] = counts.get(n.id, 0) + 1
        body = fn.body
        i = 0
        while i < len(body) - 1:
            stmt, nxt = body[i], body[i + 1]
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)
                and counts.get(stmt.targets[0].id) == 2
                and _replace_name(nxt, stmt.targets[0].id, stmt.value)
            ):
                del body[i]
                continue
            i += 1


def _replace_name(stmt: ast.stmt, name: str, value: ast.AST) -> bool:
    for node in ast.walk(stmt):
        for field, child in ast.iter_fields(node):
            if isinstance(child, ast.Name) and child.id == name and isinstance(child.ctx, ast.Load):
                setattr(node, field, value)
                return True
            if isinstance(child, list):
                for j, item in enumerate(child):
                    if isinstance(item, ast.Name) and item.id == name:
                        if isinstance(item.ctx, ast.Load):
                            child[j] = value
                            return True
    return False


def _defined(tree: ast.AST) -> set[str]:
    """The names a student chose: arguments, assigned names, functions, classes, the
    attributes set on an object."""
    found = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            found.add(n.attr)
        elif isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            found.add(n.name)
    return found - {"self"} - set(dir(builtins))


def normal_form(code: str) -> str | None:
    """``code`` in the normal form (see the module's docstring), as Python text.

    Args:
        code: Python source (an answer, or several joined).

    Returns:
        The normal form (Python that compiles), or ``None`` when ``code`` does not parse or
        is nested too deep to walk.
    """
    try:
        tree = ast.parse(code)
        tree = _Spelling().visit(tree)
        tree.body = _dead_code(tree.body)
        for _ in range(4):  # what an unused assignment read may become unused in turn
            if not _drop_unused(tree):
                break
        _inline_once(tree)
        tree = _Spelling().visit(ast.fix_missing_locations(tree))
        return ast.unparse(ast.fix_missing_locations(tree))
    except (SyntaxError, ValueError, RecursionError):  # too deep to walk: compared as text
        return None


def normal_tokens(code: str) -> list[str]:
    """The tokens of ``code``'s normal form, every name the student chose written ``ID`` (the
    raw tokens, comments left out, when it does not parse)."""
    text = normal_form(code)
    try:
        chosen = _defined(ast.parse(text if text is not None else code))
    except (SyntaxError, ValueError):
        chosen = set()
    source = text if text is not None else code
    out: list[str] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.NAME and tok.string in chosen:
                out.append("ID")
            elif tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                out.append(tok.string)
            else:
                out.append(tok.string if tok.type != tokenize.NEWLINE else "\n")
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # what was read so far
    return out


def fingerprints(code: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The set of token ``n``-grams of ``code``'s normal form."""
    tokens = [t for t in normal_tokens(code) if t.strip()]
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def normal_similarity(sources: dict[str, str], template: str = "") -> dict[tuple[str, str], float]:
    """The normal-form similarity of every pair of ``sources`` that shares an n-gram.

    Args:
        sources: the code of each student, by label.
        template: code everyone was given; its n-grams never count.

    Returns:
        {(left, right): Dice's coefficient of the two n-gram sets, in [0, 1]}, with ``left``
        before ``right`` in the order of ``sources``.
    """
    given = fingerprints(template) if template.strip() else set()
    prints = {label: fingerprints(code) - given for label, code in sources.items()}
    holders: dict[tuple[str, ...], list[str]] = {}
    for label, grams in prints.items():
        for gram in grams:
            holders.setdefault(gram, []).append(label)
    shared: dict[tuple[str, str], int] = {}
    for labels in holders.values():
        for i, left in enumerate(labels):
            for right in labels[i + 1 :]:
                shared[(left, right)] = shared.get((left, right), 0) + 1
    return {
        pair: 2 * k / (len(prints[pair[0]]) + len(prints[pair[1]])) for pair, k in shared.items()
    }
