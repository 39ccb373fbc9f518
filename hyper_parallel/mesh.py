"""ParallelDims: the one source of truth for the parallel degrees and the device meshes.

The algebra (docs/design.md §2, after TorchTitan's ParallelDims):

    dp_replicate * dp_shard * cp * ulysses * tp * pp == world_size      (EP is not a factor: it borrows ranks)

Every view of the ranks is an unflattening of one 1-D world mesh, so DTensors placed on different
views share a root mesh and compose (``DeviceMesh._concatenate``). TP is always the innermost
(contiguous) dim.

    dense   (dp_replicate, dp_shard, cp, tp)      every dim present, size 1 allowed
    (with pp > 1 every view gets ``pp`` as its outermost dim: one stage = a contiguous block of ranks;
    with ulysses > 1 the dense and batch views get ``ulysses`` between cp and tp, as VeOmni's mesh)
    fsdp    (dp_replicate, fsdp, tp)              fsdp   = dp_shard * cp * ulysses   parameter sharding
    batch   (dp, cp, tp)                          dp     = dp_replicate * dp_shard   data loading
    loss    (dp_cp, tp)                           dp_cp  = dp_replicate * dp_shard * cp * ulysses
    sparse  (dp_replicate, efsdp, ep[, etp])      efsdp  = dp_shard * cp * tp // (ep * etp)

The sequence is split over cp * ulysses ranks: cp exchanges K/V (all-gather or a ring) and ulysses
reshards heads by all-to-all (2-D sequence parallelism, VeOmni's ``ulysses`` x ``cp``, USP).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hyper_parallel.mesh_dims import DEGREE_KEYS, DEGREE_NAMES, STAGE_DEGREES, WORLD_FACTORS, MeshDim, degrees_label


@functools.lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    """Divisors of ``n`` in increasing order, none for n < 1 (cached: valid_choices asks for the same
    few numbers thousands of times)."""
    if n < 1:
        return ()
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(small + [n // d for d in reversed(small) if d * d != n])


def _nearest_multiple(value: int, base: int) -> int:
    """The multiple of ``base`` closest to ``value`` (ties go up), never below ``base``."""
    down = max(base, (value // base) * base)
    up = -(-value // base) * base
    return down if value - down < up - value else up


def dp_shard_left(world_size: int, degrees: Mapping[str, int]) -> int | None:
    """What ``dp_shard=-1`` infers: ``world_size // (dp_replicate * cp * ulysses * tp * pp)``, None when that
    does not divide."""
    others = math.prod(degrees.get(name, 1) for name in WORLD_FACTORS if name != MeshDim.DP_SHARD)
    return world_size // others if others > 0 and world_size % others == 0 else None


MAX_WORLD_SIZE = 2**17
"""The most ranks a layout may have (131,072, above the largest clusters trained on): ``check`` and the planner
build every rank's groups, so 2**30 ranks would exhaust memory instead of being refused."""


def check_world_size(value: object, name: str = "world_size") -> int:
    """A number of ranks: a whole number in 1 .. ``MAX_WORLD_SIZE``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if value > MAX_WORLD_SIZE:
        raise ValueError(
            f"{name}={value} is above {MAX_WORLD_SIZE:,} ranks (2**17, more than the largest clusters trained on; "
            f"every rank's groups are built); use at most {MAX_WORLD_SIZE}"
        )
    return int(value)


@dataclass(frozen=True)
class ParallelDims:
    """Parallel degrees of one run; constructing an invalid combination raises ``ValueError``.

    ``dp_shard=-1`` means "whatever is left": ``world_size // (dp_replicate * cp * ulysses * tp * pp)``.
    """

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = -1
    cp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    ulysses: int = 1  # last, so positional arguments keep their meaning

    def __post_init__(self) -> None:
        for name in DEGREE_KEYS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            value = int(value)
            object.__setattr__(self, name, value)
            if value < 1 and not (name == MeshDim.DP_SHARD and value == -1):
                hint = " (or -1 to infer it)" if name == MeshDim.DP_SHARD else ""
                raise ValueError(f"{name} must be >= 1{hint}, got {name}={value}")
        check_world_size(self.world_size)
        others = self.dp_replicate * self.cp * self.ulysses * self.tp * self.pp
        if self.dp_shard == -1:
            if dp_shard_left(self.world_size, self.degrees()) is None:
                raise ValueError(
                    f"cannot infer dp_shard: world_size={self.world_size} is not divisible by "
                    f"{self._factors(without=MeshDim.DP_SHARD)} = {others}; "
                    f"nearest valid world_size: {_nearest_multiple(self.world_size, others)}"
                )
            object.__setattr__(self, "dp_shard", self.world_size // others)
        product = others * self.dp_shard
        if product != self.world_size:
            raise ValueError(
                f"world-size equation violated: {self._factors()} = {product} "
                f"!= world_size={self.world_size}; {self._world_size_hint(others)}"
            )
        self._check_expert_degrees()

    def _factors(self, without: str = "") -> str:
        """'dp_replicate*dp_shard*cp*tp*pp = 1*2*2*2*1' (with ulysses only where it is > 1)."""
        names = [MeshDim.DP_REPLICATE, MeshDim.DP_SHARD, MeshDim.CP, MeshDim.ULYSSES, MeshDim.TP, MeshDim.PP]
        names = [n for n in names if n != without and (n != MeshDim.ULYSSES or self.ulysses > 1)]
        return "*".join(names) + " = " + "*".join(str(getattr(self, n)) for n in names)

    def _world_size_hint(self, others: int) -> str:
        if self.world_size % others == 0:
            return f"nearest valid choice: dp_shard={self.world_size // others} (or dp_shard=-1)"
        return (
            f"the other degrees multiply to {others}, which does not divide world_size={self.world_size}; "
            f"run on world_size={others * self.dp_shard} ranks, or change the degrees"
        )

    def _check_expert_degrees(self) -> None:
        ep, etp, tp, cp, dp_shard = self.ep, self.etp, self.tp, self.cp, self.dp_shard
        if etp > 1 and ep == 1:
            raise ValueError(
                f"etp={etp} requires ep > 1: expert tensor parallelism shards experts, which are only "
                f"distributed with expert parallelism; {self._etp_without_ep_fix()}"
            )
        if ep == 1:
            return
        if self.ulysses > 1:
            raise ValueError(
                f"ep={ep} with ulysses={self.ulysses}: the expert recipes borrow ranks from dp_shard*cp(*tp) "
                "and do not split the sequence over a ulysses dim; set ulysses=1 (Ulysses on the cp ranks, "
                "as M5-U, keeps ep) or ep=1"
            )
        if etp not in (1, tp):
            raise ValueError(f"with ep={ep}, etp must be 1 or equal to tp={tp}; got etp={etp}")
        if etp == tp:
            borrowed, pool, rule = cp, dp_shard * cp, "etp == tp: EP borrows all of cp and part of dp_shard"
            names = f"cp={cp}", f"dp_shard*cp={pool}"
        else:
            borrowed, pool, rule = cp * tp, dp_shard * cp * tp, "etp == 1: EP borrows all of cp*tp and part of dp_shard"
            names = f"cp*tp={borrowed}", f"dp_shard*cp*tp={pool}"
        if ep % borrowed or pool % ep:
            valid = [d for d in _divisors(pool) if d % borrowed == 0 and d > 1]
            other_etp = tp if etp == 1 else 1
            # any fitting ep divides its pool, which divides dp_shard*cp*tp: its divisors are all candidates
            other = (
                [(e, other_etp) for e in _divisors(dp_shard * cp * tp) if e > 1 and self._expert_fit(e, other_etp)]
                if other_etp != etp
                else []
            )
            hint = f"valid ep: {valid} (keeping etp={etp})" if valid else f"no ep > 1 fits these degrees with etp={etp}"
            if other:
                hint += f"; valid (ep, etp) with etp={other_etp}: {other}"
            raise ValueError(
                f"ep={ep} does not fit the mesh ({rule}): ep must be a multiple of {names[0]} "
                f"and divide {names[1]}; {hint}"
            )

    def _etp_without_ep_fix(self) -> str:
        """What to change when etp > 1 but ep == 1: etp=1 always works; keeping expert TP needs etp == tp
        (so tp > 1) and an ep that fits, listed."""
        if self.tp == 1:
            return "set etp=1 (etp must be 1 or tp, and tp=1 here)"
        eps = [e for e in _divisors(self.dp_shard * self.cp * self.tp) if e > 1 and self._expert_fit(e, self.tp)]
        if not eps:
            return f"set etp=1 (no ep > 1 fits these degrees with etp=tp={self.tp})"
        return f"set etp=1, or keep etp=tp={self.tp} with ep in {eps}"

    def _expert_fit(self, ep: int, etp: int) -> bool:
        borrowed = self.cp if etp == self.tp else self.cp * self.tp
        pool = self.dp_shard * borrowed
        return ep % borrowed == 0 and pool % ep == 0

    # ----- derived degrees -----
    @property
    def fsdp(self) -> int:
        """Size of the parameter-sharding dim: CP and Ulysses ranks shard parameters too (TorchTitan, VeOmni)."""
        return self.dp_shard * self.cp * self.ulysses

    @property
    def dp(self) -> int:
        """Number of distinct data shards (data loading)."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_cp(self) -> int:
        """Ranks over which the loss (and every gradient) is averaged."""
        return self.dp_replicate * self.dp_shard * self.cp * self.ulysses

    @property
    def efsdp(self) -> int:
        """Expert-FSDP degree: what is left of dp_shard*cp*tp after EP and ETP took their share."""
        return self.dp_shard * self.cp * self.tp // (self.ep * self.etp)

    def degrees(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in DEGREE_KEYS}

    def label(self, *, world: bool = False, sep: str = ", ") -> str:
        """``"dp_replicate=2, dp_shard=2"``: the degrees other than 1 (``mesh_dims.degrees_label``)."""
        return degrees_label(self.degrees(), world=world, sep=sep)

    def replace(self, **changes: int) -> ParallelDims:
        return dataclasses.replace(self, **changes)

    # ----- views -----
    def views(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """Every named view as ((dim name, size), ...), outermost first; each multiplies to world_size."""
        # pp is the outermost dim of every view (TorchTitan): each pipeline stage is a contiguous block of
        # world_size/pp ranks holding one whole (dp_replicate, dp_shard, cp, tp) mesh of its own
        pp = ((MeshDim.PP, self.pp),) if self.pp > 1 else ()
        # Ulysses inside cp, next to tp: its all-to-all wants the fastest links, a ring only neighbours
        sequence = ((MeshDim.CP, self.cp),) + (((MeshDim.ULYSSES, self.ulysses),) if self.ulysses > 1 else ())
        views = {
            "dense": pp
            + ((MeshDim.DP_REPLICATE, self.dp_replicate), (MeshDim.DP_SHARD, self.dp_shard))
            + sequence
            + ((MeshDim.TP, self.tp),),
            "fsdp": pp + ((MeshDim.DP_REPLICATE, self.dp_replicate), (MeshDim.FSDP, self.fsdp), (MeshDim.TP, self.tp)),
            "batch": pp + ((MeshDim.DP, self.dp),) + sequence + ((MeshDim.TP, self.tp),),
            "loss": pp + ((MeshDim.DP_CP, self.dp_cp), (MeshDim.TP, self.tp)),
        }
        if self.ep > 1:
            sparse = [
                *pp,
                (MeshDim.DP_REPLICATE, self.dp_replicate),
                (MeshDim.EFSDP, self.efsdp),
                (MeshDim.EP, self.ep),
            ]
            if self.etp > 1:
                sparse.append((MeshDim.ETP, self.etp))
            views["sparse"] = tuple(sparse)
        return views

    def _view_of(self, dim: str) -> tuple[tuple[str, int], ...]:
        for view in self.views().values():
            if dim in dict(view):
                return view
        known = sorted({name for view in self.views().values() for name, _ in view})
        if dim in (MeshDim.EFSDP, MeshDim.EP, MeshDim.ETP) and self.ep == 1:
            raise ValueError(f"there is no {dim!r} dim: ep=1, so there is no sparse (expert) mesh")
        if dim == MeshDim.ETP and self.ep > 1:
            raise ValueError("there is no 'etp' dim: etp=1, so the expert mesh is (dp_replicate, efsdp, ep)")
        raise ValueError(f"unknown mesh dim {dim!r}; known dims: {known}")

    def group_ranks(self, dim: str) -> list[list[int]]:
        """All process groups of one mesh dim, each as its sorted global ranks.

        Rank r has coordinates in a view by mixed-radix decomposition (last dim fastest); the group
        of r on ``dim`` is every rank that differs from r only in that coordinate.
        """
        view = self._view_of(dim)
        sizes = [size for _, size in view]
        index = [name for name, _ in view].index(dim)
        stride = 1
        for size in sizes[index + 1 :]:
            stride *= size
        size = sizes[index]
        block = stride * size
        return [
            [base + offset + k * stride for k in range(size)]
            for base in range(0, self.world_size, block)
            for offset in range(stride)
        ]

    def coordinates(self, rank: int) -> dict[str, int]:
        """Index of ``rank`` along every dim of every view, e.g. ``{"dp": 1, "cp": 0, "tp": 1, ...}``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size={self.world_size}")
        coords = {}
        for view in self.views().values():
            remainder = rank
            for name, size in reversed(view):
                coords[name] = remainder % size
                remainder //= size
        return coords

    def group_of(self, dim: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group on ``dim``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size={self.world_size}")
        return next(group for group in self.group_ranks(dim) if rank in group)

    # ----- shapes -----
    def check_model(
        self,
        *,
        seq_len: int | None = None,
        global_batch: int | None = None,
        sequence_parallel: bool = False,
        num_experts: int | None = None,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        hidden_sizes: Iterable[int] = (),
        expert_hidden_sizes: Iterable[int] = (),
        ulysses: bool = False,
        n_layers: int | None = None,
        microbatches: int | None = None,
        stages_per_rank: int = 1,
        async_tp: bool = False,
        float8_dims: Iterable[int] = (),
        row_tokens: int | None = None,
    ) -> None:
        """Check a model config against the degrees; raise ``ValueError`` naming the broken rule.

        ``async_tp``: TP+SP's gathers and scatters are cut into tp chunks of each rank's sequence shard
        (``parallel.async_tp``), so the shard ``seq_len / (cp * tp)`` must divide by tp; without SP there
        is no gather or scatter to cut. ``float8_dims``: the in / out features of the float8 linears, whose
        weight shards ``torch._scaled_mm`` takes only in multiples of 16 (so each dim % (16 * tp)), as it
        takes the tokens of a tp group (the weight gradient's inner dim) only in multiples of 16. ``row_tokens``:
        the tokens of one batch row where the model's sequence length is fixed (the MLP's; no ``seq_len``).

        Pipeline (pp > 1): the layers split evenly into pp * stages_per_rank stages, and each data-parallel
        rank's rows split evenly into ``microbatches``, at least one per stage (a schedule with fewer
        microbatches than stages leaves whole stages idle: 1F1B refuses it).

        ``ulysses`` (a scheme, not the degree): the cp ranks run Ulysses attention (M5-U: an all-to-all hands
        each cp rank whole heads), so the heads of a tp rank must also split over cp: ``num_heads % (tp * cp)
        == 0``. The ``ulysses`` degree (2-D sequence parallelism) has its own rules: the query and K/V heads
        of a tp rank split over it, and the sequence into 2 * cp chunks whose every share splits over
        ulysses and tp.
        """
        if seq_len is not None:
            self._check_sequence(seq_len, sequence_parallel)
        if global_batch is not None and global_batch % self.dp:
            raise ValueError(
                f"global_batch={global_batch} must be divisible by dp = dp_replicate*dp_shard = {self.dp} "
                f"(each data-parallel rank loads an equal slice); "
                f"nearest valid global_batch: {_nearest_multiple(global_batch, self.dp)}"
            )
        if num_experts is not None and num_experts % self.ep:
            raise ValueError(
                f"num_experts={num_experts} must be divisible by ep={self.ep} (each EP rank holds "
                f"num_experts/ep experts); nearest valid num_experts: {_nearest_multiple(num_experts, self.ep)}"
            )
        if num_heads is not None and num_heads % self.tp:
            raise ValueError(
                f"num_heads={num_heads} must be divisible by tp={self.tp} (TP splits attention by heads); "
                f"choose tp from {list(_divisors(num_heads))}"
            )
        if ulysses and num_heads is not None and num_heads % (self.tp * self.cp):
            valid_cp = list(_divisors(num_heads // self.tp))
            raise ValueError(
                f"num_heads={num_heads} must be divisible by tp*cp = {self.tp}*{self.cp} = {self.tp * self.cp} with "
                f"Ulysses (its all-to-all gives each cp rank num_heads/(tp*cp) whole heads); valid cp for "
                f"tp={self.tp}: {valid_cp}, or use K/V all-gather / ring CP"
            )
        if self.ulysses > 1 and num_heads is not None:
            self._check_ulysses_heads(num_heads, num_heads if num_kv_heads is None else num_kv_heads)
        self._check_divisible(hidden_sizes, self.tp, MeshDim.TP)
        self._check_divisible(expert_hidden_sizes, self.etp, MeshDim.ETP)
        if async_tp:
            self._check_async_tp(seq_len, sequence_parallel)
        if float8_dims:
            self._check_float8(tuple(float8_dims), seq_len, global_batch, row_tokens)
        if self.pp > 1:
            self._check_pipeline(n_layers, microbatches, stages_per_rank, global_batch)

    def _check_async_tp(self, seq_len: int | None, sequence_parallel: bool) -> None:
        if not sequence_parallel:
            raise ValueError(
                "async TP pipelines sequence parallelism's all-gather and reduce-scatter, and without SP a TP "
                "block all-reduces instead: turn sequence parallelism on (M3-A, M6-A do), or use M2 for TP alone"
            )
        if self.tp < 2:
            raise ValueError("async TP cuts the tp group's collectives into chunks: it needs tp > 1")
        if seq_len is not None and seq_len % (self.cp * self.tp * self.tp):
            divisor = self.cp * self.tp * self.tp * (2 if self.cp > 1 else 1)
            raise ValueError(
                f"async TP cuts each rank's sequence shard (seq_len / (cp*tp) = {seq_len}/{self.cp * self.tp}) "
                f"into tp={self.tp} chunks, which needs seq_len % (cp*tp*tp) == 0; nearest valid seq_len: "
                f"{_nearest_multiple(seq_len, divisor)}"
            )

    def _check_float8(
        self, dims: tuple[int, ...], seq_len: int | None, global_batch: int | None, row_tokens: int | None
    ) -> None:
        multiple = 16 * self.tp
        wrong = [d for d in dims if d % multiple]
        if wrong:
            raise ValueError(
                f"float8 linears with in / out features {list(dims)}: {wrong} not multiples of 16*tp = {multiple}; "
                "torch._scaled_mm takes weight shards whose dims are multiples of 16. Use model dims that are "
                f"multiples of {multiple}, a smaller tp, or the recipe without float8"
            )
        if global_batch is None or global_batch % self.dp:
            return
        if seq_len is not None:
            tokens = global_batch // self.dp * (seq_len // self.cp)
            where, fix = "of a tp group (global_batch/dp * seq_len/cp)", "--global-batch or --seq-len"
        elif row_tokens is not None:
            tokens = global_batch // self.dp * row_tokens
            where, fix = f"of a data-parallel rank (global_batch/dp * {row_tokens} tokens per row)", "--global-batch"
        else:
            return
        if tokens % 16:
            raise ValueError(
                f"float8's weight gradient multiplies over the {tokens} tokens {where}, and torch._scaled_mm "
                f"needs a multiple of 16; change {fix}"
            )

    def _check_sequence(self, seq_len: int, sequence_parallel: bool) -> None:
        if self.ulysses > 1 and seq_len % (2 * self.cp * self.ulysses * self.tp):
            divisor = 2 * self.cp * self.ulysses * self.tp
            raise ValueError(
                f"seq_len={seq_len} must be divisible by 2*cp*ulysses*tp = 2*{self.cp}*{self.ulysses}*{self.tp} = "
                f"{divisor} (the ring cuts the sequence into 2*cp load-balanced chunks, each rank's share splits "
                f"over ulysses, and SP splits it by tp); nearest valid seq_len: {_nearest_multiple(seq_len, divisor)}"
            )
        if self.cp > 1 and seq_len % (self.tp * 2 * self.cp):
            divisor = self.tp * 2 * self.cp
            raise ValueError(
                f"seq_len={seq_len} must be divisible by tp*2*cp = {self.tp}*2*{self.cp} = {divisor} "
                f"(CP splits the sequence into 2*cp load-balanced chunks, SP splits each by tp); "
                f"nearest valid seq_len: {_nearest_multiple(seq_len, divisor)}"
            )
        if self.cp == 1 and self.ulysses == 1 and sequence_parallel and seq_len % self.tp:
            raise ValueError(
                f"seq_len={seq_len} must be divisible by tp={self.tp} with sequence parallelism; "
                f"nearest valid seq_len: {_nearest_multiple(seq_len, self.tp)}"
            )

    def _check_ulysses_heads(self, num_heads: int, num_kv_heads: int) -> None:
        """Each ulysses rank gets whole query heads and whole K/V heads of its tp rank (a tp rank holds
        num_kv_heads / tp of them, or one replicated when there are fewer than tp)."""
        heads, kv_heads = num_heads // self.tp, max(num_kv_heads // self.tp, 1)
        if heads % self.ulysses or kv_heads % self.ulysses:
            valid = [d for d in _divisors(math.gcd(heads, kv_heads))]
            raise ValueError(
                f"ulysses={self.ulysses} must divide the heads of each tp rank: num_heads/tp = {num_heads}/{self.tp} "
                f"= {heads} and num_kv_heads/tp = {kv_heads} (its all-to-all gives each ulysses rank whole query "
                f"and key/value heads); valid ulysses for tp={self.tp}: {valid}"
            )

    def _check_pipeline(
        self, n_layers: int | None, microbatches: int | None, stages_per_rank: int, global_batch: int | None
    ) -> None:
        stages = self.pp * stages_per_rank
        if n_layers is not None and n_layers % stages:
            valid = [p for p in _divisors(n_layers) if p > 1 and n_layers % (p * stages_per_rank) == 0]
            raise ValueError(
                f"n_layers={n_layers} must be divisible by pp*stages_per_rank = {self.pp}*{stages_per_rank} = {stages} "
                f"(each pipeline stage holds n_layers/{stages} whole layers); valid pp for {n_layers} layers: {valid}, "
                f"or nearest valid n_layers: {_nearest_multiple(n_layers, stages)}"
            )
        if microbatches is None:
            return
        if microbatches < stages:
            raise ValueError(
                f"microbatches={microbatches} must be >= the number of stages pp*stages_per_rank = {stages} "
                f"(otherwise some stages never run at once: the pipeline never fills); use microbatches >= {stages}"
            )
        if global_batch is not None and (global_batch // self.dp) % microbatches:
            rows = global_batch // self.dp
            raise ValueError(
                f"each data-parallel rank's {rows} rows (global_batch={global_batch} / dp={self.dp}) must split "
                f"into microbatches={microbatches} equal microbatches; valid microbatches: "
                f"{[m for m in _divisors(rows) if m >= stages]}"
            )

    @staticmethod
    def _check_divisible(sizes: Iterable[int], degree: int, name: str) -> None:
        sizes = tuple(sizes)
        for size in sizes:
            if size % degree:
                raise ValueError(
                    f"hidden size {size} must be divisible by {name}={degree}; "
                    f"nearest valid size: {_nearest_multiple(size, degree)}, "
                    f"or choose {name} from {list(_divisors(math.gcd(*sizes)))}"
                )

    def describe(self) -> str:
        """One line per view with group sizes, e.g. for `launch check`."""
        lines = [f"world_size={self.world_size}: " + ", ".join(f"{n}={getattr(self, n)}" for n in DEGREE_NAMES)]
        for name, view in self.views().items():
            lines.append(f"  {name:<7}" + " x ".join(f"{dim}={size}" for dim, size in view))
        return "\n".join(lines)


CHOICE_DEGREES = tuple(name for name in STAGE_DEGREES if name != MeshDim.ULYSSES)
"""What ``valid_choices`` varies unless told otherwise: a stage's degrees, 1-D sequence layouts only."""


def valid_choices(
    world_size: int,
    fixed: dict[str, int] | None = None,
    names: Sequence[str] = CHOICE_DEGREES,
    pipeline: bool = False,
) -> list[ParallelDims]:
    """Every valid ParallelDims for ``world_size`` that agrees with ``fixed``; for widgets and plans.

    pp=1 only, unless ``pipeline``: then every pp dividing world_size too (pp is then fixable); ulysses=1
    only, unless ``names`` holds it (a 2-D sequence layout)."""
    fixed = dict(fixed or {})
    names = (*names, MeshDim.PP) if pipeline else tuple(names)
    unknown = set(fixed) - set(names)
    if unknown:
        raise ValueError(f"valid_choices can fix {list(names)}, not {sorted(unknown)}")
    result = []
    for pp in _divisors(world_size) if pipeline else (1,):
        result += _choices_at_pp(world_size, pp, fixed, names)
    return result


def _choices_at_pp(world_size: int, pp: int, fixed: dict[str, int], names: Sequence[str]) -> list[ParallelDims]:
    result = []
    stage = world_size // pp  # ranks of one pipeline stage: the other degrees split these
    for dp_replicate in _divisors(stage):
        for cp in _divisors(stage // dp_replicate):
            for ulysses in _divisors(stage // (dp_replicate * cp)) if MeshDim.ULYSSES in names else (1,):
                rest = stage // (dp_replicate * cp * ulysses)
                for tp in _divisors(rest):
                    shares = dict(dp_replicate=dp_replicate, cp=cp, ulysses=ulysses, tp=tp, dp_shard=rest // tp)
                    result += _expert_choices(world_size, pp, shares, fixed, names)
    return result


def _expert_choices(
    world_size: int, pp: int, shares: dict[str, int], fixed: dict[str, int], names: Sequence[str]
) -> list[ParallelDims]:
    """The valid (ep, etp) completions of one split of a stage's ranks (``shares``)."""
    result = []
    for ep in _divisors(world_size // pp):
        for etp in sorted({1, shares["tp"]}):
            degrees = dict(shares, ep=ep, etp=etp, pp=pp)
            if any(degrees[k] != v for k, v in fixed.items() if k in names):
                continue
            try:
                result.append(ParallelDims(world_size=world_size, **degrees))
            except ValueError:
                continue
    return result
