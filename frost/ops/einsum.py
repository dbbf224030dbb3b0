"""einsum in PyTorch's forms (an equation string with '...', implicit output and repeated subscripts for diagonals, or
operands interleaved with sublists), forward and backward together."""
from __future__ import annotations

import string
from dataclasses import dataclass

from frost.tensor import Tensor, from_op

LETTERS = string.ascii_letters  # PyTorch's subscripts; also the labels handed to the array module's einsum
ELLIPSIS_LABEL = len(LETTERS)  # the ellipsis' dims get labels ELLIPSIS_LABEL, ELLIPSIS_LABEL + 1, ... (right-aligned)


@dataclass
class _Equation:
    inputs: list  # per operand, its labels (ints) as written, with the ellipsis expanded and repeats kept
    output: list  # the output's labels
    sizes: dict  # label -> its size after broadcasting dims of size 1


def einsum(equation, *operands) -> Tensor:
    """Sums of products over the subscripts of `equation`, as torch.einsum: 'ij,jk->ik', '...ij->...ji', 'ii->i',
    'bij,bjk' (implicit output: the subscripts used once, in ASCII order, after the ellipsis' dims). Operands come
    after the equation, or as one list, or interleaved with sublists: einsum(a, [0, 1], b, [1, 2], [0, 2])."""
    if not isinstance(equation, str):
        equation, operands = _from_sublists((equation,) + operands)
    elif len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    _check_operands(operands)
    eq = _parse(equation.replace(" ", ""), operands)
    xp = operands[0].xp
    canonical = [_diagonal(xp, t.data, labels) for t, labels in zip(operands, eq.inputs)]
    out = _contract(xp, eq, [(a, _unique(labels)) for a, labels in zip(canonical, eq.inputs)], eq.output)

    def backward(g):
        return [_operand_grad(xp, eq, canonical, g, k, t) for k, t in enumerate(operands)]
    return from_op(out, operands, backward, "einsum")


def _check_operands(operands) -> None:
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    if not all(isinstance(t, Tensor) for t in operands):
        raise TypeError(f"einsum(): operands must be tensors, got {[type(t).__name__ for t in operands]}")
    dtypes, devices = {t.dtype for t in operands}, {str(t.device) for t in operands}
    if len(dtypes) > 1:
        raise RuntimeError(f"einsum(): operands must have one dtype, got {[t.dtype.name for t in operands]} "
                           f"(cast them first, as PyTorch asks too)")
    if len(devices) > 1:
        raise RuntimeError(f"einsum(): operands are on different devices: {sorted(devices)}")


def _from_sublists(args: tuple):
    """(equation, operands) from einsum(op0, sublist0, op1, sublist1, ..., [output sublist]); a sublist holds ints in
    [0, 52) and Ellipsis."""
    pairs, output = args[:len(args) - len(args) % 2], args[-1] if len(args) % 2 else None
    operands, terms = pairs[0::2], [_sublist_term(s) for s in pairs[1::2]]
    equation = ",".join(terms) + ("" if output is None else "->" + _sublist_term(output))
    return equation, operands


def _sublist_term(sublist) -> str:
    try:
        return "".join("..." if s is Ellipsis else LETTERS[s] for s in sublist)
    except (IndexError, TypeError):
        raise ValueError(f"einsum(): a sublist holds integers in [0, {len(LETTERS)}) and Ellipsis, got "
                         f"{sublist!r}") from None


def _tokens(term: str, operand: str) -> list:
    """The subscripts of one term, with '...' as None."""
    tokens, i = [], 0
    while i < len(term):
        if term.startswith("...", i):
            if None in tokens:
                raise RuntimeError(f"einsum(): found '.' for {operand} for which an ellipsis was already found")
            tokens.append(None)
            i += 3
        elif term[i] == ".":
            raise RuntimeError(f"einsum(): found '.' for {operand} that is not part of any ellipsis")
        elif term[i] in LETTERS:
            tokens.append(term[i])
            i += 1
        else:
            raise RuntimeError(f"einsum(): invalid subscript {term[i]!r} in {term!r} for {operand}; subscripts must "
                               f"be in [a-zA-Z]")
    return tokens


def _expand(tokens: list, n_ellipsis: int, ellipsis_rank: int) -> list:
    """Labels for tokens: letters by their place in LETTERS, the ellipsis' `n_ellipsis` dims right-aligned in
    the `ellipsis_rank` dims every ellipsis broadcasts to."""
    labels = []
    for tok in tokens:
        if tok is None:
            labels += range(ELLIPSIS_LABEL + ellipsis_rank - n_ellipsis, ELLIPSIS_LABEL + ellipsis_rank)
        else:
            labels.append(LETTERS.index(tok))
    return labels


def _parse(equation: str, operands) -> _Equation:
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        which = "fewer" if len(operands) < len(terms) else "more"
        raise RuntimeError(f"einsum(): {which} operands were provided ({len(operands)}) than specified in the "
                           f"equation {equation!r} ({len(terms)})")
    token_lists = [_tokens(term, f"operand {k}") for k, term in enumerate(terms)]
    n_ellipsis = [_ellipsis_dims(tokens, t, k) for k, (tokens, t) in enumerate(zip(token_lists, operands))]
    rank = max(n_ellipsis)
    inputs = [_expand(tokens, n, rank) for tokens, n in zip(token_lists, n_ellipsis)]
    if arrow:
        output = _expand(_tokens(rhs, "the output"), rank, rank)
        _check_output(output, inputs)
    else:
        counts = [label for labels in inputs for label in labels]
        output = list(range(ELLIPSIS_LABEL, ELLIPSIS_LABEL + rank)) + \
            sorted((lab for lab in set(counts) if lab < ELLIPSIS_LABEL and counts.count(lab) == 1),
                   key=lambda lab: LETTERS[lab])  # ASCII order: upper case first
    sizes = _label_sizes(inputs, operands)
    if len(sizes) > len(LETTERS):
        raise RuntimeError(f"einsum(): {equation!r} needs {len(sizes)} distinct dims with its ellipsis expanded; "
                           f"at most {len(LETTERS)} are supported")
    return _Equation(inputs, output, sizes)


def _ellipsis_dims(tokens: list, t: Tensor, k: int) -> int:
    letters = len(tokens) - (None in tokens)
    if letters > t.ndim or (None not in tokens and letters != t.ndim):
        raise RuntimeError(f"einsum(): the number of subscripts in the equation ({letters}) does not match the "
                           f"number of dimensions ({t.ndim}) of operand {k} (shape {t.shape})"
                           f"{'' if None in tokens else ' and no ellipsis was given'}")
    return t.ndim - letters if None in tokens else 0


def _check_output(output: list, inputs: list) -> None:
    seen = {label for labels in inputs for label in labels}
    for label in output:
        name = LETTERS[label] if label < ELLIPSIS_LABEL else "..."
        if output.count(label) > 1:
            raise RuntimeError(f"einsum(): output subscript {name} appears more than once in the output")
        if label not in seen:
            raise RuntimeError(f"einsum(): output subscript {name} does not appear in the equation for any input "
                               f"operand")


def _label_sizes(inputs: list, operands) -> dict:
    """Each label's size: equal within an operand (a diagonal), and equal or 1 across operands (broadcast)."""
    sizes: dict = {}
    for k, (labels, t) in enumerate(zip(inputs, operands)):
        own: dict = {}
        for label, n in zip(labels, t.shape):
            name = LETTERS[label] if label < ELLIPSIS_LABEL else "..."
            if own.setdefault(label, n) != n:
                raise RuntimeError(f"einsum(): subscript {name} is repeated for operand {k} (shape {t.shape}) but "
                                   f"the sizes don't match, {n} != {own[label]}")
        for label, n in own.items():
            seen = sizes.setdefault(label, n)
            if seen != n and 1 not in (seen, n):
                name = LETTERS[label] if label < ELLIPSIS_LABEL else "..."
                raise RuntimeError(f"einsum(): subscript {name} has size {n} for operand {k} (shape {t.shape}) "
                                   f"which does not broadcast with previously seen size {seen}")
            sizes[label] = max(seen, n) if 0 not in (seen, n) else 0
    return sizes


def _unique(labels: list) -> list:
    return list(dict.fromkeys(labels))


def _letters(*label_lists) -> dict:
    """A letter for each label used, so that ellipsis labels (>= 52) get free letters too."""
    used = _unique([label for labels in label_lists for label in labels])
    return {label: LETTERS[i] for i, label in enumerate(used)}


def _spell(letters: dict, labels: list) -> str:
    return "".join(letters[label] for label in labels)


def _diagonal(xp, a, labels: list):
    """a with each repeated label taken once (its diagonal), labels in order of first appearance."""
    unique = _unique(labels)
    if len(unique) == len(labels):
        return a
    letters = _letters(labels)
    return xp.einsum(f"{_spell(letters, labels)}->{_spell(letters, unique)}", a)


def _contract(xp, eq: _Equation, terms: list, output: list):
    """einsum of (array, unique labels) terms into `output`, each term first broadcast to the labels' sizes."""
    letters = _letters(output, *(labels for _, labels in terms))
    arrays = [xp.broadcast_to(a, tuple(eq.sizes[label] for label in labels)) for a, labels in terms]
    spec = ",".join(_spell(letters, labels) for _, labels in terms) + "->" + _spell(letters, output)
    return xp.einsum(spec, *arrays, optimize=True)  # True: pairwise, through the BLAS (tensordot)


def _operand_grad(xp, eq: _Equation, canonical: list, g, k: int, t: Tensor):
    """Operand k's gradient: g contracted with the other operands onto k's labels, broadcast along the labels only
    k has, summed over k's broadcast dims of size 1, and put back on k's diagonals."""
    labels = _unique(eq.inputs[k])
    others = [(canonical[j], _unique(eq.inputs[j])) for j in range(len(canonical)) if j != k]
    available = set(eq.output).union(*(set(lab) for _, lab in others))
    reached = [label for label in labels if label in available]
    grad = _contract(xp, eq, [(g, eq.output)] + others, reached)
    full = tuple(eq.sizes[label] for label in labels)
    grad = xp.broadcast_to(grad.reshape([eq.sizes[lab] if lab in available else 1 for lab in labels]), full)
    size_one = tuple(i for i, (n, m) in enumerate(zip(canonical[k].shape, full)) if n == 1 and m != 1)
    if size_one:
        grad = grad.sum(axis=size_one, keepdims=True)
    grad = grad.astype(t.data.dtype, copy=len(reached) < len(labels))  # a copy: no broadcast view goes on
    if len(labels) == len(eq.inputs[k]):
        return grad
    gx = xp.zeros(t.shape, dtype=grad.dtype)
    position = {label: i for i, label in enumerate(labels)}
    gx[tuple(xp.arange(n).reshape([-1 if i == position[label] else 1 for i in range(len(labels))])
             for label, n in zip(eq.inputs[k], t.shape))] = grad
    return gx
