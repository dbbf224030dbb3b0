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

from frost.backend import cuda
from frost.backend.batched import batched_product
from frost.backend.remembered import RememberedTable
from frost.layout import empty_like_format, is_channels_last

_lock = threading.Lock()
_graphs: dict = {}
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


def _data_type(dtype):
    import cudnn
    name = str(dtype)
    table = {"float32": cudnn.data_type.FLOAT, "float16": cudnn.data_type.HALF,
             "bfloat16": cudnn.data_type.BFLOAT16, "float64": cudnn.data_type.DOUBLE}
    if name not in table:
        raise TypeError(f"conv2d on CUDA: dtype {name} is not supported by cuDNN")
    return table[name]


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
    from frost import backends
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    if str(dtype) == "float32" and not backends.allow_tf32:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE])
    nondeterministic = getattr(cudnn.numerical_note, "NONDETERMINISTIC", None)
    if backends.deterministic and nondeterministic is not None:
        g.deselect_numeric_notes([nondeterministic])
    g.check_support()


class _ConvGraph:
    """A built cuDNN graph for one convolution kind and geometry, with its plan chosen."""

    def __init__(self, kind: str, a, b, out, stride, padding, dilation) -> None:
        import cudnn
        dt = _data_type(a.dtype)
        self.graph = g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                                       compute_data_type=cudnn.data_type.FLOAT, handle=_handle())
        A = g.tensor(name="A", dim=list(a.shape), stride=_elem_strides(a), data_type=dt)
        B = g.tensor(name="B", dim=list(b.shape), stride=_elem_strides(b), data_type=dt)
        conv = dict(padding=list(padding), stride=list(stride), dilation=list(dilation),
                    compute_data_type=cudnn.data_type.FLOAT)
        if kind == "fprop":      # a = image, b = weight
            Y = g.conv_fprop(image=A, weight=B, **conv)
        elif kind == "dgrad":    # a = loss, b = filter
            Y = g.conv_dgrad(loss=A, filter=B, **conv)
        else:                    # wgrad: a = image, b = loss
            Y = g.conv_wgrad(image=A, loss=B, **conv)
        Y.set_output(True).set_dim(list(out.shape)).set_stride(_elem_strides(out)).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        _create_plans(g, a.dtype)
        self.tensors = (A, B, Y)
        self.plan_count = g.get_execution_plan_count()

    def pack(self, a, b, out) -> dict:
        # bare device addresses: handed an array, the frontend asks whether it is a torch tensor, which imports
        # torch where it is installed (seconds at a cold start-up); an address is taken as the graph declares it
        A, B, Y = self.tensors
        return {A: a.data.ptr, B: b.data.ptr, Y: out.data.ptr}

    def tune(self, key: str, a, b, out, limit: int | None = None) -> None:
        """Time the first `limit` admissible plans (a few runs each) and select the fastest; remembered on disk."""
        tuned = _tuned.load()
        if key in tuned and tuned[key] < self.plan_count and self._select(tuned[key]):
            return
        pack, best, best_time = self.pack(a, b, out), 0, float("inf")
        # the heuristics rank the plans; the best measured one is nearly always among their first few
        if limit is None:
            limit = int(os.environ.get("FROST_CUDNN_TUNE_PLANS", "8"))
        # plans cuDNN compiles at run time cost a cold start-up seconds (NVRTC inside cuDNN); the plans chosen at
        # the seed's shapes are precompiled (sm90_xmma_* kernels): the others are timed only when none of those runs
        for with_compiled in (False, True):
            timed = 0
            for i in range(self.plan_count):
                if not with_compiled and self._compiled_at_run_time(i):
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
            from frost import backends
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

    def run(self, a, b, out) -> None:
        self.graph.execute_plan_at_index(self.pack(a, b, out), _workspace_for(self.workspace_size), self.index,
                                         handle=_handle())


def _run(kind: str, a, b, out, stride, padding, dilation):
    from frost import backends
    key = json.dumps([kind, backends.allow_tf32, backends.deterministic, a.shape, _elem_strides(a), b.shape,
                      _elem_strides(b), out.shape, _elem_strides(out), str(a.dtype), list(stride), list(padding),
                      list(dilation)])
    g = _graphs.get(key)
    if g is None:
        with _lock:
            g = _graphs.get(key)
            if g is None:
                start = time.perf_counter()
                g = _ConvGraph(kind, a, b, out, stride, padding, dilation)
                built = time.perf_counter()
                g.tune(key, a, b, out)
                stats["graphs"] += 1
                stats["graph_seconds"] += built - start
                stats["tune_seconds"] += time.perf_counter() - built
                _graphs[key] = g
    g.run(a, b, out)
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


class _MatmulGraph(_ConvGraph):
    """C = A @ B for 3-D (batch, m, k) x (batch, k, n) arrays with any real strides."""

    def __init__(self, a, b, out) -> None:  # super().__init__ builds a convolution; this builds a matmul
        import cudnn
        dt = _data_type(a.dtype)
        self.graph = g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                                       compute_data_type=cudnn.data_type.FLOAT, handle=_handle())
        A = g.tensor(name="A", dim=list(a.shape), stride=_elem_strides(a), data_type=dt)
        B = g.tensor(name="B", dim=list(b.shape), stride=_elem_strides(b), data_type=dt)
        C = g.matmul(A, B, compute_data_type=cudnn.data_type.FLOAT)
        C.set_output(True).set_dim(list(out.shape)).set_stride(_elem_strides(out)).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        _create_plans(g, a.dtype)
        self.tensors = (A, B, C)
        self.plan_count = g.get_execution_plan_count()


def matmul(a, b, out=None):
    """a @ b for 2-D or 3-D CuPy arrays through cuDNN (usable inside a CUDA-graph capture, unlike CuPy's cuBLAS).

    `out`, when given, is a C-contiguous array of the result's shape and a's dtype that receives the product."""
    cp = cuda.cupy()
    a3, b3, out, result = batched_product(cp, a, b, out)
    batch = out.shape[0]
    if a3.shape[0] != batch:
        a3 = cp.ascontiguousarray(cp.broadcast_to(a3, (batch,) + a3.shape[1:]))
    if b3.shape[0] != batch:
        b3 = cp.ascontiguousarray(cp.broadcast_to(b3, (batch,) + b3.shape[1:]))
    # a broadcast matrix (stride 0 along a row or a column, as sum()'s gradient is) has no cuDNN plan: made dense
    a3, b3 = (m if 0 not in m.strides[1:] else cp.ascontiguousarray(m) for m in (a3, b3))
    from frost import backends
    key = json.dumps(["matmul", backends.allow_tf32, backends.deterministic, a3.shape, _elem_strides(a3), b3.shape,
                      _elem_strides(b3), str(a.dtype)])
    g = _graphs.get(key)
    if g is None:
        with _lock:
            g = _graphs.get(key)
            if g is None:
                g = _MatmulGraph(a3, b3, out)
                g.tune(key, a3, b3, out, limit=2)  # many small shapes (Muon's): timing them all costs seconds
                _graphs[key] = g
    g.run(a3, b3, out)
    return result
