"""Hypothesis strategies: draw the sizes, the options, the decay regime and a seed; generate
the arrays from the seed.

Drawing only small integers and floats (never whole arrays) keeps shrinking effective (towards
fewer tokens, fewer heads, smaller dims, contiguous arrays, float32 weights, seed 0) and every
example replays from its `Spec`. Every array is float32 and C-contiguous; the properties lay
them out as the example's `layout` says where they call the kernels (properties.runner.on_backend)
and round them to 16-bit dtypes as their own dtype and the example's `weights` say; the float64
references read the same values, so kernel and reference see exactly the same inputs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import reference as R
from contract import Dims
from kernels.compute_out import RULES_BLOCK_T
from kernels.launches import ROUTES
from kernels.ssd_scan import scan_fits
from properties.profiles import Caps, caps
from properties.profiles import buckets as profile_buckets

PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 61, 127, 251, 257, 509, 1021)
DT_LIMITS = ((0.0, math.inf), (1e-3, math.inf), (0.0, 0.1), (1e-4, 1.0))
# the least chunk that holds two of compute_out's token blocks of the rules' extent
# (RULES_BLOCK_T tokens at most), which its programs over several heads of a group need
SHARED_HEADS_MIN_CHUNK = 2 * RULES_BLOCK_T
# draws per bucket kept (`_fixed_buckets`)
BUCKET_SPREAD = 10
# How the forward's arrays lie in memory where the properties call the kernels (Problem.layout),
# as callers pass them: C-contiguous; "projection": z, x, B, C, dt as views of one projection
# array (mamba_ssm's Mamba2 layer splits its in_proj output so: projection_columns); each
# batch-first array a [1:] slice of one with one batch element more; each array with a token
# axis a [:, 1:] slice of one with one token more; "token_major": z and dt views of the
# projection, x, B, C views of one (batch, channels, seqlen) array transposed, unit stride along
# the tokens (the layer's convolution without causal_conv1d: conv_columns). The first is the
# simplest (shrinking).
LAYOUTS = ("contiguous", "projection", "batch_slice", "token_slice", "token_major")
# the arrays each layout lays out; the others stay C-contiguous (seq_idx's segment ids are made
# C-contiguous by the launchers, its slices are read there)
LAID_OUT = {"contiguous": (), "projection": ("z", "x", "B", "C", "dt"),
            "batch_slice": ("x", "dt", "B", "C", "z", "initial_states", "seq_idx"),
            "token_slice": ("x", "dt", "B", "C", "z", "seq_idx"),
            "token_major": ("z", "x", "B", "C", "dt")}
# The dtype of dt, dt_bias, D and initial_states where the properties run 16-bit activations
# (Problem.weights): float32, or the activations' own (as a 16-bit model's layer passes them;
# contract.weight_dtypes); A is float32 there, or bfloat16 with bfloat16 activations where
# Problem.narrow_A (mamba_ssm's layer keeps A in float32).
WEIGHTS = ("float32", "activation")
WEIGHT_ARRAYS = ("dt", "dt_bias", "D", "initial_states")
# The forward's route where the properties call ssd_forward (Problem.route): the rules' (None:
# on the interpreter the scan wherever it fits) or each of kernels.launches.ROUTES that the
# problem's dstate allows (forward_routes); and its batch slices (Problem.batch_parts): the
# rules' count (None: one on the interpreter) or two, as a GPU runs a large even batch.
BATCH_PARTS_DRAWN = (None, 2)


def forward_routes(dstate: int) -> tuple[str | None, ...]:
    """The routes a forward of this dstate can take (None: the rules'), within the caps (int32
    indices): the scan where its dstate tile fits."""
    return (None, *(r for r in ROUTES if r != "scan" or scan_fits(dstate)))


@dataclass(frozen=True)
class Spec:
    """Everything an example draws; `problem(spec)` turns it into arrays."""

    batch: int
    seqlen: int
    nheads: int
    ngroups: int
    headdim: int
    dstate: int
    chunk_size: int
    D: str | None  # None, 'head' (nheads,) or 'channel' (nheads, headdim)
    z: bool
    dt_mode: str  # 'plain', 'negative' (raw dt < 0 clamped to 0) or 'softplus'
    dt_bias: bool
    dt_limit: tuple[float, float]
    initial_states: bool
    segments: int  # > 1: a seq_idx with that many segments per batch row; 1: no seq_idx
    decay: float  # log10 of the largest |dt * A| * chunk_size (4: exponents reach -1e4 * log2 e)
    decay_spread: float  # decades of |A| across heads, below the largest
    scales: tuple[float, float, float]  # log10 of the scale of x, B, C (fp32 edges: +-8)
    tails: float  # decades of elementwise spread of x, B, C around their scale
    seed: int
    layout: str = "contiguous"  # one of LAYOUTS
    weights: str = "float32"  # one of WEIGHTS
    narrow_A: bool = False
    route: str | None = None  # one of forward_routes(dstate)
    batch_parts: int | None = None  # one of BATCH_PARTS_DRAWN

    @property
    def dims(self) -> Dims:
        return Dims(self.batch, self.seqlen, self.nheads, self.headdim, self.ngroups,
                    self.dstate, self.chunk_size)


@dataclass
class Problem:
    """The arguments of one forward: float32 arrays (C-contiguous), int32 seq_idx, the options;
    the layout the properties pass the arrays in (`layout`, one of LAYOUTS) and the dtype of the
    weights where they run 16-bit activations (`weights`, `narrow_A`: WEIGHTS); the route and
    batch slices the properties ask of ssd_forward (`route`, `batch_parts`: forward_routes,
    BATCH_PARTS_DRAWN); plus the property's own parameters (`params`, JSON-able) and where it
    came from (`spec`)."""

    x: np.ndarray
    dt: np.ndarray
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    chunk_size: int
    D: np.ndarray | None = None
    z: np.ndarray | None = None
    dt_bias: np.ndarray | None = None
    initial_states: np.ndarray | None = None
    seq_idx: np.ndarray | None = None
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)
    params: dict = field(default_factory=dict)
    spec: str = ""
    layout: str = "contiguous"
    weights: str = "float32"
    narrow_A: bool = False
    route: str | None = None
    batch_parts: int | None = None

    ARRAYS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")

    @property
    def dims(self) -> Dims:
        batch, seqlen, nheads, headdim = self.x.shape
        return Dims(batch, seqlen, nheads, headdim, self.B.shape[2], self.B.shape[3],
                    self.chunk_size)

    def options(self) -> dict:
        """Keyword arguments of ssd_forward / the references after (x, dt, A, B, C)."""
        return dict(D=self.D, z=self.z, dt_bias=self.dt_bias, initial_states=self.initial_states,
                    seq_idx=self.seq_idx, dt_softplus=self.dt_softplus, dt_limit=self.dt_limit)

    def replace(self, **changes) -> Problem:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        d = self.dims
        opts = [name for name in ("D", "z", "dt_bias", "initial_states", "seq_idx")
                if getattr(self, name) is not None]
        if self.dt_softplus:
            opts.append("softplus")
        weights = self.weights + (", A narrow" if self.narrow_A else "")
        return (f"batch={d.batch} seqlen={d.seqlen} nheads={d.nheads} ngroups={d.ngroups} "
                f"headdim={d.headdim} dstate={d.dstate} chunk_size={d.chunk_size} "
                f"dt_limit={self.dt_limit} options={opts} layout={self.layout} "
                f"weights={weights} route={self.route} batch_parts={self.batch_parts} "
                f"params={self.params}")

    def save(self, path, prop: str):
        """A self-contained reproducer: every array, the options, the layout and weights, the
        property's name."""
        arrays = {k: getattr(self, k) for k in self.ARRAYS if getattr(self, k) is not None}
        meta = dict(property=prop, chunk_size=self.chunk_size, dt_softplus=self.dt_softplus,
                    dt_limit=list(self.dt_limit), params=self.params, spec=self.spec,
                    layout=self.layout, weights=self.weights, narrow_A=self.narrow_A,
                    route=self.route, batch_parts=self.batch_parts)
        np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path) -> tuple[str, Problem]:
        """(property name, problem) of a reproducer written by `save`."""
        with np.load(path, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            arrays = {k: f[k] for k in cls.ARRAYS if k in f}
        # a reproducer stored before layouts, weights and routes were drawn: contiguous, float32,
        # the rules' route
        problem = cls(chunk_size=int(meta["chunk_size"]), dt_softplus=bool(meta["dt_softplus"]),
                      dt_limit=tuple(float(v) for v in meta["dt_limit"]), params=meta["params"],
                      spec=meta["spec"], layout=meta.get("layout", "contiguous"),
                      weights=meta.get("weights", "float32"),
                      narrow_A=bool(meta.get("narrow_A", False)), route=meta.get("route"),
                      batch_parts=meta.get("batch_parts"), **arrays)
        return meta["property"], problem


def _blocked(tiles, lo: int, cap: int):
    """A size by the blocks of a tile it makes: one of `tiles`, 1, 2 or 3 blocks, the last full
    or partial (each class of the reach model about as likely), clamped to [lo, cap]."""
    def size(tile, blocks, full, rest):
        return min(cap, max(lo, (blocks - 1) * tile + (tile if full else 1 + rest % (tile - 1))))
    return st.builds(size, st.sampled_from(sorted(t for t in tiles if t > 1)), st.integers(1, 3),
                     st.booleans(), st.integers(0, 1 << 16))


def _seqlens(cap: int, chunk_size: int, lo: int = 1):
    """seqlen from lo: the edges of one to four chunks and of whole token blocks (the kernels'
    block counts, full and partial), multiples of chunk_size and +-1, primes, anything up to
    the cap."""
    edges = [1, chunk_size - 1, chunk_size, chunk_size + 1, 2 * chunk_size, 2 * chunk_size + 1,
             3 * chunk_size, 4 * chunk_size + 1, 64, 96, 128, 192, 256]
    multiples = [k * chunk_size + d for k in range(1, cap // chunk_size + 1) for d in (-1, 0, 1)]
    edges, special = ([n for n in sorted(set(values)) if lo <= n <= cap]
                      for values in (edges, [1, *multiples, *PRIMES]))
    options = [st.sampled_from(v) for v in (edges, special) if v]
    # by whole and partial chunks (twice as likely: the chunk count is a class of every kernel)
    # and by token blocks
    by_chunks = _blocked({chunk_size}, lo, cap)
    return st.one_of(by_chunks, by_chunks, _blocked({16, 32, 64}, lo, cap), *options,
                     st.integers(lo, cap))


def _dims_upto(cap: int):
    """headdim / dstate: powers of two and one each side of them (a tile's last block full or
    partial) and any size (masked, padded tiles), 1 included."""
    edges = sorted({(1 << k) + d for k in range(cap.bit_length()) for d in (-1, 0, 1)
                    if 1 <= (1 << k) + d <= cap})
    return st.one_of(st.sampled_from(edges), _blocked((16, 32, 64), 1, cap),
                     st.integers(1, cap))


def _wide_dims(cap: int, wide_cap: int):
    """A wide example's headdim / dstate: past `cap` (each block count and last-block class of
    the tiles up to `wide_cap`: multiples of 32 and one more) or within it."""
    if wide_cap <= cap:
        return _dims_upto(wide_cap)
    edges = sorted({n for k in range(1, wide_cap // 32 + 1) for n in (32 * k, 32 * k + 1)
                    if cap < n <= wide_cap} | {wide_cap})
    return st.one_of(st.sampled_from(edges), _blocked((32, 64, 128), cap + 1, wide_cap),
                     st.integers(cap + 1, wide_cap), _dims_upto(cap))


def drawable(d: Dims, c: Caps) -> bool:
    """Whether `specs` can draw a problem of these dimensions under caps `c` (the reach model's
    domain): within the caps, or a wide example."""
    if d.chunk_size not in c.chunk_sizes or d.nheads % d.ngroups or d.batch > c.batch:
        return False
    if (d.seqlen <= c.seqlen and d.nheads <= c.nheads and d.headdim <= c.headdim
            and d.dstate <= c.dstate):
        return True
    return (c.wide_cost > 0 and d.seqlen <= c.wide_seqlen and d.nheads <= c.wide_nheads
            and d.headdim <= c.wide_headdim and d.dstate <= c.wide_dstate
            and d.batch * c.wide_seqlen * d.nheads * d.headdim * d.dstate <= c.wide_cost)


@dataclass(frozen=True)
class Bucket:
    """What of an example decides the kernels' specializations on the GPU (together with
    seqlen, of which they see little: a unit dimension, divisibility by 16, the chunk count):
    the other sizes, the chunk size and the options. Within one bucket, examples differ in
    seqlen, segments, decays, values and seed."""

    batch: int
    nheads: int
    ngroups: int
    headdim: int
    dstate: int
    chunk_size: int
    D: str | None
    z: bool
    dt_mode: str
    dt_bias: bool
    dt_limit: tuple[float, float]
    initial_states: bool
    seq_idx: bool  # a seq_idx (of 2 segments or more, where seqlen allows)
    wide: bool
    # how the arrays lie and the weights' dtypes decide specializations too (strides'
    # divisibility, dtypes)
    layout: str = "contiguous"
    weights: str = "float32"
    narrow_A: bool = False
    # the route and the batch slices decide the launches
    route: str | None = None
    batch_parts: int | None = None


@st.composite
def _buckets(draw, c: Caps, segments: bool | None, gate: bool | None,
             initial_states: bool | None, carried: bool, shared_heads: bool, wide: bool):
    per_group = 2 if shared_heads else 1  # the fewest heads per group

    def chunk_sizes_below(seqlen_cap):
        return [q for q in c.chunk_sizes if (not carried or q < seqlen_cap)
                and (not shared_heads or q >= SHARED_HEADS_MIN_CHUNK)]
    chunk_sizes = chunk_sizes_below(c.seqlen)
    if not chunk_sizes or c.nheads < per_group:
        raise ValueError(f"specs: the caps {c} hold no problem with carried={carried}, "
                         f"shared_heads={shared_heads}")
    wide_chunks = chunk_sizes_below(c.wide_seqlen) if c.wide_cost and wide else []
    wide = bool(wide_chunks)
    batch = draw(st.integers(1, c.batch))
    if wide:  # each size up to its wide cap while batch x wide_seqlen x ... stays in wide_cost
        budget = c.wide_cost // (batch * c.wide_seqlen)
        nheads_cap = max(per_group, min(c.wide_nheads, budget))
        ngroups = draw(st.integers(1, nheads_cap // per_group))
        nheads = ngroups * draw(st.integers(per_group, nheads_cap // ngroups))
        headdim = draw(_wide_dims(c.headdim, min(c.wide_headdim, max(1, budget // nheads))))
        dstate = draw(_wide_dims(c.dstate,
                                 min(c.wide_dstate, max(1, budget // (nheads * headdim)))))
    else:
        ngroups = draw(st.integers(1, c.nheads // per_group))
        nheads = ngroups * draw(st.integers(per_group, c.nheads // ngroups))
        headdim = draw(_dims_upto(c.headdim))
        dstate = draw(_dims_upto(c.dstate))
    dt_mode = draw(st.sampled_from(["plain", "negative", "softplus"]))
    D = draw(st.sampled_from([None, "head", "channel"]))
    z = draw(st.booleans()) if gate is None else gate
    dt_bias = True if dt_mode == "softplus" else draw(st.booleans())
    dt_limit = draw(st.sampled_from(DT_LIMITS))
    initial = draw(st.booleans()) if initial_states is None else initial_states
    seq_idx = draw(st.sampled_from([False, False, True, True, True])) if segments is None \
        else segments
    # the chunk size late: Hypothesis varies late draws between examples more than early ones
    chunk_size = draw(st.sampled_from(wide_chunks if wide else chunk_sizes))
    # how the arrays lie and the weights' dtypes last: they decide no size
    layout = draw(st.sampled_from(LAYOUTS))
    weights = draw(st.sampled_from(WEIGHTS))
    narrow_A = draw(st.booleans())
    route = draw(st.sampled_from(forward_routes(dstate)))
    batch_parts = draw(st.sampled_from(BATCH_PARTS_DRAWN))
    return Bucket(batch=batch, nheads=nheads, ngroups=ngroups, headdim=headdim, dstate=dstate,
                  chunk_size=chunk_size, D=D, z=z, dt_mode=dt_mode, dt_bias=dt_bias,
                  dt_limit=dt_limit, initial_states=initial, seq_idx=seq_idx, wide=wide,
                  layout=layout, weights=weights, narrow_A=narrow_A, route=route,
                  batch_parts=batch_parts)


@functools.cache
def _fixed_buckets(c: Caps, count: int, **kwargs) -> tuple[Bucket, ...]:
    """`count` distinct buckets of `_buckets(c, **kwargs)`, the same ones on every run: its
    simplest, then every SPREAD-th of the distinct ones a derandomized run draws (Hypothesis'
    first draws are near the simplest)."""
    found: list[Bucket] = []

    @settings(max_examples=BUCKET_SPREAD * count, derandomize=True, database=None,
              deadline=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(_buckets(c, **kwargs))
    def collect(bucket):
        if bucket not in found:
            found.append(bucket)
    collect()
    return tuple(found[::max(1, len(found) // count)][:count])


def specs(limits: Caps | None = None, *, segments: bool | None = None,
          ragged: bool | None = None, extreme: bool = False, gate: bool | None = None,
          initial_states: bool | None = None, min_seqlen: int = 1,
          carried: bool = False, shared_heads: bool = False, wide: bool = False,
          buckets: int | None = None):
    """Specs within `limits` (default: the active profile's caps).

    `segments`, `gate`, `initial_states`: force the option on (True) or off (False); `ragged`:
    force seqlen % chunk_size != 0; `extreme`: decays of 1e3..1e4 per chunk and values near the
    fp32 edges; `carried`: two chunks or more, every head's decay over a chunk 10^0.25..10^1.25 (the
    state carried into a chunk is then of the order of the chunk's own increment, so an error in
    the carry alone, e.g. one token's decay, shows above the bound; elsewhere the carry is ~1 or
    ~0). A chunk size whose two chunks exceed the caps is not drawn then. `wide`: a wide example
    where the caps have wide_* sizes and the other constraints allow one (`drawable`): short,
    past the kernels' largest tiles. `shared_heads`: two
    heads or more per group and chunks of SHARED_HEADS_MIN_CHUNK tokens or more, where compute_out
    can run a program over several heads of a group (a power of two that divides the group's
    heads: an odd count still runs one head per program).

    `buckets` (default: the profile's, `profiles.buckets()`): where > 0, every example's sizes
    and options come from that many fixed buckets (`Bucket`), so that on the GPU the kernels'
    specializations repeat across examples instead of compiling anew for nearly every one; 0:
    every example draws its own.
    """
    c = limits or caps()
    count = profile_buckets() if buckets is None else buckets
    kwargs = dict(segments=segments, gate=gate, initial_states=initial_states, carried=carried,
                  shared_heads=shared_heads, wide=wide)
    bucket = (st.sampled_from(_fixed_buckets(c, count, **kwargs)) if count
              else _buckets(c, **kwargs))
    return _specs(c, bucket, ragged=ragged, extreme=extreme, min_seqlen=min_seqlen,
                  carried=carried)


@st.composite
def _specs(draw, c: Caps, bucket, ragged, extreme, min_seqlen, carried):
    b = draw(bucket)
    if extreme:
        decay = draw(st.floats(3.0, 4.0))
        scales = [draw(st.floats(-8.0, 8.0)) for _ in range(3)]
        # keep the product of the three scales (a term of y) inside [1e-20, 1e12]: with the
        # tails (at most 1e9 more) y stays finite; what falls below 2^-126 is the bound's
        # flush-to-zero allowance
        excess = max(sum(scales) - 12.0, 0.0) + min(sum(scales) + 20.0, 0.0)
        scales = tuple(s - excess / 3.0 for s in scales)
    elif carried:
        decay = draw(st.floats(0.25, 1.25))
        scales = tuple(draw(st.floats(-3.0, 3.0)) for _ in range(3))
    else:
        decay = draw(st.floats(-3.0, 4.0))
        scales = tuple(draw(st.floats(-3.0, 3.0)) for _ in range(3))
    decay_spread = draw(st.floats(0.0, 0.5 if carried else 6.0))
    tails = draw(st.sampled_from([0.0, 0.0, 1.0, 3.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    # seqlen last: with the chunk size it decides most block counts
    seqlen_cap = c.wide_seqlen if b.wide else c.seqlen
    lo = max(min_seqlen, b.chunk_size + 1 if carried else 1)
    seqlens = _seqlens(seqlen_cap, b.chunk_size, lo)
    if ragged:
        seqlens = seqlens.filter(lambda n: n % b.chunk_size != 0)
    seqlen = draw(seqlens)
    n_segments = 1
    if b.seq_idx and seqlen > 1:
        n_segments = min(seqlen, draw(st.sampled_from([2, 3, 5]) | st.integers(2, 6)))
    return Spec(
        batch=b.batch, seqlen=seqlen, nheads=b.nheads, ngroups=b.ngroups, headdim=b.headdim,
        dstate=b.dstate, chunk_size=b.chunk_size, D=b.D, z=b.z, dt_mode=b.dt_mode,
        dt_bias=b.dt_bias, dt_limit=b.dt_limit, initial_states=b.initial_states,
        segments=n_segments, decay=decay, decay_spread=decay_spread, scales=scales,
        tails=tails, seed=seed, layout=b.layout, weights=b.weights, narrow_A=b.narrow_A,
        route=b.route, batch_parts=b.batch_parts)


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _values(rng, shape, scale_log10: float, tails: float) -> np.ndarray:
    """Normal values times 10^scale, spread elementwise over +-`tails` decades, some exact zeros."""
    v = rng.standard_normal(shape) * 10.0 ** scale_log10
    if tails:
        v *= 10.0 ** rng.uniform(-tails, tails, shape)
    v[rng.random(shape) < 0.05] = 0.0
    return _f32(v)


def _raw_dt(rng, spec: Spec, shape):
    if spec.dt_mode == "plain":
        lo = rng.uniform(-4.0, -1.0)
        return _f32(10.0 ** rng.uniform(lo, lo + rng.uniform(0.0, 3.0), shape))
    if spec.dt_mode == "negative":
        return _f32(rng.uniform(-0.5, 1.0, shape) * 10.0 ** rng.uniform(-3.0, 0.0))
    # softplus: v = dt + dt_bias from about -20 (softplus ~ 2e-9) to beyond the threshold 20
    return _f32(rng.normal(rng.uniform(-4.0, 2.0), rng.uniform(0.1, 8.0), shape))


def _seq_idx(rng, spec: Spec) -> np.ndarray:
    """Sorted segment ids with spec.segments segments per row (cuts anywhere, also at 1 and at
    chunk boundaries)."""
    rows = []
    for _ in range(spec.batch):
        candidates = np.arange(1, spec.seqlen)
        boundaries = [k * spec.chunk_size for k in range(1, spec.seqlen // spec.chunk_size + 1)
                      if k * spec.chunk_size < spec.seqlen]
        if boundaries and rng.random() < 0.5:
            candidates = np.array(boundaries + [1])
        cuts = rng.choice(candidates, size=min(spec.segments - 1, len(candidates)), replace=False)
        row = np.zeros(spec.seqlen, dtype=np.int32)
        for cut in cuts:
            row[cut:] += 1
        rows.append(row)
    return np.stack(rows)


def problem(spec: Spec) -> Problem:
    """The arrays of `spec`, generated from its seed (deterministic)."""
    rng = np.random.default_rng(spec.seed)
    d = spec.dims
    x = _values(rng, d.shape("x"), spec.scales[0], spec.tails)
    B = _values(rng, d.shape("B"), spec.scales[1], spec.tails)
    C = _values(rng, d.shape("C"), spec.scales[2], spec.tails)
    dt = _raw_dt(rng, spec, d.shape("dt"))
    dt_bias = _f32(rng.normal(-3.0, 3.0, d.nheads)) if spec.dt_bias else None
    softplus = spec.dt_mode == "softplus"
    # A from the processed dt, so that the largest |dt * A| * chunk_size of each head is
    # 10^(decay - spread_h): log-uniform over many decades across heads
    dt_out, _ = R.chunk_cumsum_ref(dt, -np.ones(d.nheads, np.float32), spec.chunk_size,
                                   dt_bias, softplus, spec.dt_limit)
    dt_max = dt_out.max(axis=(0, 2, 3))
    dt_max = np.where(dt_max > 0, dt_max, 1.0)
    spread = rng.uniform(0.0, spec.decay_spread, d.nheads)
    log_a = np.clip(spec.decay - spread - np.log10(dt_max * spec.chunk_size), -30.0, 30.0)
    A = -_f32(10.0 ** log_a)
    D = None
    if spec.D == "head":
        D = _f32(rng.standard_normal(d.nheads))
    elif spec.D == "channel":
        D = _f32(rng.standard_normal(d.shape("D")))
    z = _f32(rng.standard_normal(d.shape("z")) * 3.0) if spec.z else None
    init = (_values(rng, d.shape("initial_states"), spec.scales[0], spec.tails)
            if spec.initial_states else None)
    seq_idx = _seq_idx(rng, spec) if spec.segments > 1 else None
    return Problem(x=x, dt=dt, A=A, B=B, C=C, chunk_size=spec.chunk_size, D=D, z=z,
                   dt_bias=dt_bias, initial_states=init, seq_idx=seq_idx, dt_softplus=softplus,
                   dt_limit=spec.dt_limit, spec=repr(spec), layout=spec.layout,
                   weights=spec.weights, narrow_A=spec.narrow_A, route=spec.route,
                   batch_parts=spec.batch_parts)


def projection_columns(d: Dims) -> dict[str, tuple[int, int]]:
    """Each array's (first column, columns) in a row of the "projection" layout's array: z, x,
    B, C, dt in turn, nheads headdim + nheads headdim + ngroups dstate + ngroups dstate + nheads
    columns (mamba_ssm's in_proj output, without its z columns where z is absent)."""
    widths = {"z": d.nheads * d.headdim, "x": d.nheads * d.headdim, "B": d.ngroups * d.dstate,
              "C": d.ngroups * d.dstate, "dt": d.nheads}
    starts = itertools.accumulate(widths.values(), initial=0)
    return {name: (start, width) for (name, width), start in zip(widths.items(), starts)}


def conv_columns(d: Dims) -> dict[str, tuple[int, int]]:
    """Each array's (first channel, channels) in the "token_major" layout's (batch, channels,
    seqlen) array: x, B, C in turn (the layer's convolution output, xBC)."""
    return {name: (start - d.nheads * d.headdim, width)
            for name, (start, width) in projection_columns(d).items() if name in ("x", "B", "C")}


def layout_strides(layout: str, d: Dims, name: str) -> tuple[int, ...]:
    """The strides in elements of array `name` (its contract shape for `d`) in `layout`, as
    properties.runner.on_backend's views have them (the reach model's stand-ins take them): a
    batch slice is a C-contiguous array (its first element offset)."""
    shape = list(d.shape(name))
    if name not in LAID_OUT[layout] or layout == "batch_slice":
        return _c_strides(shape)
    if layout == "token_slice":
        shape[1] += 1
        return _c_strides(shape)
    if layout == "token_major" and name in ("x", "B", "C"):
        channels = sum(w for _, w in conv_columns(d).values())
        return (channels * d.seqlen, 1, *(d.seqlen * s for s in _c_strides(shape[2:])))
    width = sum(w for _, w in projection_columns(d).values())
    return (d.seqlen * width, width, *_c_strides(shape[2:]))


def _c_strides(shape) -> tuple[int, ...]:
    return tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))


def spec_of(d: Dims, options: dict, seed: int = 0) -> Spec:
    """The Spec of a problem of these dimensions and options (as the reach model names them:
    D, z, dt_bias, softplus, dt_limit, initial_states, seq_idx, layout, weights, narrow_A, route,
    batch_parts),
    moderate decays and values."""
    return Spec(batch=d.batch, seqlen=d.seqlen, nheads=d.nheads, ngroups=d.ngroups,
                headdim=d.headdim, dstate=d.dstate, chunk_size=d.chunk_size,
                D=options.get("D"), z=bool(options.get("z")),
                dt_mode="softplus" if options.get("softplus") else "plain",
                dt_bias=bool(options.get("dt_bias") or options.get("softplus")),
                dt_limit=tuple(options.get("dt_limit", (0.0, math.inf))),
                initial_states=bool(options.get("initial_states")),
                segments=min(3, d.seqlen) if options.get("seq_idx") else 1, decay=0.5,
                decay_spread=1.0, scales=(0.0, 0.0, 0.0), tails=1.0, seed=seed,
                layout=options.get("layout", "contiguous"),
                weights=options.get("weights", "float32"),
                narrow_A=bool(options.get("narrow_A")), route=options.get("route"),
                batch_parts=options.get("batch_parts"))


def problems(**kwargs):
    """Problems (arrays generated from a drawn Spec); kwargs as `specs`."""
    return specs(**kwargs).map(problem)


# --------------------------------------------------------------------------------------------
# Call signatures, for the plan cache (kernels.plan.plan_of)


@dataclass(frozen=True)
class Signature:
    """What a plan may depend on, without values: the dimensions, each array's dtype and layout,
    the options. `strided`: the arrays passed as a strided view (every other element of a
    wider array's last axis: read in place) rather than C-contiguous; `backwards`: those passed
    as a reversed view (a negative stride: copied to C-contiguous per call, Plan.copies)."""

    dims: Dims
    dtype: str  # x, B, C, z: 'float32', 'float16' or 'bfloat16'
    D: str | None
    z: bool
    dt_bias: bool
    initial_states: bool
    seq_idx: bool
    dt_softplus: bool
    dt_limit: tuple[float, float]
    batch_parts: int | None
    strided: frozenset = frozenset()
    states: str | None = None  # state_dtype (None or 'float32': every activation dtype takes it)
    backwards: frozenset = frozenset()
    weights: str = "float32"  # dt, dt_bias, D, initial_states: 'float32' or 'activation' (x's)
    narrow_A: bool = False  # A in x's dtype (16-bit activations)
    seq_idx_dtype: str = "int32"  # or 'int64'
    route: str | None = None  # one of forward_routes(dims.dstate)

    def arguments(self, xp=np) -> dict:
        """ssd_forward's keyword arguments of this signature, as arrays of module `xp` (values
        random; a plan reads none). bfloat16 on the GPU comes as torch tensors (CuPy has no
        bfloat16), every array of the call alike, each read forwards (`backwards` does not apply
        to them: a torch tensor has no negative stride)."""
        d, rng = self.dims, np.random.default_rng(0)
        narrow = ml_dtypes.bfloat16 if self.dtype == "bfloat16" else np.dtype(self.dtype)
        weight = narrow if self.weights == "activation" else np.float32
        backend = "interpreter" if xp is np else "torch" if self.dtype == "bfloat16" else "gpu"
        place = functools.partial(to_backend, backend=backend)

        def array(name: str, dtype, shape=None, negative=False):
            shape = d.shape(name) if shape is None else shape
            values = rng.standard_normal(shape)
            values = (-abs(values) if negative else values).astype(dtype)
            step = 2 if name in self.strided else 1  # every other element of a longer last axis
            wide = np.repeat(values, step, axis=-1)
            # the same values read backwards from a reversed copy (not for torch tensors, which
            # have no negative strides: read forwards there)
            if name in self.backwards and backend != "torch":
                return place(np.ascontiguousarray(wide[..., ::-1]))[..., ::-step]
            return place(wide)[..., ::step]
        segments = np.repeat(np.arange(2)[None], d.batch, 0).repeat(-(-d.seqlen // 2), 1)
        return dict(
            x=array("x", narrow), dt=array("dt", weight),
            A=array("A", narrow if self.narrow_A else np.float32, negative=True),
            B=array("B", narrow), C=array("C", narrow), chunk_size=d.chunk_size,
            D=None if self.D is None else array("D", weight, (d.nheads,) if self.D == "head"
                                                   else None),
            z=array("z", narrow) if self.z else None,
            dt_bias=array("dt_bias", weight) if self.dt_bias else None,
            initial_states=array("initial_states", weight) if self.initial_states else None,
            seq_idx=(place(np.ascontiguousarray(segments[:, :d.seqlen], self.seq_idx_dtype))
                     if self.seq_idx else None),
            dt_softplus=self.dt_softplus, dt_limit=self.dt_limit, batch_parts=self.batch_parts,
            state_dtype=self.states, route=self.route)


def to_backend(a, backend: str):
    """A NumPy array on `backend`: 'gpu' (CuPy), 'torch' (a torch CUDA tensor; a bfloat16 array
    as the same bits) or 'interpreter' (NumPy)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    if backend == "torch":
        import torch
        if a.dtype == ml_dtypes.bfloat16:
            return torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
        return torch.from_numpy(a).cuda()
    if backend == "gpu":
        import cupy
        return cupy.asarray(a)
    return a


STRIDABLE = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
NARROW_DTYPES = ("float16", "bfloat16")


@st.composite
def _signature(draw) -> Signature:
    ngroups = draw(st.sampled_from((1, 2)))
    dims = Dims(draw(st.integers(1, 4)), draw(st.integers(1, 300)),
                ngroups * draw(st.integers(1, 3)), draw(st.integers(1, 80)), ngroups,
                draw(DSTATES), draw(st.sampled_from(CHUNK_SIZES)))
    dtype = draw(st.sampled_from(("float32",) + NARROW_DTYPES))
    narrow = dtype in NARROW_DTYPES
    return Signature(dims, dtype,
                     draw(st.sampled_from((None, "head", "channel"))), draw(st.booleans()),
                     draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
                     draw(st.booleans()), draw(st.sampled_from(DT_LIMITS)),
                     draw(st.sampled_from(BATCH_PARTS)),
                     frozenset(draw(st.lists(st.sampled_from(STRIDABLE), max_size=2))),
                     draw(st.sampled_from(STATES)),
                     frozenset(draw(st.lists(st.sampled_from(STRIDABLE), max_size=1))),
                     draw(st.sampled_from(WEIGHTS)) if narrow else "float32",
                     draw(st.booleans()) if narrow else False,
                     draw(st.sampled_from(SEQ_IDX_DTYPES)),
                     draw(st.sampled_from(forward_routes(dims.dstate))))


CHUNK_SIZES = (16, 32, 64, 128, 256)
# dstate past the scan's largest tile (kernels.ssd_scan.SCAN_MAX_DSTATE) plans the three kernels on
# any device, the interpreter's too: chunk states, whose dtype follows the activations'
DSTATES = st.one_of(st.integers(1, 80), st.sampled_from((144, 200)))
BATCH_PARTS = (None, 1, 2, 3)
STATES = (None, "float32")
WEIGHTS = ("float32", "activation")
SEQ_IDX_DTYPES = ("int32", "int64")


def _other(values, current):
    """One of `values` other than `current`."""
    return st.sampled_from([v for v in values if v != current])


# What each change of _mutations changes, as (Call's field, aspect) pairs, aspects:
# 'shape', 'dtype', 'strides' and 'presence' of an array, 'value' of any other parameter
# (tests/test_plan.py: every field of Call in every aspect it has)
_BATCH_FIRST = ("x", "dt", "B", "C", "z", "initial_states", "seq_idx")
MUTATION_CHANGES = {
    "batch": {(n, "shape") for n in _BATCH_FIRST},
    "seqlen": {(n, "shape") for n in ("x", "dt", "B", "C", "z", "seq_idx")},
    "nheads": {(n, "shape") for n in ("x", "dt", "A", "D", "z", "dt_bias", "initial_states")},
    "headdim": {(n, "shape") for n in ("x", "z", "initial_states")},
    "ngroups": {(n, "shape") for n in ("B", "C")},
    "dstate": {(n, "shape") for n in ("B", "C", "initial_states")},
    "chunk_size": {("chunk_size", "value")},
    "dtype": {(n, "dtype") for n in ("x", "B", "C", "z")},
    "weights": {(n, "dtype") for n in ("dt", "D", "dt_bias", "initial_states")},
    "narrow_A": {("A", "dtype")},
    "seq_idx_dtype": {("seq_idx", "dtype")},
    "D": {("D", "presence"), ("D", "shape")},
    **{f: {(f, "presence")} for f in ("z", "dt_bias", "initial_states", "seq_idx")},
    "dt_softplus": {("dt_softplus", "value")},
    "dt_limit": {("dt_limit", "value")},
    "batch_parts": {("batch_parts", "value")},
    "strided": {(n, "strides") for n in STRIDABLE},
    "backwards": {(n, "strides") for n in STRIDABLE},
    "states": {("state_dtype", "value")},
    "route": {("route", "value")},
}


def _mutations(s: Signature) -> dict:
    """{change: strategy of signatures that differ from `s` in that change alone} (each draws a
    value other than s's) for every change of MUTATION_CHANGES that `s` admits: the weights' and
    A's dtype where the activations are 16-bit, the groups where the heads divide."""
    d = s.dims
    dims = lambda **kw: dataclasses.replace(s, dims=dataclasses.replace(d, **kw))
    replace = functools.partial(dataclasses.replace, s)
    narrow = s.dtype in NARROW_DTYPES
    per_group = d.nheads // d.ngroups
    groups = [g for g in (1, 2) if g != d.ngroups and d.nheads % g == 0]
    changes = {
        "batch": st.builds(lambda v: dims(batch=v), _other(range(1, 5), d.batch)),
        "seqlen": st.builds(lambda v: dims(seqlen=v),
                            st.integers(1, 300).filter(lambda v: v != d.seqlen)),
        "nheads": st.builds(lambda v: dims(nheads=d.ngroups * v), _other(range(1, 4), per_group)),
        "headdim": st.builds(lambda v: dims(headdim=v),
                             st.integers(1, 80).filter(lambda v: v != d.headdim)),
        "ngroups": st.builds(lambda v: dims(ngroups=v), st.sampled_from(groups)) if groups
        else None,
        # a dstate the signature's route runs (the scan's tile fits)
        "dstate": st.builds(lambda v: dims(dstate=v), DSTATES.filter(
            lambda v: v != d.dstate and s.route in forward_routes(v))),
        "chunk_size": st.builds(lambda v: dims(chunk_size=v), _other(CHUNK_SIZES, d.chunk_size)),
        # a 16-bit dtype goes to the other 16-bit one as often as to float32 (equal item sizes
        # must not share a plan)
        "dtype": st.builds(lambda v: replace(dtype=v, weights="float32", narrow_A=False)
                           if v == "float32" else replace(dtype=v),
                           _other(("float32",) + NARROW_DTYPES, s.dtype)),
        "weights": st.builds(lambda v: replace(weights=v), _other(WEIGHTS, s.weights))
        if narrow else None,
        "narrow_A": st.just(replace(narrow_A=not s.narrow_A)) if narrow else None,
        "seq_idx_dtype": st.builds(lambda v: replace(seq_idx=True, seq_idx_dtype=v),
                                   _other(SEQ_IDX_DTYPES, s.seq_idx_dtype)) if s.seq_idx
        else None,
        "D": st.builds(lambda v: replace(D=v), _other((None, "head", "channel"), s.D)),
        **{f: st.just(replace(**{f: not getattr(s, f)}))
           for f in ("z", "dt_bias", "initial_states", "seq_idx", "dt_softplus")},
        "dt_limit": st.builds(lambda v: replace(dt_limit=v), _other(DT_LIMITS, s.dt_limit)),
        "batch_parts": st.builds(lambda v: replace(batch_parts=v),
                                 _other(BATCH_PARTS, s.batch_parts)),
        "strided": st.builds(lambda name: replace(strided=s.strided ^ {name}),
                             st.sampled_from(STRIDABLE)),
        "backwards": st.builds(lambda name: replace(backwards=s.backwards ^ {name}),
                               st.sampled_from(STRIDABLE)),
        "states": st.builds(lambda v: replace(states=v), _other(STATES, s.states)),
        "route": st.builds(lambda v: replace(route=v), _other(forward_routes(d.dstate), s.route)),
    }
    return {name: strategy for name, strategy in changes.items() if strategy is not None}


@st.composite
def signatures(draw) -> list[Signature]:
    """A call signature, then a few more, each one change away from one drawn before it (so
    that a cache key blind to that change would hand out the earlier signature's plan)."""
    drawn = [draw(_signature())]
    for _ in range(draw(st.integers(2, 8))):
        mutations = _mutations(draw(st.sampled_from(drawn)))
        drawn.append(draw(mutations[draw(st.sampled_from(sorted(mutations)))]))
    return drawn
