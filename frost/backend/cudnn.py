"""cuDNN convolutions through the cuDNN frontend's graph API, driven with CuPy memory and CuPy's stream.

One graph per (kind, shapes, strides, dtype, stride, padding, dilation); the first eight admissible plans
(FROST_CUDNN_TUNE_PLANS; plans cuDNN compiles at run time only when no other runs) are built and timed once per
graph, and the fastest is remembered on disk so that the next process skips the timing.
"""
from __future__ import annotations

import json
import os
import threading
import time

from frost import backends
from frost.backend import cuda
from frost.backend.batched import batched_product
from frost.backend.remembered import RememberedTable
from frost.layout import empty_like_format, is_channels_last

_lock = threading.Lock()
_graphs: dict = {}
_untuned: dict = {}   # key -> a graph built (by attention_supported) before its first call chose its plan
_refused: dict = {}   # key -> why cuDNN could not build that attention graph
_handles: dict = {}
_tuned = RememberedTable("cudnn_plans.json")  # plan index chosen per graph key
_workspace: dict = {}  # (device, stream) -> that stream's scratch (see _workspace_for)
_outgrown_workspaces: list = []
# what a start-up spends here (read by benchmarks/step_time.py): graphs built, seconds building them (validate,
# operation graph, plan list), seconds choosing their plans (building and timing candidates), and how many
# run-time-compiled plans the choice passed over
stats = {"graphs": 0, "graph_seconds": 0.0, "tune_seconds": 0.0, "runtime_compiled_skipped": 0}


def available() -> bool:
    """True when the cuDNN frontend imports (it needs the nvidia-cudnn-frontend package)."""
    try:
        import cudnn  # noqa: F401
        return True
    except Exception:
        return False


def _handle():
    import cudnn
    cp = cuda.cupy()
    dev = cp.cuda.Device().id
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = cudnn.create_handle()
    cudnn.set_stream(handle=h, stream=cp.cuda.get_current_stream().ptr)
    return h


def _data_type(dtype, op: str = "conv2d"):
    import cudnn
    name = str(dtype)
    table = {"float32": cudnn.data_type.FLOAT, "float16": cudnn.data_type.HALF,
             "bfloat16": cudnn.data_type.BFLOAT16, "float64": cudnn.data_type.DOUBLE}
    if name not in table:
        raise TypeError(f"{op} on CUDA: dtype {name} is not supported by cuDNN")
    return table[name]


def _new_graph(dtype, op: str) -> tuple:
    """(graph, cuDNN data type): an empty graph for `dtype` inputs and outputs, computing in float32."""
    import cudnn
    dt = _data_type(dtype, op)
    return cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=_handle()), dt


def _declare(g, name: str, a, dt):
    """An input tensor of the graph laid out as array `a`."""
    return g.tensor(name=name, dim=list(a.shape), stride=_elem_strides(a), data_type=dt)


def _output(t, a, dt) -> None:
    """Make t an output of the graph laid out as array `a`."""
    t.set_output(True).set_dim(list(a.shape)).set_stride(_elem_strides(a)).set_data_type(dt)


def _elem_strides(a) -> list:
    return [s // a.itemsize for s in a.strides]


def _workspace_for(size: int) -> int:
    """The address of the cuDNN workspace of the current device and stream, grown to at least `size` bytes.

    One per stream: a captured step runs weight gradients on a side stream beside the input-gradient chain, and
    two cuDNN calls sharing one scratch at once would overwrite each other's partial results."""
    cp = cuda.cupy()
    key = (cp.cuda.Device().id, cp.cuda.get_current_stream().ptr)
    ws = _workspace.get(key)
    if ws is None or ws.size < size:
        if ws is not None:  # CUDA graphs captured earlier keep its address: it must stay allocated
            _outgrown_workspaces.append(ws)
        ws = _workspace[key] = cp.empty(max(size, 1), dtype=cp.uint8)
    return ws.data.ptr


def _create_plans(g, dtype) -> None:
    """Every candidate plan of a validated graph (float32 without TF32 tensor cores when frost.backends says so),
    not yet built: cuDNN compiles some plans at run time, and only the few that are timed, then the chosen one,
    need building."""
    import cudnn
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if str(dtype) == "float32" and not backends.allow_tf32:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    nondeterministic = getattr(cudnn.numerical_note, "NONDETERMINISTIC", None)
    if backends.deterministic and nondeterministic is not None:
        g.deselect_numeric_notes([nondeterministic])
    g.check_support()


class _Graph:
    """A built cuDNN graph (self.graph) over its tensors (self.tensors), with its plan chosen (tune).
    first_plan_always: time the heuristics' first plan even when cuDNN compiles it at run time (the others such are
    timed only when no precompiled plan runs)."""

    first_plan_always = False

    def _finish(self, tensors: tuple, dtype) -> None:
        """Validate and lower the graph declared over `tensors` and list its candidate plans."""
        g = self.graph
        g.validate()
        g.build_operation_graph()
        _create_plans(g, dtype)
        self.tensors = tensors
        self.plan_count = g.get_execution_plan_count()

    def pack(self, arrays: tuple) -> dict:
        """The variant pack: each of the graph's tensors (self.tensors) and the address of its array."""
        # bare device addresses: handed an array, the frontend asks whether it is a torch tensor, which imports
        # torch where it is installed (seconds at a cold start-up); an address is taken as the graph declares it
        return {t: a.data.ptr for t, a in zip(self.tensors, arrays)}

    def tune(self, key: str, arrays: tuple, limit: int | None = None) -> None:
        """Time the first `limit` admissible plans (a few runs each) on `arrays` (self.tensors' arrays, in order) and
        select the fastest; remembered on disk."""
        tuned = _tuned.load()
        if key in tuned and tuned[key] < self.plan_count and self._select(tuned[key]):
            return
        pack, best, best_time = self.pack(arrays), 0, float("inf")
        # the heuristics rank the plans; the best measured one is nearly always among their first few
        if limit is None:
            limit = int(os.environ.get("FROST_CUDNN_TUNE_PLANS", "8"))
        # plans cuDNN compiles at run time cost a cold start-up seconds (NVRTC inside cuDNN); the plans chosen at
        # the seed's shapes are precompiled (sm90_xmma_* kernels): the others are timed only when none of those runs
        for with_compiled in (False, True):
            timed = 0
            for i in range(self.plan_count):
                if not with_compiled and not (i == 0 and self.first_plan_always) and self._compiled_at_run_time(i):
                    stats["runtime_compiled_skipped"] += 1
                    continue
                t = self._time_plan(i, pack)  # inf for a plan that the filters (TF32, determinism) exclude
                timed += t < float("inf")
                if t < best_time:
                    best, best_time = i, t
                if timed >= limit:
                    break
            if best_time < float("inf"):
                break
        if best_time == float("inf"):
            raise RuntimeError(f"cuDNN has no usable plan for {key} with allow_tf32={backends.allow_tf32}, "
                               f"deterministic={backends.deterministic}")
        tuned[key] = best
        _tuned.save()
        if not self._select(best):
            raise RuntimeError(f"cuDNN could not build plan {best} for {key}, which it had just run")

    def _compiled_at_run_time(self, index: int) -> bool:
        import cudnn
        note = getattr(getattr(cudnn, "behavior_note", None), "RUNTIME_COMPILATION", None)
        try:
            return note is not None and note in self.graph.get_behavior_notes_for_plan_at_index(index)
        except Exception:  # no notes for this plan: treat it as precompiled
            return False

    def _time_plan(self, index: int, pack: dict) -> float:
        """GPU microseconds per run of one plan (cuda.graph_time_us: replayed inside a CUDA graph, as launching from
        Python costs more than these small convolutions take); inf for a plan that cannot run here."""
        try:
            self.graph.build_plan_at_index(index)
            ws = _workspace_for(self.graph.get_workspace_size_plan_at_index(index))
            return cuda.graph_time_us(lambda: self.graph.execute_plan_at_index(pack, ws, index, handle=_handle()),
                                      calls=5, repeats=3, warmup=1)
        except Exception:  # a plan that cannot run here is simply not chosen
            return float("inf")

    def _select(self, index: int) -> bool:
        """Build plan `index` and run it from now on; False when it cannot be built here."""
        try:
            self.graph.build_plan_at_index(index)
            self.workspace_size = self.graph.get_workspace_size_plan_at_index(index)
        except Exception:
            return False
        self.index = index
        return True

    def run(self, arrays: tuple) -> None:
        self.graph.execute_plan_at_index(self.pack(arrays), _workspace_for(self.workspace_size), self.index,
                                         handle=_handle())


class _ConvGraph(_Graph):
    """A cuDNN graph for one convolution kind and geometry."""

    def __init__(self, kind: str, a, b, out, stride, padding, dilation) -> None:
        import cudnn
        g, dt = _new_graph(a.dtype, "conv2d")
        self.graph = g
        A, B = _declare(g, "A", a, dt), _declare(g, "B", b, dt)
        conv = dict(padding=list(padding), stride=list(stride), dilation=list(dilation),
                    compute_data_type=cudnn.data_type.FLOAT)
        if kind == "fprop":      # a = image, b = weight
            Y = g.conv_fprop(image=A, weight=B, **conv)
        elif kind == "dgrad":    # a = loss, b = filter
            Y = g.conv_dgrad(loss=A, filter=B, **conv)
        else:                    # wgrad: a = image, b = loss
            Y = g.conv_wgrad(image=A, loss=B, **conv)
        _output(Y, out, dt)
        self._finish((A, B, Y), a.dtype)



def _built(key: str, build, arrays: tuple, limit: int | None = None) -> "_Graph":
    """The graph remembered under `key`, or a new one (build()) with its plan chosen on `arrays`."""
    g = _graphs.get(key)
    if g is None:
        with _lock:
            g = _graphs.get(key)
            if g is None:
                start = time.perf_counter()
                g = _untuned.pop(key, None) or build()
                built = time.perf_counter()
                g.tune(key, arrays, limit)
                stats["graphs"] += 1
                stats["graph_seconds"] += built - start
                stats["tune_seconds"] += time.perf_counter() - built
                _graphs[key] = g
    return g


def _key(kind: str, arrays: tuple, *params) -> str:
    return json.dumps([kind, backends.allow_tf32, backends.deterministic, str(arrays[0].dtype),
                       *([list(a.shape), _elem_strides(a)] for a in arrays), *params])


def _run(kind: str, a, b, out, stride, padding, dilation):
    arrays = (a, b, out)
    key = _key(kind, arrays, list(stride), list(padding), list(dilation))
    _built(key, lambda: _ConvGraph(kind, a, b, out, stride, padding, dilation), arrays).run(arrays)
    return out


def conv2d_forward(x, w, y_shape, stride, padding, dilation):
    return _run("fprop", x, w, empty_like_format(y_shape, x), stride, padding, dilation)


def conv2d_backward_input(g, w, x_shape, stride, padding, dilation):
    return _run("dgrad", g, w, empty_like_format(x_shape, g), stride, padding, dilation)


def conv2d_backward_weight(g, x, w_shape, stride, padding, dilation, out=None):
    """The weight gradient, written into `out` (w_shape, x's dtype, dense: NCHW or channels-last) when given."""
    if out is None:
        out = empty_like_format(w_shape, x)
    elif tuple(out.shape) != tuple(w_shape) or out.dtype != x.dtype or not (
            out.flags.c_contiguous or is_channels_last(out)):
        raise ValueError(f"conv2d_backward_weight: out must be a dense (NCHW or channels-last) {x.dtype} array of "
                         f"shape {tuple(w_shape)}, got {out.dtype} {tuple(out.shape)} with strides {out.strides}")
    return _run("wgrad", x, g, out, stride, padding, dilation)


class _MatmulGraph(_Graph):
    """C = A @ B for 3-D (batch, m, k) x (batch, k, n) arrays with any real strides; with a (1, 1, n) bias, C = A @ B
    + bias, added to the float32 product in the GEMM's epilogue and rounded once; with an activation ("gelu",
    "gelu_tanh") after the bias, a second output: the activation of the float32 sum."""

    def __init__(self, arrays: tuple, activation: str | None = None) -> None:
        import cudnn
        a, b, *bias, out = arrays if activation is None else arrays[:-1]
        g, dt = _new_graph(a.dtype, "matmul")
        self.graph = g
        inputs = [_declare(g, "A", a, dt), _declare(g, "B", b, dt)]
        C = g.matmul(*inputs, compute_data_type=cudnn.data_type.FLOAT)
        if bias:
            inputs.append(_declare(g, "bias", bias[0], _data_type(bias[0].dtype, "matmul")))
            C = g.bias(input=C, bias=inputs[-1], compute_data_type=cudnn.data_type.FLOAT)
        outputs = [C]
        if activation is not None:
            act = {"gelu": g.gelu, "gelu_tanh": g.gelu_approx_tanh}[activation]
            outputs.append(act(input=C, compute_data_type=cudnn.data_type.FLOAT))
        for t, array in zip(outputs, arrays[len(inputs):]):
            _output(t, array, _data_type(array.dtype, "matmul"))
        self._finish((*inputs, *outputs), a.dtype)


def matmul(a, b, out=None, bias=None, activation=None):
    """a @ b for 2-D or 3-D CuPy arrays through cuDNN (usable inside a CUDA-graph capture, unlike CuPy's cuBLAS).

    `out`, when given, is a C-contiguous array of the result's shape that receives the product: a's dtype, or
    float32 for 16-bit operands. `bias` (n,), dense: added to every row in the product's epilogue; None is returned
    instead where cuDNN builds no such graph (the refusal is remembered: the caller adds the bias itself).
    `activation` ("gelu" or "gelu_tanh", with a bias): (product + bias, its activation), or None where refused."""
    cp = cuda.cupy()
    a3, b3, out, result = batched_product(cp, a, b, out)
    batch = out.shape[0]
    if a3.shape[0] != batch:
        a3 = cp.ascontiguousarray(cp.broadcast_to(a3, (batch,) + a3.shape[1:]))
    if b3.shape[0] != batch:
        b3 = cp.ascontiguousarray(cp.broadcast_to(b3, (batch,) + b3.shape[1:]))
    # a broadcast matrix (stride 0 along a row or a column, as sum()'s gradient is) has no cuDNN plan: made dense
    a3, b3 = (m if 0 not in m.strides[1:] else cp.ascontiguousarray(m) for m in (a3, b3))
    arrays = (a3, b3, out) if bias is None else (a3, b3, bias.reshape(1, 1, -1), out)
    if activation is not None:
        arrays += (cp.empty_like(out),)
    key = _key("matmul", arrays, [str(x.dtype) for x in arrays], *([activation] if activation else []))
    if bias is not None and not _buildable(key, lambda: _MatmulGraph(arrays, activation)):
        return None
    try:
        # many small shapes (Muon's): timing every plan of each costs seconds
        graph = _built(key, lambda: _MatmulGraph(arrays, activation), arrays, limit=2)
    except RuntimeError as e:   # built, but no plan runs under the switches (TF32, determinism)
        if bias is None:
            raise
        _refused[key] = str(e)
        return None
    graph.run(arrays)
    return result if activation is None else (result, arrays[-1].reshape(result.shape))


# ------------------------------------------------------------------ fused attention (cuDNN's SDPA graphs)
def _seed_and_offset(g) -> tuple:
    """The dropout's Philox seed and offset: one int64 each, read from device memory at every run (so a captured
    step draws a new mask on each replay)."""
    import cudnn
    return tuple(g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
                 for name in ("Seed", "Offset"))


def _attention_options(scale: float, causal: bool, dropout_p: float, rng: tuple) -> dict:
    import cudnn
    options = dict(attn_scale=scale, compute_data_type=cudnn.data_type.FLOAT)
    if causal:   # top-left aligned (key j visible to query i when j <= i), as PyTorch's is_causal
        options.update(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0)
    if dropout_p > 0.0:
        options["dropout"] = (dropout_p, *rng)
    return options


class _AttentionGraph(_Graph):
    """O, Stats = softmax(Q K^T scale) V for (B, H, L, D) arrays of any strides (K and V may have fewer heads: grouped
    queries); Stats is each query row's float32 log-sum-exp (B, H, Lq, 1), which the backward reads."""

    # cuDNN compiles its fused attention kernels at run time for many shapes, and the precompiled plans left can be
    # far slower: 11.2 ms for a causal 4 x 32 x 4096 x 64 forward that the heuristics' first plan (PyTorch's pick)
    # runs in 0.63 ms on an H100 (flash_forward_tiles_h100_d613ac2.json)
    first_plan_always = True

    def __init__(self, arrays: tuple, scale: float, causal: bool, dropout_p: float) -> None:
        import cudnn
        q, k, v, o, lse = arrays[:5]
        g, dt = _new_graph(q.dtype, "scaled_dot_product_attention")
        self.graph = g
        Q, K, V = (_declare(g, name, a, dt) for name, a in zip(("Q", "K", "V"), (q, k, v)))
        rng = _seed_and_offset(g) if dropout_p > 0.0 else ()
        O, S = g.sdpa(q=Q, k=K, v=V, generate_stats=True, name="attention",
                      **_attention_options(scale, causal, dropout_p, rng))
        _output(O, o, dt)
        _output(S, lse, cudnn.data_type.FLOAT)
        self._finish((Q, K, V, O, S, *rng), q.dtype)


class _AttentionBackwardGraph(_Graph):
    """dQ, dK, dV of _AttentionGraph's O from dO, recomputing the weights from Q, K and its Stats."""

    first_plan_always = True

    def __init__(self, arrays: tuple, scale: float, causal: bool, dropout_p: float) -> None:
        import cudnn
        q, k, v, o, do, lse, dq, dk, dv = arrays[:9]
        g, dt = _new_graph(q.dtype, "scaled_dot_product_attention")
        self.graph = g
        Q, K, V, O, dO = (_declare(g, name, a, dt) for name, a in zip(("Q", "K", "V", "O", "dO"), (q, k, v, o, do)))
        S = _declare(g, "Stats", lse, cudnn.data_type.FLOAT)
        rng = _seed_and_offset(g) if dropout_p > 0.0 else ()
        dQ, dK, dV = g.sdpa_backward(q=Q, k=K, v=V, o=O, dO=dO, stats=S,
                                     use_deterministic_algorithm=backends.deterministic,
                                     name="attention_backward", **_attention_options(scale, causal, dropout_p, rng))
        for t, a in zip((dQ, dK, dV), (dq, dk, dv)):
            _output(t, a, dt)
        self._finish((Q, K, V, O, dO, S, dQ, dK, dV, *rng), q.dtype)


def _rng_words(rng) -> tuple:
    """(seed, offset) as two one-element int64 arrays over a 4-word uint32 generator snapshot; () without one."""
    if rng is None:
        return ()
    words = rng.view("int64")
    return words[0:1], words[1:2]


_ATTENTION_GRAPHS = {"attention": _AttentionGraph, "attention_backward": _AttentionBackwardGraph}


# in attention graphs' keys: plans remembered on disk under an earlier way of choosing them are chosen again
ATTENTION_PLAN_RULE = "first plan timed"


def _attention(kind: str, arrays: tuple, scale: float, causal: bool, dropout_p: float) -> tuple:
    """(key, build): one attention graph's key (kind, the arrays' layouts, the options) and its constructor."""
    return (_key(kind, arrays, scale, causal, dropout_p, ATTENTION_PLAN_RULE),
            lambda: _ATTENTION_GRAPHS[kind](arrays, scale, causal, dropout_p))


def attention_supported(q, k, v, o, lse, do, dq, dk, dv, scale: float, causal: bool, dropout_p: float = 0.0) -> bool:
    """Whether cuDNN builds both graphs of this attention call (arrays laid out as attention_forward and
    attention_backward will get them; their values are not read). The graphs are built once per layout and kept
    for the first calls; a refusal is remembered (`refusals()` says why)."""
    words = _rng_words(cuda.cupy().zeros(4, "uint32") if dropout_p > 0.0 else None)
    calls = (("attention", (q, k, v, o, lse, *words)),
             ("attention_backward", (q, k, v, o, do, lse, dq, dk, dv, *words)))
    return all(_buildable(*_attention(kind, arrays, scale, causal, dropout_p)) for kind, arrays in calls)


def _buildable(key: str, build) -> bool:
    """Whether cuDNN builds the graph of `key` (built now and kept for its first call); a refusal is remembered."""
    with _lock:
        if key in _refused:
            return False
        if key in _graphs or key in _untuned:
            return True
        try:
            _untuned[key] = build()
        except Exception as e:  # cuDNN has no engine for it here (shape, layout, GPU, version): not this path
            _refused[key] = f"{type(e).__name__}: {e}"
            return False
    return True


def refusals() -> dict:
    """The graphs (attention, a product with its bias) cuDNN could not build: key -> the error."""
    return dict(_refused)


def attention_forward(q, k, v, o, lse, scale: float, causal: bool, dropout_p: float = 0.0, rng=None) -> None:
    """Write O (o) and the log-sum-exp (lse, float32 (B, H, Lq, 1), C order) of attention over CuPy arrays q
    (B, H, Lq, D), k and v (B, H // group, Lk, D), bf16 or f16, last dim dense. Dropout (on the weights) draws from
    rng, a 4-word uint32 device snapshot (seed words 0-1, offset words 2-3), as the backward must again."""
    arrays = (q, k, v, o, lse, *_rng_words(rng))
    key, build = _attention("attention", arrays, scale, causal, dropout_p)
    _built(key, build, arrays).run(arrays)


def attention_backward(q, k, v, o, do, lse, dq, dk, dv, scale: float, causal: bool, dropout_p: float = 0.0,
                       rng=None) -> None:
    """Write the gradients dq, dk, dv (each laid out as the caller chose) of attention_forward's O given dO (do)."""
    arrays = (q, k, v, o, do, lse, dq, dk, dv, *_rng_words(rng))
    key, build = _attention("attention_backward", arrays, scale, causal, dropout_p)
    _built(key, build, arrays).run(arrays)
