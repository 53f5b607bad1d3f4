"""Type stubs of the compiled module distgemm._core (plan functions; see cpp/src/bindings/)."""

from typing import Any

cuda_runtime: bool

ScheduleDef = dict[str, Any]

def schedules() -> list[ScheduleDef]: ...
def gemm_extent_problem(m: int, n: int, k: int, l: int = 1, elem_bytes: int = 2) -> str: ...
def schedule_definition(name: str) -> ScheduleDef: ...
def validate(
    schedule: str | ScheduleDef,
    tp: int,
    steps: int,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> str: ...

class Plan:
    """schedule::Plan, built once by build_plan; to_dict() gives the plain dict of plan.py."""

    @property
    def schedule(self) -> str: ...
    @property
    def definition(self) -> ScheduleDef: ...
    @property
    def tp(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def problem(self) -> dict[str, int]: ...
    @property
    def partial_via(self) -> str: ...
    @property
    def slot_elems(self) -> int: ...
    @property
    def row_scale_a(self) -> bool: ...
    @property
    def row_scale_b(self) -> bool: ...
    @property
    def scale_slot_rows(self) -> int: ...
    @property
    def num_flags(self) -> int: ...
    @property
    def local_shapes(self) -> dict[str, Any]: ...
    def layout(self, slot_elem_bytes: int = 2) -> dict[str, int]: ...
    def slot_elem_bytes(self, operand_bytes: int, out_bytes: int = 2) -> int: ...
    @property
    def pdl_by_default(self) -> bool: ...
    def extent_problem(self, device: int = -1, elem_bytes: int = 2) -> str: ...
    def to_dict(self) -> dict[str, Any]: ...

def build_plan(
    schedule: str | ScheduleDef,
    tp: int,
    steps: int,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    partial_via: str | None = None,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> Plan: ...
def default_steps(
    schedule: str | ScheduleDef, tp: int, m: int, n: int, k: int, l: int = 1
) -> int: ...
def default_transport(schedule: str | ScheduleDef, tp: int, steps: int) -> tuple[str, bool]: ...
def default_plan(
    schedule: str | ScheduleDef,
    tp: int,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> Plan: ...

RS_TWO_STEPS_MIN_TOKENS: int
RS_TWO_STEPS_MAX_K_PER_RANK: int

class GraphSetup:
    """What one rank's GraphLauncher needs besides the Plan and the user pointers."""

    def __init__(
        self,
        rank: int,
        cuda_device: int,
        dtype: str,
        workspace_bases: list[int],
        workspace_bytes: int,
        timeout_s: float,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: bool = False,
        tile_n: int = 0,
        b_n_major: bool = False,
        fast_accum: bool = False,
    ) -> None: ...
    rank: int
    cuda_device: int
    dtype: str
    alpha: float
    beta: float
    bias: bool
    workspace_bases: list[int]
    workspace_bytes: int
    timeout_s: float
    tile_n: int
    b_n_major: bool
    fast_accum: bool

def workspace_layout(
    schedule: str | ScheduleDef,
    tp: int,
    steps: int,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    slot_elem_bytes: int = 2,
    partial_via: str | None = None,
    row_scale_a: bool = False,
    row_scale_b: bool = False,
) -> dict[str, int]: ...
def workspace_control_layout() -> dict[str, int]:
    """The control region after every plan's slots, as workspace_layout's dict of a plan without
    slots (offsets from the slots' end; total_bytes: the region's size)."""

MAX_TP: int  # devices of one plan
MAX_EXTENT: int  # the largest M, N, K or L (int32 extents)
MAX_OPERAND_ELEMENTS: int  # the most elements of one operand (2**60)
MAX_STEPS: int  # pipeline steps S of one plan
MAX_FLAGS: int  # flags of one plan (the control region's capacity)
WORKSPACE_SLOT_ALIGN: int  # slot bytes and the control region start at multiples of this

def tile_map(schedule: str | ScheduleDef, tp: int, steps: int) -> dict[str, list[list[int]]]: ...
def choose_tile_n(
    m: int, n: int, l: int = 1, slots_n256: int = ..., slots_n128: int = ...
) -> dict[str, Any]:
    """The GEMM kernel's output tile width for an m x n (x l) GEMM: {'tile_n': 128 or 256,
    'n256': {'tiles', 'waves', 'cost'}, 'n128': {...}} (kernel/tile_choice.hpp)."""

TILE128_RELATIVE_COST: float
TILE128_MIN_GAIN: float

def choose_config(
    m: int,
    n: int,
    l: int = 1,
    dtype: str = "bf16",
    b_n_major: bool = False,
    slots: int | dict[str, int] = ...,
    swizzle: int = ...,
    stream_k: bool = False,
) -> dict[str, Any]:
    """The GEMM kernel configuration the runtime's model picks for an m x n (x l) GEMM:
    {'config': name, 'candidates': [names, default first], name: {'tiles', 'waves', 'cost'} per
    candidate} (kernel/tile_choice.hpp; tiles count the cluster's padding, and the stream-K
    scheduler's swizzle padding). ``slots``: resident CTAs of every configuration, or
    {name: count}. ``stream_k``: the stream-K configurations are candidates too (the GEMM has a
    workspace)."""

def gemm_config_names(
    dtype: str = "bf16", b_n_major: bool = False, stream_k: bool = False
) -> list[str]:
    """The GEMM kernel configurations of ``dtype`` (and B layout), the default first: bf16
    ['128x256', '128x128', '128x128c1', '256x192'] (with ``stream_k`` also '128x256sk' and
    '128x128sk'), fp16
    ['128x256', '128x128']."""

def kernel_table_row(
    rows: list[dict[str, Any]],
    dtype: str,
    m: int,
    n: int,
    k: int,
    l: int = 1,
    b_n_major: bool = False,
    *,
    scale_a_rows: bool = False,
    scale_b_rows: bool = False,
    fast_accum: bool = False,
) -> int | None:
    """The index of the kernel-table row that chooses this GEMM's kernel, or None: same dtype,
    N and K (e4m3: also the same scale kinds and accumulation), the nearest M within
    KERNEL_TABLE_MAX_M_RATIO (ties to the larger M), never for batches or an N-contiguous B.
    Host-only."""

KERNEL_TABLE_MAX_M_RATIO: float

def gemm_config_table() -> dict[str, dict[str, Any]]:
    """{name: {'id', 'tile_m', 'tile_n', 'cluster_m', 'cluster_n', 'relative_cost',
    'bf16_only', 'stream_k', 'e4m3', 'fast_accum', 'min_gain'}} of every configuration
    (min_gain: it replaces 128x256 only where rated this much cheaper)."""

STREAM_K_FIXUP_WAVES: float  # what the model adds to a stream-K GEMM with a partial last wave

DEFAULT_SWIZZLE: int  # the tile scheduler's swizzle unless a caller sets one

H200_RESIDENT_CTAS: int  # the model's slots where no device is asked (132 SMs, one CTA each)

def decomposition_problem(config: str, decomposition: str, splits: int = 1) -> str:
    """'' when gemm(config=, decomposition=, splits=) suits the configuration (the GEMM kernel's
    check, host-only), else why."""

DECOMPOSITIONS: list[str]  # gemm(decomposition=...) names: auto, heuristic, data_parallel, ...

def choose_raster(
    config: str, m: int, n: int, k: int, slots: int = ..., swizzle: int = ...
) -> dict[str, Any]:
    """The tile order an m x n x k GEMM on ``config`` runs with when the caller sets none
    (gemm(raster=0)): {'raster': 1 along M, 2 along N or 0 CUTLASS's heuristic, 'rows_along_m',
    'rows_along_n': the operand rows one wave reads per k-step in each order,
    'dram_rows_along_m', 'dram_rows_along_n': the rows of K the whole GEMM reads from DRAM in
    each order} (kernel/tile_choice.hpp's choose_raster)."""

RASTER_MIN_GAIN: float  # fewer rows an order must read than the other to replace the heuristic

L2_RESIDENT_OPERAND_BYTES: int  # an operand this small is read from DRAM once in either order

def walk_clusters(minor: int, major: int, group: int) -> list[tuple[int, int]]:
    """The cluster (minor, major) each visit of the data-parallel kernels' tile order runs, for a
    grid of minor x major clusters swizzled in groups of ``group`` (kernel/tile_walk.hpp)."""

# Runtime bindings (present when the package was built with nvcc; cuda_runtime is then True).
def cuda_device_count() -> int: ...
def gemm_problem(
    a: int,
    b: int,
    d: int,
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    tile_n: int = 0,
    b_n_major: bool = False,
    *,
    config: str = "auto",
    scale_a: int = 0,
    scale_a_rows: bool = False,
    scale_b: int = 0,
    scale_b_rows: bool = False,
    fast_accum: bool = False,
) -> str:
    """'' when gemm() runs this dense GEMM, else the reason (no device is touched)."""

def gemm(
    a: int,
    b: int,
    d: int,
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    tile_n: int = 0,
    b_n_major: bool = False,
    *,
    cuda_device: int,
    stream: int,
    config: str = "auto",
    workspace: int = 0,
    workspace_bytes: int = 0,
    scale_a: int = 0,
    scale_a_rows: bool = False,
    scale_b: int = 0,
    scale_b_rows: bool = False,
    fast_accum: bool = False,
    swizzle: int = ...,
    raster: int = 0,
    decomposition: str = "auto",
    splits: int = 1,
    cublas_algo: int = -1,
) -> int:
    """Enqueue D[m, n] = A[m, k] @ B[n, k]^T (B[k, n] with b_n_major) with distgemm's kernel on
    `stream`. dtype 'e4m3': float8_e4m3fn A and B, bf16 D = scale_a * scale_b * A @ B^T with
    float32 scales at device addresses (one value, or one per row with ``*_rows``), CUTLASS's
    fast-accumulation kernel with ``fast_accum``. The kernel: configuration ``config`` (a
    gemm_config_names() name), else tile 128 x tile_n, else the model's pick (among the stream-K
    configurations too where ``workspace``, a zeroed device buffer of gemm_workspace_bytes() used
    by one GEMM at a time, is given). ``swizzle`` and ``raster`` (0 the configuration's rule,
    choose_raster; 1 along M; 2 along N): the persistent scheduler's tile order. ``decomposition``
    ('auto', 'heuristic', 'data_parallel', 'split_k' with ``splits`` K ranges per tile,
    'stream_k'), for a stream-K configuration only: how it divides the work along K. Returns the
    output tile width it ran with (0 for cuBLASLt). ``cublas_algo`` >= 0: cuBLASLt instead, the
    algorithm of that rank in its heuristic's list (cublaslt_algo_count). With config, tile_n and
    cublas_algo unset, the machine's kernel table (set_kernel_table) chooses where it has a row
    near the shape, else the model. ValueError with gemm_problem's reason when the kernel cannot
    run it."""

STREAM_K_TAIL_BYTES: int  # a stream-K workspace's last bytes: split counters, zero between launches

def gemm_workspace_bytes(
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    b_n_major: bool = False,
    *,
    config: str = "auto",
    cuda_device: int,
    decomposition: str = "auto",
    splits: int = 1,
) -> int:
    """Bytes of the zeroed workspace gemm(workspace=...) needs on ``cuda_device``: 0 unless
    ``config`` (or, with 'auto', the model given a workspace) is a stream-K configuration;
    ``decomposition`` and ``splits`` as gemm() gets them."""

def gemm_resolve_config(
    m: int,
    n: int,
    dtype: str = "bf16",
    tile_n: int = 0,
    b_n_major: bool = False,
    *,
    config: str = "auto",
    cuda_device: int,
    stream_k: bool = False,
    k: int = 0,
) -> str:
    """The kernel gemm() runs an m x n (x k) GEMM with on ``cuda_device``: with auto, the kernel
    table's row near the shape (a configuration name or 'cublaslt:<rank>'), else the model's pick
    with the device's resident CTAs (``stream_k``: gemm() is given a workspace)."""

def cublaslt_algo_count(
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    b_n_major: bool = False,
    *,
    cuda_device: int,
    scale_a_rows: bool = False,
    scale_b_rows: bool = False,
    fast_accum: bool = False,
) -> int:
    """How many algorithms cuBLASLt's heuristic offers for gemm()'s dense GEMM (no workspace):
    the ranks gemm(cublas_algo=) takes; for 'e4m3' with its scale kinds and fast_accum (0 where
    cuBLASLt has none)."""

def cublaslt_problem() -> str:
    """'' when cuBLASLt can be loaded (torch's libcublasLt.so.13 where torch is imported), else
    why."""

def cublaslt_launches() -> int:
    """cuBLASLt GEMMs this process has enqueued or captured."""

def cublaslt_host_ms() -> dict[str, float]:
    """Host ms this process has spent in cuBLASLt's work: 'heuristic', 'check', 'preload',
    'enqueue' (a preload's own enqueue counts in both)."""

def cublaslt_version() -> int:
    """cublasLtGetVersion(), 0 when cuBLASLt cannot be loaded."""

def set_kernel_table(rows: list[dict[str, Any]], all_plans: bool = False) -> None:
    """Replace the process's kernel table: rows {'dtype', 'm', 'n', 'k', 'kernel' (a
    configuration name or 'cublaslt'), 'algo'} (distgemm.runtime.kernel_table). all_plans:
    plans of several ranks consult it too (by default single GEMMs and one-rank plans only)."""

def kernel_table_all_plans() -> bool:
    """Whether plans of several ranks consult the kernel table."""

def kernel_table_size() -> int:
    """Rows of the process's kernel table."""

def gemm_resident_ctas(
    dtype: str, tile_n: int = 0, cuda_device: int = 0, *, config: str = "auto"
) -> int:
    """Resident CTAs of the kernel with tile 128 x tile_n (cluster 2x1) or of ``config``:
    exactly one of them."""

class IpcWorkspace:
    def __init__(self, cuda_device: int, nbytes: int) -> None: ...
    def handle(self) -> bytes: ...
    def open_peers(self, handles: list[bytes], rank: int) -> None: ...
    def bases(self) -> list[int]: ...
    def close_peers(self) -> None: ...
    def free(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> int: ...

class LaunchOrder:
    def __init__(self, cuda_device: int) -> None: ...
    def record(self, stream: int) -> None: ...
    def capture_error(self) -> str:
        """'' or the timeout report of a graph captured on this workspace."""

class RelaxedCaptureMode:
    """Context manager: setup work (allocation, IPC, graph objects) allowed on this thread while
    a stream capture in global mode is in progress."""

    def __init__(self) -> None: ...
    def __enter__(self) -> RelaxedCaptureMode: ...
    def __exit__(self, *exc: object) -> bool: ...

class GraphLauncher:
    def __init__(
        self,
        plan: Plan,
        setup: GraphSetup,
        order: LaunchOrder,
        a: int,
        b: int,
        c: int,
        d: int,
        bias_ptr: int,
        capture_only: bool = False,
        scale_a: int = 0,
        scale_b: int = 0,
    ) -> None:
        """The graph of ``plan`` as built (partial transport, PDL, layout) for setup.rank;
        ValueError when setup.workspace_bytes (if set) is less than the plan's layout needs.
        ``capture_only``: no executable of its own; only ``capture`` (records into a caller's
        stream capture, timeouts reported through ``order.capture_error()``)."""
    def update(
        self, a: int, b: int, c: int, d: int, bias_ptr: int, scale_a: int = 0, scale_b: int = 0
    ) -> bool: ...
    @property
    def rebuilds(self) -> int: ...
    def launch(self, stream: int) -> None: ...
    def capture(
        self,
        stream: int,
        a: int,
        b: int,
        c: int,
        d: int,
        bias_ptr: int,
        scale_a: int = 0,
        scale_b: int = 0,
    ) -> None: ...
    def launch_direct(
        self,
        stream: int,
        a: int,
        b: int,
        c: int,
        d: int,
        bias_ptr: int,
        scale_a: int = 0,
        scale_b: int = 0,
    ) -> None:
        """One launch for these pointers on ``stream`` (not being captured) as plain stream
        work, without a graph: no re-capture, no graph-exec update."""
    def error(self) -> str: ...
    def check(self) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def cuda_device(self) -> int: ...
    def stats(self) -> dict[str, int | bool]: ...

# distgemm's one-shot / two-shot all-reduce, flag and LL (kernel/allreduce.hpp;
# allreduce_rules.cpp, and allreduce_launcher.cpp with the CUDA runtime).
ALLREDUCE_ALGORITHMS: tuple[str, ...]
ALLREDUCE_LINE_ALGORITHMS: tuple[str, ...]
ALLREDUCE_CONTROL_BYTES: int
ALLREDUCE_MAX_CTAS: int
ALLREDUCE_CTA_BYTES: int

def allreduce_problem(algorithm: str, numel: int, element_bytes: int, tp: int) -> str: ...
def allreduce_receive_bytes(algorithm: str, numel: int, element_bytes: int, tp: int) -> int: ...
def allreduce_chunk_elems(numel: int, tp: int) -> int: ...
def allreduce_ctas(
    algorithm: str, numel: int, element_bytes: int, tp: int, resident_ctas: int
) -> int: ...
def allreduce_resident_ctas(cuda_device: int) -> int: ...

class AllReduceLauncher:
    def __init__(self, cuda_device: int, order: LaunchOrder, timeout_s: float) -> None: ...
    def launch(
        self,
        stream: int,
        dtype: str,
        algorithm: str,
        numel: int,
        src: int,
        out: int,
        rank: int,
        receive: list[int],
        parity_bytes: int,
        control: list[int],
        ctas: int = 0,
    ) -> None: ...
    def error(self) -> str: ...

# The fused GEMM + all-reduce (kernel/fused_allreduce.hpp; fused_rules.cpp, and
# fused_launcher.cpp with the CUDA runtime).
FUSED_CONTROL_BYTES: int
FUSED_MAX_SPLITS: int
FUSED_DECODE_MAX_PIECES: int
FUSED_DECODE_MAX_TOKENS: int
FUSED_MAX_TILES: int
FUSED_MAX_CTAS: int
FUSED_LINE_BYTES: int
FUSED_TAILS: tuple[str, ...]  # "one_shot", "two_shot"
FUSED_SUM_SECTION: int
FUSED_FLAG_SECTIONS: int

def fused_kernel(m: int) -> str: ...
def fused_decode_token_width(m: int) -> int: ...
def fused_token_tile(m: int) -> int: ...
def fused_splits(m: int, n: int, k: int, resident_ctas: int) -> int: ...
def fused_ctas(m: int, n: int, k: int, resident_ctas: int) -> int: ...
def fused_decode_pieces(m: int, n: int, k: int, ctas: int) -> list[tuple[int, int]]: ...
def fused_partial_bytes(m: int, n: int, splits: int, element_bytes: int, tp: int) -> int: ...
def fused_sum_bytes(m: int, n: int, element_bytes: int, tail: str) -> int: ...
def fused_shape_problem(m: int, n: int, k: int, splits: int, tp: int) -> str: ...
def fused_tail_problem(tail: str, m: int) -> str: ...
def fused_slice_owner(
    nb: int, tb: int, s: int, n_blocks: int, token_blocks: int, tp: int
) -> int: ...
def fused_flag_word(section: int, index: int) -> int: ...
def fused_sum_buffers_problem(
    dtype: str,
    m: int,
    n: int,
    splits: int,
    tail: str,
    partial: list[int],
    sum: list[int],
    parity_bytes: int,
) -> str: ...
def fused_resident_ctas(dtype: str, m: int, cuda_device: int) -> int: ...

class FusedLauncher:
    def __init__(self, cuda_device: int, order: LaunchOrder, timeout_s: float) -> None: ...
    def launch(
        self,
        stream: int,
        dtype: str,
        m: int,
        n: int,
        k: int,
        a: int,
        w: int,
        out: int,
        bias: int,
        c: int,
        alpha: float,
        beta: float,
        splits: int,
        ctas: int,
        tail: str,
        rank: int,
        partial: list[int],
        sum: list[int],
        parity_bytes: int,
        control: list[int],
    ) -> None: ...
    def error(self) -> str: ...
