"""The kernel language's types: scalars, arrays, compile-time constants, and the promotion rules."""
from __future__ import annotations

import ml_dtypes
import numpy as np


class Scalar:
    """A scalar type of the kernel language (f32, i32, ...); calling it is a cast."""

    def __init__(self, name: str, np_dtype, c_name: str, kind: str, rank: int) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.c = c_name
        self.kind = kind  # "float", "int", "uint", "bool"
        self.rank = rank  # promotion order within a kind

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    def __repr__(self) -> str:
        return self.name

    def __call__(self, value):
        """Outside a kernel a cast makes a NumPy scalar of this type."""
        return np.asarray(value).astype(self.np)[()]


f16 = Scalar("f16", np.float16, "frost_f16", "float", 1)
bf16 = Scalar("bf16", ml_dtypes.bfloat16, "frost_bf16", "float", 1)
f32 = Scalar("f32", np.float32, "float", "float", 2)
f64 = Scalar("f64", np.float64, "double", "float", 3)
u8 = Scalar("u8", np.uint8, "unsigned char", "uint", 0)
i32 = Scalar("i32", np.int32, "int", "int", 2)
u32 = Scalar("u32", np.uint32, "unsigned int", "uint", 2)
i64 = Scalar("i64", np.int64, "long long", "int", 3)
boolean = Scalar("bool", np.bool_, "bool", "bool", 0)
SCALARS = {t.name: t for t in (f16, bf16, f32, f64, u8, i32, u32, i64, boolean)}
BY_NP = {t.np: t for t in SCALARS.values()}


class Weak:
    """The type of a literal: adapts to the other operand (an int literal next to an i64 is an i64)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # "int" or "float"
        self.name = "int literal" if kind == "int" else "float literal"

    @property
    def strong(self) -> Scalar:
        return i32 if self.kind == "int" else f32

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind == "int"

    def __repr__(self) -> str:
        return self.name


WEAK_INT = Weak("int")
WEAK_FLOAT = Weak("float")


def strong(t):
    return t.strong if isinstance(t, Weak) else t


def arith_type(t):
    """The type a value takes part in arithmetic as: bool and u8 become i32, f16/bf16 become f32 (C rules)."""
    if isinstance(t, Weak):
        return t
    if t is boolean or t is u8:
        return i32
    if t is f16 or t is bf16:
        return f32
    return t


def promote(a, b):
    """The common type of a binary arithmetic operation (C's usual conversions, literals adapt)."""
    a, b = arith_type(a), arith_type(b)
    if isinstance(a, Weak) and isinstance(b, Weak):
        return WEAK_FLOAT if "float" in (a.kind, b.kind) else WEAK_INT
    if isinstance(a, Weak):
        a, b = b, a
    if isinstance(b, Weak):
        if b.kind == "float" and not a.is_float:
            return f32
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            return a if a.rank >= b.rank else b
        return a if a.is_float else b
    if a.rank != b.rank:
        return a if a.rank > b.rank else b
    return a if a.kind == "uint" else b


class ArrayType:
    """An array value: element type, number of dimensions, memory space and, when static, its shape.

    kind says how the array is held in C++: "param" (a kernel's 1-D parameter: pointer and length),
    "native" (a static shared or local C array), "view" (a frost_view1/frost_view2 struct).
    """

    def __init__(self, elem: Scalar, ndim: int, space: str = "global", kind: str = "view", shape=None) -> None:
        self.elem, self.ndim, self.space, self.kind, self.shape = elem, ndim, space, kind, shape

    def __repr__(self) -> str:
        if self.shape is not None:
            return f"{self.space} array {self.elem}{list(self.shape)}"
        return f"Array[{self.elem}]" if self.ndim == 1 else f"Array[{self.elem}, {self.ndim}]"

    def key(self):
        return ("array", self.elem.name, self.ndim, self.space, self.kind, self.shape)

    def __eq__(self, other):
        return isinstance(other, ArrayType) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())


class TupleType:
    """The type of a device function that returns several values."""

    def __init__(self, items) -> None:
        self.items = tuple(items)

    def __repr__(self) -> str:
        return "(" + ", ".join(map(repr, self.items)) + ")"

    def __eq__(self, other):
        return isinstance(other, TupleType) and self.items == other.items

    def __hash__(self):
        return hash(self.items)


class _ArrayAnnotation:
    """`Array[f32]` or `Array[f32, 2]` in a signature."""

    def __getitem__(self, item) -> ArrayType:
        if isinstance(item, tuple):
            elem, ndim = item
        else:
            elem, ndim = item, 1
        if not isinstance(elem, Scalar) or ndim not in (1, 2):
            raise TypeError(f"Array[...] takes a scalar type and 1 or 2 dimensions, got {item!r}")
        return ArrayType(elem, ndim, "global", "param" if ndim == 1 else "view")

    def __repr__(self) -> str:
        return "Array"


class TensorMapType:
    """A TMA tensor map parameter (`TensorMap[bf16, 3]`): the copy engine's description of a global array of `rank`
    dimensions and of the box it copies into shared memory (cp_async_bulk_tensor). It arrives as a 128-byte
    __grid_constant__ parameter; a kernel only passes it on."""

    def __init__(self, elem: Scalar, rank: int) -> None:
        self.elem, self.rank = elem, rank

    def __repr__(self) -> str:
        return f"TensorMap[{self.elem}, {self.rank}]"

    def key(self):
        return ("tensor_map", self.elem.name, self.rank)

    def __eq__(self, other):
        return isinstance(other, TensorMapType) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())


class _TensorMapAnnotation:
    """`TensorMap[bf16, 3]` in a signature: element type and rank (1 to 5)."""

    def __getitem__(self, item) -> TensorMapType:
        elem, rank = item if isinstance(item, tuple) else (item, None)
        if not isinstance(elem, Scalar) or rank not in (1, 2, 3, 4, 5):
            raise TypeError(f"TensorMap[...] takes a scalar type and a rank of 1 to 5, got {item!r}")
        return TensorMapType(elem, rank)

    def __repr__(self) -> str:
        return "TensorMap"


class ConstType:
    """`Const[int]`: a compile-time constant baked into the kernel's specialization."""

    def __init__(self, py_type=int) -> None:
        self.py_type = py_type

    def __repr__(self) -> str:
        return f"Const[{self.py_type.__name__}]"

    def value(self, v: object, what: str) -> object:
        """v as this constant's value. A Const[bool] takes a bool, or 0 or 1, as a Python bool (True and 1 are one
        key of a kernel's specializations, so a bool constant is always a bool); int and float ones pass as given."""
        if self.py_type is not bool:
            return v
        if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
            return bool(v)
        raise TypeError(f"{what} is a Const[bool]: pass True or False, got {v!r}")


class _ConstAnnotation:
    def __getitem__(self, item) -> ConstType:
        if item is boolean:  # `bool` in a string annotation reads as the kernel's bool type (SCALAR_BY_NAME)
            item = bool
        if item not in (int, float, bool):
            raise TypeError(f"Const[...] takes int, float or bool, got {item!r}")
        return ConstType(item)


Array = _ArrayAnnotation()
Const = _ConstAnnotation()
TensorMap = _TensorMapAnnotation()


def np_scalar(value, t: Scalar):
    """A Python or NumPy value as a NumPy scalar of type t, converted as C converts."""
    return np.asarray(value).astype(t.np)[()]


def c_div(a, b):
    """Integer division as C truncates it (toward zero), on Python ints: constant folding and cdiv's."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a, b):
    return a - b * c_div(a, b)
