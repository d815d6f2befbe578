"""What the columns of an nvidia-smi-like CSV mean: header spellings, units and value shapes.

Users log GPU metrics three ways, and the reader must understand all of them:

- nvidia-smi's own header (``utilization.gpu [%]``, ``memory.used [MiB]``);
- a header their own script wrote (``gpu_index,temperature_C,utilization_gpu_pct,power_W``,
  ``util_pct``, ``mem_used_mb``, ``gpu_id``, ``temp_c``);
- no header at all (``--format=csv,noheader``), where only the values say what a column is.

`FIELD_ALIASES` is the one table of spellings: canonical ``--query-gpu`` field ← normalised
names. A header cell is normalised (lower case, separators to ``_``, a unit in brackets or as
the last word taken off, see `UNIT_WORDS`) and looked up there; a unit that contradicts the
field (``memory_used_pct``) leaves the column unknown rather than misread. Unknown columns are
kept out of the samples and named in a note, never a reason to refuse the file.

Header-less captures are read by `infer_columns` from the shape of their values (a timestamp,
``GPU-…`` UUIDs, ``P0`` states, ``12 %``, ``841 MiB``, ``33.09 W``, ``1980 MHz``, small integers
that number the GPUs). Where two readings are possible (two bare numbers: temperature or
memory?) it refuses with one line asking for ``--fields``; a guess that may be wrong is worse
than a question.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

KIND_OF_FIELD: dict[str, str] = {
    "timestamp": "time",
    "index": "id",
    "uuid": "text",
    "name": "text",
    "pci.bus_id": "text",
    "pstate": "text",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "fan.speed": "%",
    "memory.used": "memory",
    "memory.total": "memory",
    "memory.free": "memory",
    "memory.reserved": "memory",
    "power.draw": "power",
    "power.limit": "power",
    "enforced.power.limit": "power",
    "power.default_limit": "power",
    "power.max_limit": "power",
    "clocks.sm": "clock",
    "clocks.gr": "clock",
    "clocks.mem": "clock",
    "clocks.max.sm": "clock",
    "temperature.gpu": "temp",
    "temperature.memory": "temp",
    "clocks_event_reasons.active": "mask",
}
"""Canonical field → what kind of value it holds (how its unit and range are checked)."""

FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "timestamp": ("timestamp", "time", "ts", "datetime", "date_time", "sample_time",
                  "time_stamp", "epoch", "unix_time", "wall_time", "wallclock"),
    "index": ("index", "gpu", "gpu_index", "gpu_id", "gpu_idx", "idx", "device", "device_id",
              "device_index", "gpu_num", "gpu_no", "gpuid", "gpu_number"),
    "uuid": ("uuid", "gpu_uuid"),
    "name": ("name", "gpu_name", "model", "gpu_model", "product_name", "device_name"),
    "pci.bus_id": ("pci_bus_id", "bus_id", "gpu_bus_id"),
    "pstate": ("pstate", "perf_state", "performance_state", "p_state"),
    "utilization.gpu": ("utilization_gpu", "util_gpu", "gpu_util", "gpu_utilization",
                        "gpu_utilisation", "utilisation_gpu", "utilization", "util", "sm_util",
                        "gpu_usage", "gpu_busy", "gpu_load", "volatile_gpu_util"),
    "utilization.memory": ("utilization_memory", "util_mem", "util_memory", "mem_util",
                           "memory_util", "memory_utilization", "mem_utilization",
                           "mem_busy", "memory_busy"),
    "memory.used": ("memory_used", "mem_used", "used_memory", "used_mem", "fb_used",
                    "vram_used", "gpu_mem_used", "gpu_memory_used", "memory_usage",
                    "mem_usage", "gpu_mem", "gpu_memory"),
    "memory.total": ("memory_total", "mem_total", "total_memory", "total_mem", "fb_total",
                     "vram_total", "gpu_mem_total", "gpu_memory_total"),
    "memory.free": ("memory_free", "mem_free", "free_memory", "free_mem", "fb_free",
                    "vram_free", "gpu_mem_free"),
    "power.draw": ("power_draw", "power", "power_usage", "pwr", "power_consumption", "gpu_power",
                   "board_power", "power_draw_instant", "power_draw_average"),
    "power.limit": ("power_limit", "power_cap", "pwr_limit", "pwr_cap", "power_management_limit",
                    "enforced_power_limit", "power_limit_enforced"),
    "power.default_limit": ("power_default_limit", "default_power_limit"),
    "power.max_limit": ("power_max_limit", "max_power_limit"),
    "clocks.sm": ("clocks_sm", "clock_sm", "sm_clock", "sm_clk", "clocks_current_sm", "sm_freq",
                  "sm_clock_speed", "pclk"),
    "clocks.mem": ("clocks_mem", "clock_mem", "mem_clock", "memory_clock", "mclk",
                   "clocks_current_memory"),
    "clocks.max.sm": ("clocks_max_sm", "max_sm_clock", "sm_clock_max"),
    "temperature.gpu": ("temperature_gpu", "temperature", "temp", "gpu_temp", "gpu_temperature",
                        "gtemp", "temp_gpu", "core_temp"),
    "temperature.memory": ("temperature_memory", "mem_temp", "memory_temp", "mtemp",
                           "hbm_temp"),
    "clocks_event_reasons.active": ("clocks_event_reasons_active", "clocks_throttle_reasons_active",
                                    "clock_event_reasons", "clocks_event_reasons",
                                    "throttle_reasons", "clocks_throttle_reasons",
                                    "throttle_reason"),
    "fan.speed": ("fan_speed", "fan"),
}  # fmt: skip
"""Canonical ``--query-gpu`` field ← header spellings seen in users' own loggers, normalised
(lower case, ``_`` between words, no unit)."""

UNIT_WORDS: dict[str, str] = {
    "%": "%", "pct": "%", "percent": "%", "perc": "%",
    "mib": "MiB", "mb": "MiB", "gib": "GiB", "gb": "GiB", "kib": "KiB", "kb": "KiB",
    "bytes": "B", "b": "B",
    "w": "W", "watt": "W", "watts": "W", "mw": "mW",
    "mhz": "MHz", "ghz": "GHz",
    "c": "C", "celsius": "C", "degc": "C", "deg_c": "C",
    "s": "s", "sec": "s", "ms": "ms", "us": "us", "ns": "ns",
}  # fmt: skip
"""A unit as written at the end of a name or in brackets → its canonical spelling."""

_KIND_UNITS: dict[str, set[str]] = {
    "%": {"%"},
    "memory": {"MiB", "GiB", "KiB", "B"},
    "power": {"W", "mW"},
    "clock": {"MHz", "GHz"},
    "temp": {"C"},
    "time": {"s", "ms", "us", "ns"},
}
"""Units that fit each kind of field; a unit outside its kind's set makes the column unknown."""

RANGES: dict[str, tuple[float, float]] = {
    "%": (0.0, 100.0),
    "memory": (0.0, float(2**50)),
    "power": (0.0, 5000.0),
    "clock": (0.0, 10000.0),
    "temp": (-40.0, 150.0),
}
"""Plausible range of each kind after conversion (%, bytes, W, MHz, °C); values outside are
skipped (a sensor glitch, a wrapped line, a sentinel such as -1 or 65535)."""

DISTINCTIVE_KINDS = {"%", "memory", "power", "clock", "temp", "mask"}
"""A header needs a column of one of these kinds: ``timestamp, index, name`` alone is any
CSV's header."""

_ALIAS_INDEX: dict[str, str] = {}
for _field, _names in FIELD_ALIASES.items():
    for _name in (*_names, _field.replace(".", "_")):
        _ALIAS_INDEX.setdefault(_name, _field)

_BRACKET_RE = re.compile(r"^(.*?)\s*[\[(]\s*([^\])]*)\s*[\])]\s*$")
_NORM_RE = re.compile(r"[^a-z0-9%]+")
_NUMBER_CELL_RE = re.compile(r"^\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*$")


@dataclass(frozen=True)
class Column:
    """One column as understood: ``field`` the canonical ``--query-gpu`` name (None: not
    understood), ``unit`` from the header ("" when none), ``raw`` the header cell."""

    field: str | None
    unit: str
    raw: str

    @property
    def known(self) -> bool:
        return self.field is not None


def normalise(name: str) -> tuple[str, str]:
    """``"memory_used_MiB"`` → ``("memory_used", "MiB")``; ``"power.draw [W]"`` →
    ``("power_draw", "W")``: the name's words joined by ``_`` and its unit, if it has one."""
    text = name.strip().lower()
    unit = ""
    match = _BRACKET_RE.match(text)
    if match:
        text, unit = match.group(1), UNIT_WORDS.get(match.group(2).strip(), match.group(2))
    words = [w for w in _NORM_RE.split(text.replace("%", " % ")) if w]
    if not unit and len(words) > 1 and words[-1] in UNIT_WORDS:
        unit = UNIT_WORDS[words.pop()]
    return "_".join(words), unit


def column(cell: str) -> Column:
    """What a header cell names (see the module doc)."""
    stem, unit = normalise(cell)
    field = _ALIAS_INDEX.get(stem)
    if field is None:
        return Column(None, unit, cell.strip())
    kind = KIND_OF_FIELD.get(field, "")
    if unit and kind in _KIND_UNITS and unit not in _KIND_UNITS[kind]:
        return Column(None, unit, cell.strip())  # e.g. memory_used_pct: not memory.used
    return Column(field, unit, cell.strip())


def header(cells: Sequence[str]) -> list[Column] | None:
    """The columns of a header line, or None when the line is not a header.

    A header has no number cells, names at least one metric column (`DISTINCTIVE_KINDS`),
    and names at least as many columns gpuprof understands as it does not (so a training
    log's ``step,loss,reward,gpu_util`` is not taken for a GPU log).
    """
    if not cells or any(_NUMBER_CELL_RE.match(c) for c in cells):
        return None
    cols = [column(c) for c in cells]
    if any(not c.raw for c in cols):
        return None
    known = [c for c in cols if c.known]
    if not any(KIND_OF_FIELD.get(c.field or "") in DISTINCTIVE_KINDS for c in known):
        return None
    if len(known) < len(cols) - len(known):
        return None
    return cols


def fields_option(text: str | Sequence[str]) -> list[Column]:
    """Columns named by the user (``--fields timestamp,index,utilization.gpu``); aliases and
    units work as in a header. Raises ValueError for an empty list."""
    names = text.split(",") if isinstance(text, str) else list(text)
    cols = [column(n) for n in names if n.strip()]
    if not cols:
        raise ValueError("--fields names no columns")
    return cols


# ---------------------------------------------------------------------------------------------
# Header-less captures: columns from the shape of their values

SMI_TIME_RE = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)?$")
_ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
_UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_PCI_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_PSTATE_RE = re.compile(r"^P\d{1,2}$")
_MASK_RE = re.compile(r"^0x[0-9A-Fa-f]+$")
_UNIT_VALUE_RE = re.compile(r"^([-+]?(?:\d+\.?\d*|\.\d+))\s*(%|MiB|GiB|KiB|W|MHz|C)$")
_BARE_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)$")
_NA_RE = re.compile(r"^(\[.*\]|N/A|n/a|NA|Unknown|unknown|)$")
_GPU_NAME_RE = re.compile(
    r"\b(NVIDIA|Tesla|GeForce|Quadro|TITAN|RTX|GTX|A100|H100|H200|H800|A800|B200|GB200|L40S?|"
    r"A10G?|A30|A40|A6000|L4|T4|V100|P100)\b",
    re.IGNORECASE,
)
_EPOCH_MIN, _EPOCH_MAX = 9.0e8, 4.2e9  # 1998 … 2103, in seconds


def shape(cell: str) -> str:
    """The shape of one value: ``time``, ``uuid``, ``pci``, ``pstate``, ``mask``, a unit
    (``%``, ``MiB``, ``W``, ``MHz``, ``C``…), ``int``, ``number``, ``na``, ``name`` (a GPU
    product name) or ``text``."""
    cell = cell.strip()
    if _NA_RE.match(cell):
        return "na"
    if SMI_TIME_RE.match(cell) or _ISO_RE.match(cell):
        return "time"
    match = _UNIT_VALUE_RE.match(cell)
    if match:
        return match.group(2)
    if _BARE_RE.match(cell):
        value = float(cell)
        for scale in (1.0, 1e3, 1e6, 1e9):  # epoch in s, ms, µs or ns
            if _EPOCH_MIN <= value / scale <= _EPOCH_MAX and value >= _EPOCH_MIN:
                return "time"
        return "int" if value.is_integer() and "." not in cell else "number"
    if _UUID_RE.match(cell):
        return "uuid"
    if _PCI_RE.match(cell):
        return "pci"
    if _PSTATE_RE.match(cell):
        return "pstate"
    if _MASK_RE.match(cell):
        return "mask"
    if _GPU_NAME_RE.search(cell) and re.search(r"[A-Za-z]", cell):
        return "name"
    return "text"


SMI_SHAPES = {"%", "MiB", "GiB", "KiB", "W", "MHz", "uuid", "pci", "pstate", "mask", "name"}
"""Shapes that only GPU tools print: a header-less line needs one to be taken for nvidia-smi."""


class Ambiguous(Exception):
    """The columns of a header-less capture can't be told apart; the message says why."""


def looks_headerless(cells: Sequence[str]) -> bool:
    """A data line of a header-less nvidia-smi capture: every cell a value, one of them of a
    shape only GPU tools print (or nvidia-smi's own timestamp)."""
    if len(cells) < 2:
        return False
    shapes = [shape(c) for c in cells]
    if any(s == "text" for s in shapes):
        return False
    return any(s in SMI_SHAPES for s in shapes) or bool(SMI_TIME_RE.match(cells[0].strip()))


def infer_columns(rows: Sequence[Sequence[str]]) -> tuple[list[Column], list[str]]:
    """The columns of header-less ``rows`` (cells per row, all rows as wide), from the shape
    of their values; and notes saying what was inferred. Raises `Ambiguous` when a numeric
    column could mean two things (the caller asks for ``--fields``).

    Rules (each one unambiguous for nvidia-smi's output; see the module doc):

    - a timestamp, ``GPU-…`` UUID, PCI bus id, ``P0`` state, ``0x…`` mask, GPU product name:
      by shape; another text column is skipped (a driver version, a hostname);
    - ``%``: one column is utilization.gpu; two are (utilization.gpu, utilization.memory),
      the GPU's being the larger on every row (memory is busy only while kernels or copies
      run), or either when they are equal everywhere;
    - ``MiB``: one column is memory.used; with a second that is constant per GPU and never
      smaller, that one is memory.total; a third is memory.free when used + free ≤ total
      (used first, nvidia-smi's own order);
    - ``W``: one is power.draw; with a second constant per GPU and never smaller, that one
      is power.limit;
    - ``MHz``: one is clocks.sm (the graphics clock reads the same on data-centre GPUs);
    - bare integers all below 16: the GPU index; one other bare number between 10 and 120:
      temperature.gpu (nvidia-smi prints it without a unit even with units on).
    """
    width = len(rows[0])
    cols = [[str(r[i]).strip() for r in rows] for i in range(width)]
    shapes: list[str] = []
    for i, values in enumerate(cols):
        seen = {shape(v) for v in values} - {"na"}
        if seen <= {"int", "number"} and seen:
            seen = {"number"} if "number" in seen else {"int"}
        if len(seen) > 1:
            raise Ambiguous(f"column {i + 1} mixes values of different kinds ({_sample(values)})")
        shapes.append(seen.pop() if seen else "na")
    fields: list[str | None] = [None] * width
    notes: list[str] = []

    def assign(i: int, field: str, why: str) -> None:
        fields[i] = field
        notes.append(f"column {i + 1} ({_sample(cols[i])}): {field}, {why}")

    single = {"time": "timestamp", "uuid": "uuid", "pci": "pci.bus_id", "pstate": "pstate",
              "mask": "clocks_event_reasons.active", "name": "name"}  # fmt: skip
    for kind, field in single.items():
        where = [i for i, s in enumerate(shapes) if s == kind]
        if len(where) > 1:
            raise Ambiguous(f"{len(where)} columns look like {field}")
        if where:
            assign(where[0], field, f"by its values' shape ({kind})")
    index_col = fields.index("index") if "index" in fields else None
    per_gpu = _per_gpu_key(cols, fields)

    _percent_columns(cols, shapes, assign)
    _paired_columns(cols, shapes, "MiB", "memory.used", "memory.total", per_gpu, assign)
    _paired_columns(cols, shapes, "W", "power.draw", "power.limit", per_gpu, assign)
    clocks = [i for i, s in enumerate(shapes) if s == "MHz"]
    if len(clocks) > 1:
        raise Ambiguous(f"{len(clocks)} MHz columns (SM, memory or graphics clock?)")
    if clocks:
        assign(clocks[0], "clocks.sm", "the only MHz column")
    temps = [i for i, s in enumerate(shapes) if s == "C"]
    if len(temps) > 1:
        raise Ambiguous(f"{len(temps)} °C columns (GPU or memory temperature?)")
    if temps:
        assign(temps[0], "temperature.gpu", "the only °C column")

    bare = [i for i, s in enumerate(shapes) if s in ("int", "number")]
    small = [i for i in bare if shapes[i] == "int" and max(map(float, _values(cols[i]))) < 16]
    if index_col is None and len(small) == 1:
        assign(small[0], "index", "small whole numbers that number the GPUs")
        bare.remove(small[0])
    elif len(small) > 1:
        raise Ambiguous(f"{len(small)} columns of small whole numbers (GPU index? PCIe link?)")
    if len(bare) == 1 and all(10 <= float(v) <= 120 for v in _values(cols[bare[0]])):
        assign(bare[0], "temperature.gpu", "the only bare number, in the range of °C")
        bare = []
    if bare:
        what = ", ".join(f"column {i + 1} ({_sample(cols[i])})" for i in bare)
        raise Ambiguous(f"numbers without units can't be told apart: {what}")
    for i, s in enumerate(shapes):
        if fields[i] is None and s not in ("na",):
            notes.append(f"column {i + 1} ({_sample(cols[i])}): not recognised, skipped")
    notes.sort(key=lambda n: int(n.split()[1]))
    return [Column(f, "", f or f"column {i + 1}") for i, f in enumerate(fields)], notes


def _values(values: Sequence[str]) -> list[str]:
    return [v for v in values if not _NA_RE.match(v)]


def _sample(values: Sequence[str]) -> str:
    seen = list(dict.fromkeys(_values(values)))[:2]
    return ", ".join(repr(v) for v in seen) or "no values"


def _number(cell: str) -> float:
    match = _UNIT_VALUE_RE.match(cell.strip())
    return float(match.group(1)) if match else float(cell)


def _per_gpu_key(cols: list[list[str]], fields: list[str | None]) -> list[str]:
    """A key per row telling GPUs apart (index, uuid or bus id column; "" when none)."""
    for field in ("uuid", "pci.bus_id"):
        if field in fields:
            return cols[fields.index(field)]
    return [""] * len(cols[0])


def _percent_columns(cols, shapes, assign) -> None:
    where = [i for i, s in enumerate(shapes) if s == "%"]
    if len(where) > 2:
        raise Ambiguous(f"{len(where)} % columns (GPU, memory utilization, fan speed?)")
    if len(where) == 1:
        assign(where[0], "utilization.gpu", "the only % column")
        return
    if len(where) == 2:
        a, b = ([_number(v) if not _NA_RE.match(v) else float("nan") for v in cols[i]]
                for i in where)  # fmt: skip
        pairs = [(x, y) for x, y in zip(a, b) if x == x and y == y]
        if all(x >= y for x, y in pairs):
            gpu, mem = where
        elif all(y >= x for x, y in pairs):
            gpu, mem = where[1], where[0]
        else:
            raise Ambiguous("two % columns, neither always the larger (which is utilization.gpu?)")
        assign(gpu, "utilization.gpu", "the larger % column")
        assign(mem, "utilization.memory", "the smaller % column")


def _paired_columns(cols, shapes, unit, used, limit, per_gpu, assign) -> None:
    """One column of ``unit`` is ``used``; a second, constant per GPU and never smaller, is
    ``limit``; for memory a third is memory.free (see `infer_columns`)."""
    where = [i for i, s in enumerate(shapes) if s == unit]
    if not where:
        return
    if len(where) == 1:
        assign(where[0], used, f"the only {unit} column")
        return
    values = {i: [_number(v) if not _NA_RE.match(v) else float("nan") for v in cols[i]]
              for i in where}  # fmt: skip

    def constant(i: int) -> bool:
        per: dict[str, set[float]] = {}
        for key, v in zip(per_gpu, values[i]):
            if v == v:
                per.setdefault(key, set()).add(v)
        return all(len(s) == 1 for s in per.values())

    def never_smaller(i: int, others: list[int]) -> bool:
        return all(
            values[i][r] >= values[j][r]
            for j in others
            for r in range(len(values[i]))
            if values[i][r] == values[i][r] and values[j][r] == values[j][r]
        )

    tops = [i for i in where if constant(i) and never_smaller(i, [j for j in where if j != i])]
    if len(tops) != 1 or len(where) > (3 if unit == "MiB" else 2):
        raise Ambiguous(f"{len(where)} {unit} columns and no single one is the limit/total")
    top = tops[0]
    rest = [i for i in where if i != top]
    assign(top, limit, f"the {unit} column constant per GPU and never below the others")
    if len(rest) == 1:
        assign(rest[0], used, f"the other {unit} column")
        return
    first, second = rest
    fits = all(
        values[first][r] + values[second][r] <= values[top][r] * 1.01
        for r in range(len(values[top]))
        if all(values[i][r] == values[i][r] for i in where)
    )
    if not fits:
        raise Ambiguous("three MiB columns whose parts don't add up to the total")
    assign(first, "memory.used", "the first of the other two MiB columns (nvidia-smi's order)")
    assign(second, "memory.free", "the second of the other two MiB columns")
