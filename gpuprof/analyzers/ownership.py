"""Which span-recording process drives each GPU.

`gpu_owner` takes the run's GPUs (those sampled and those listed in ``meta.gpus``) and gives
each the process whose phases explain its samples, by the first rule that applies (`OWNER_HOW`):
NVML's process list (the process itself or a child it spawned), ``local_rank`` +
``CUDA_VISIBLE_DEVICES``, rank order, or a single controller. Loops run over processes and GPUs,
never over samples. A GPU no rule resolves gets ``how == "none"``, never an exception.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.analyzers.grouping import appearance_codes, dense_codes, first_rows, first_valid
from gpuprof.analyzers.spans import _num, valid_spans
from gpuprof.model import Run

OWNER_HOW = ("nvml", "nvml_ancestor", "local_rank", "rank_order", "single_controller",
             "single_controller_remote", "none")  # fmt: skip
"""Values of ``gpu_owner(...)["how"]``, in rule priority order:

- ``nvml``: NVML listed the span-recording process on the GPU (``run.gpu_procs``);
- ``nvml_ancestor``: NVML listed a child of a span-recording process (e.g. an inference worker
  the trainer spawned); the nearest recording ancestor owns the GPU;
- ``local_rank``: the process's ``local_rank`` picks the GPU, through its ``CUDA_VISIBLE_DEVICES``;
- ``rank_order``: the host's ranked processes take its remaining GPUs in rank order;
- ``single_controller``: one process (or only processes without a rank) recorded spans on the
  GPU's host — a verl driver, a single-process TRL run — and drives all its GPUs;
- ``single_controller_remote``: no process on the GPU's host recorded spans and the run as a
  whole has a single controller (on another host), which drives the GPU;
- ``none``: no rule applied; the GPU's samples get phase ``"(none)"`` and rank NaN.
"""

_MAX_ANCESTRY = 16  # levels of ppid followed for `nvml_ancestor`; process trees are shallow
_OWNER_COLUMNS = ["host", "gpu", "uuid", "owner_host", "pid", "rank", "how"]


# --------------------------------------------------------------------------------------------
# Inventory


def _gpu_inventory(run: Run, host_code: np.ndarray | None = None) -> pd.DataFrame:
    """Every (host, gpu) seen in the samples or listed in the metadata, with its uuid.
    ``host_code``: the samples' hosts as codes (-1: missing), when the caller has them."""
    rows = [
        (g.get("host"), g.get("index"), g.get("uuid"))
        for g in (run.meta.gpus or [])
        if isinstance(g, dict) and g.get("host") is not None and g.get("index") is not None
    ]
    gpu = run.gpu
    if gpu is None or not len(gpu):
        return _inventory(pd.DataFrame(rows, columns=["host", "gpu", "uuid"]))
    host, number = gpu["host"].astype(object), _num(gpu, "gpu")
    uuid = gpu["uuid"].astype(object) if "uuid" in gpu else None
    # only two samples per GPU can matter below: its first, and its first with a uuid
    first = _first_rows(host, number, uuid, host_code)
    # the metadata's GPUs, then the samples' (as one frame of them would read): hosts as
    # text, GPU numbers through float64, the first uuid that is not missing per GPU; a few
    # rows, so in Python rather than a frame's group-by
    meta_gpu = pd.Series([r[1] for r in rows], dtype=object).astype(np.float64).to_numpy()
    hosts = pd.Series([*(r[0] for r in rows), *host.to_numpy(object)[first]], dtype=object)
    hosts = hosts.astype(str)
    numbers = np.concatenate([meta_gpu, number[first]]).astype(np.int64)
    seen = uuid.to_numpy(object)[first] if uuid is not None else [None] * len(first)
    uuids = [*(r[2] for r in rows), *seen]
    found: dict[tuple[Any, int], Any] = {}
    for h, g, u in zip(hosts.to_numpy(object), numbers.tolist(), uuids):
        if pd.isna(h):  # no host: in no group
            continue
        if found.get((h, g)) is None:
            found[(h, g)] = None if pd.isna(u) else u
    if not found:
        return _inventory(pd.DataFrame({"host": hosts, "gpu": numbers, "uuid": uuids}))
    keys = sorted(found)
    return pd.DataFrame(
        {
            "host": pd.Series([h for h, _ in keys], dtype=hosts.dtype),
            "gpu": np.array([g for _, g in keys], dtype=np.int64),
            # a GPU with no uuid reads None (the group-by's ``first`` of an object column)
            "uuid": pd.Series([found[k] for k in keys], dtype=object),
        }
    )


def _inventory(meta: pd.DataFrame) -> pd.DataFrame:
    """`_gpu_inventory` of the GPUs of ``meta`` (host, gpu, uuid rows) by a group-by."""
    if meta.empty:
        return pd.DataFrame(
            {"host": pd.Series([], dtype=object), "gpu": pd.Series([], dtype=np.int64),
             "uuid": pd.Series([], dtype=object)}
        )  # fmt: skip
    meta["gpu"] = meta["gpu"].astype(np.int64)
    meta["host"] = meta["host"].astype(str)
    # the first non-null uuid per GPU (metadata first, then samples)
    inv = meta.groupby(["host", "gpu"], sort=True)["uuid"].first().reset_index()
    inv["uuid"] = inv["uuid"].astype(object)
    return inv


def _first_rows(
    host: pd.Series,
    number: np.ndarray,
    uuid: pd.Series | None,
    host_code: np.ndarray | None = None,
) -> np.ndarray:
    """Positions (ascending) of the first sample of each (host, gpu) and of its first sample
    with a uuid: the first non-null uuid per GPU over these rows is the one over all samples.
    ``host_code``: ``host`` as codes (-1: missing), when already known."""
    if host_code is None:
        host_code = pd.factorize(host)[0].astype(np.int64)
    ok = (host_code >= 0) & ~np.isnan(number)
    rows = np.flatnonzero(ok)
    numbers = number[rows]
    if len(rows) and (np.isfinite(numbers) & (numbers == np.round(numbers))).all():
        gpu_code, width = dense_codes(numbers.astype(np.int64))  # GPU indices: no hashing
    else:
        gpu_code = pd.factorize(numbers)[0].astype(np.int64)
        width = int(gpu_code.max(initial=0)) + 1
    key = host_code[rows] * max(width, 1) + gpu_code
    size = int(key.max(initial=0)) + 1
    if size <= 4 * len(key) + 1024:
        # the first position of each key: written from the last row to the first, the first
        # one written last
        seen = np.full(size, -1, dtype=np.int64)
        seen[key[::-1]] = np.arange(len(key) - 1, -1, -1)
        first = np.sort(seen[seen >= 0])
    else:
        first = first_rows(pd.factorize(key)[0])
    out = [rows[first]]
    if uuid is not None:
        has = uuid.to_numpy(object)[rows[first]]
        for i in np.flatnonzero(pd.isna(has)):  # a GPU whose first sample lacks a uuid
            same = rows[key == key[first[i]]]
            with_uuid = same[uuid.iloc[same].notna().to_numpy()]
            out.append(with_uuid[:1])
    return np.unique(np.concatenate(out))


# --------------------------------------------------------------------------------------------
# Owners


def _span_processes(
    run: Run, spans: pd.DataFrame, events: pd.DataFrame | None = None
) -> dict[str, np.ndarray]:
    """One entry per span-recording process, sorted by host and pid, as arrays: ``host``,
    ``pid``, ``rank`` and ``local_rank`` (the first its spans carry, else its process
    event's), ``cvd`` (CUDA_VISIBLE_DEVICES, None = unset or no event), ``ppid`` and the
    seconds its spans cover (``span_s``, summed). Arrays, not a frame: the rules read a few
    values of each process, and a frame's selections cost more than the figures."""
    if spans.empty:
        return {"host": np.zeros(0, dtype=object), "pid": np.zeros(0, dtype=np.int64),
                "rank": np.zeros(0), "local_rank": np.zeros(0), "cvd": np.zeros(0, dtype=object),
                "ppid": np.zeros(0), "span_s": np.zeros(0)}  # fmt: skip
    host = spans["host"].to_numpy(object)
    pid = spans["pid"].to_numpy()
    # processes sorted by host, then pid (a sorted group-by on them); missing keys in none
    kept = np.flatnonzero(pd.notna(host) & pd.notna(pid))
    h_code, h_names = pd.factorize(host[kept], sort=True)
    p_names, p_code = np.unique(pid[kept], return_inverse=True)
    keys, group = np.unique(h_code * len(p_names) + p_code, return_inverse=True)
    n = len(keys)
    dur_s = (spans["end_ns"].to_numpy()[kept] - spans["start_ns"].to_numpy()[kept]) / 1e9
    span_s = pd.Series(dur_s, copy=False).groupby(group).sum().to_numpy(np.float64)
    out = {
        "host": np.asarray(h_names, dtype=object)[keys // len(p_names)],
        "pid": p_names[keys % len(p_names)],
        # the first rank a process's spans carry (a group-by's ``first``: NaN skipped)
        "rank": first_valid(group, n, spans["rank"].to_numpy(np.float64)[kept]),
        "local_rank": first_valid(group, n, spans["local_rank"].to_numpy(np.float64)[kept]),
        "cvd": np.full(n, None, dtype=object),
        "ppid": np.full(n, np.nan),
        "span_s": span_s,
    }
    info = events if events is not None else _process_events(run)
    if len(info):  # the process events (one per process): what the spans do not carry
        at = {(h, int(p)): i for i, (h, p) in enumerate(zip(info["host"], info["pid"]))}
        found = np.array([at.get((h, int(p)), -1) for h, p in zip(out["host"], out["pid"])])
        hit = found >= 0
        rows = found[hit]
        for col in ("rank", "local_rank"):  # the spans' own value first, the event's next
            value = pd.to_numeric(info[f"{col}_ev"], errors="coerce").to_numpy(np.float64)
            missing = hit & np.isnan(out[col])
            out[col][missing] = value[found[missing]]
        out["cvd"][hit] = info["cvd"].to_numpy(object)[rows]
        out["ppid"][hit] = pd.to_numeric(info["ppid"], errors="coerce").to_numpy(np.float64)[rows]
    return out


def _process_events(run: Run) -> pd.DataFrame:
    """The ``process``/``start`` events hooks write once per process: rank, local_rank,
    CUDA_VISIBLE_DEVICES (None = unset) and ppid."""
    ev = run.events
    if ev is None or ev.empty or "kind" not in ev:
        return _no_process_events()
    rows = np.flatnonzero(
        (ev["kind"].to_numpy(object) == "process") & ev["host"].notna().to_numpy(bool)
        & ev["pid"].notna().to_numpy(bool)
    )  # fmt: skip
    if not len(rows):
        return _no_process_events()
    host = ev["host"].astype(object).to_numpy()[rows]
    pid = _num(ev, "pid", rows).astype(np.int64)
    # one row per process: its last event (as ``drop_duplicates(keep="last")``)
    last = np.sort(len(rows) - 1 - first_rows(appearance_codes([host[::-1], pid[::-1]])))
    rows, host, pid = rows[last], host[last], pid[last]
    attrs = [a if isinstance(a, dict) else {} for a in ev["attrs"].to_numpy(object)[rows]]
    return pd.DataFrame(
        {
            "host": host,
            "pid": pid,
            "rank_ev": _num(ev, "rank", rows),
            "local_rank_ev": pd.to_numeric(
                pd.Series([a.get("local_rank") for a in attrs], dtype=object), errors="coerce"
            ).to_numpy(np.float64),
            "cvd": [a.get("cuda_visible_devices") for a in attrs],
            "ppid": pd.to_numeric(
                pd.Series([a.get("ppid") for a in attrs], dtype=object), errors="coerce"
            ).to_numpy(np.float64),
        },
        index=last,
    )


def _no_process_events() -> pd.DataFrame:
    """`_process_events` of a run without any: its columns, empty (pid int64, the others
    object), made column by column (an ``astype`` of an empty frame costs milliseconds)."""
    cols = ["host", "pid", "rank_ev", "local_rank_ev", "cvd", "ppid"]
    return pd.DataFrame({c: np.zeros(0, dtype=np.int64 if c == "pid" else object) for c in cols})


def _visible_devices(cvd: Any, uuids: np.ndarray, gpus: np.ndarray) -> list[int] | None:
    """GPU indices a ``CUDA_VISIBLE_DEVICES`` value exposes, in order; None when unset.
    ``uuids``, ``gpus``: the host's GPUs (`_gpu_inventory` rows).

    Follows CUDA: entries are indices or (prefixes of) ``GPU-`` uuids, and enumeration stops
    at the first entry that names no GPU (so ``"-1"`` or ``""`` hide every GPU).
    """
    if cvd is None or (isinstance(cvd, float) and np.isnan(cvd)):
        return None
    uuids = [(str(u), int(g)) for u, g in zip(uuids, gpus) if u]
    out: list[int] = []
    for token in str(cvd).split(","):
        token = token.strip()
        if token.isdigit():
            out.append(int(token))
            continue
        matches = [g for u, g in uuids if token and u.startswith(token)]
        if len(matches) != 1:
            break
        out.append(matches[0])
    return out


def gpu_owner(run: Run) -> pd.DataFrame:
    """Which span-recording process drives each GPU.

    One row per (host, gpu) of the inventory (samples ∪ ``meta.gpus``), columns: ``host``,
    ``gpu``, ``uuid``, ``owner_host`` and ``pid`` of the owning process (it differs from
    ``host`` only for ``single_controller_remote``), its ``rank`` (NaN when it has none) and
    ``how`` — the rule that decided, tried in the priority order documented in `OWNER_HOW`.
    A GPU no rule resolves has NaN pid/rank and ``how == "none"``. One process may own
    several GPUs (a controller); a GPU has at most one owner. Rule ``local_rank`` assumes
    CUDA numbers the GPUs as NVML does (true for identical GPUs; with mixed models set
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in the job, or rely on NVML's process list).
    """
    spans, _ = valid_spans(run)
    return _gpu_owner(run, spans)


def _gpu_owner(run: Run, spans: pd.DataFrame, host_code: np.ndarray | None = None) -> pd.DataFrame:
    inv = _gpu_inventory(run, host_code)
    events = _process_events(run)
    procs = _span_processes(run, spans, events)
    p_host, p_pid, p_rank = procs["host"], procs["pid"], procs["rank"]
    owner: dict[tuple[str, int], tuple[str, int, str]] = {}  # (host, gpu) → (host, pid, how)
    recording = {(h, int(p)) for h, p in zip(p_host, p_pid)}
    claimed: set[tuple[str, int]] = set()  # processes that already own a GPU by rules a/b/c

    # (a) NVML saw the process (or a child of it) on the GPU with memory
    for key, (o_host, o_pid, how) in _nvml_owners(run, recording, events).items():
        owner[key] = (o_host, o_pid, how)
        claimed.add((o_host, o_pid))

    # each host's processes (in host, pid order) and GPUs (in gpu order), as positions
    procs_of: dict[Any, list[int]] = {}
    for i, h in enumerate(p_host):
        procs_of.setdefault(h, []).append(i)
    inv_host = inv["host"].to_numpy(object)
    inv_gpu, inv_uuid = inv["gpu"].to_numpy(), inv["uuid"].to_numpy(object)
    gpus_of: dict[Any, list[int]] = {}
    for i, h in enumerate(inv_host):
        gpus_of.setdefault(h, []).append(i)
    for host in sorted(gpus_of):
        rows = gpus_of[host]
        gpus = [int(g) for g in inv_gpu[rows]]
        hp = procs_of.get(host, [])
        # (b) local_rank → the local_rank-th GPU the process can see
        for i in hp:
            pid, local_rank = int(p_pid[i]), procs["local_rank"][i]
            if (host, pid) in claimed or not np.isfinite(local_rank):
                continue
            visible = _visible_devices(procs["cvd"][i], inv_uuid[rows], inv_gpu[rows])
            lr = int(local_rank)
            if visible is None:
                target = lr
            elif lr < len(visible):
                target = visible[lr]
            else:
                continue  # CUDA would have refused this device: no evidence of a GPU
            if target in gpus and (host, target) not in owner:
                owner[(host, target)] = (host, pid, "local_rank")
                claimed.add((host, pid))
        # (c) remaining ranked processes take the remaining GPUs in rank order
        ranked = sorted((i for i in hp if not np.isnan(p_rank[i])),
                        key=lambda i: (p_rank[i], p_pid[i]))  # fmt: skip
        left_procs = [int(p_pid[i]) for i in ranked if (host, int(p_pid[i])) not in claimed]
        left_gpus = [g for g in gpus if (host, g) not in owner]
        for pid, gpu in zip(left_procs, left_gpus):
            owner[(host, gpu)] = (host, pid, "rank_order")
            claimed.add((host, pid))
        # (d) a single controller on this host drives every GPU still unowned
        controller = _controller(procs, hp)
        if controller is not None:
            for gpu in gpus:
                owner.setdefault((host, gpu), (*controller, "single_controller"))

    # (d') GPUs on hosts where nothing recorded spans: the run's single controller, if any
    controller = _controller(procs, range(len(p_host)))
    if controller is not None:
        span_hosts = set(p_host)
        for host, gpu in zip(inv_host, inv_gpu):
            if host not in span_hosts:
                owner.setdefault((host, int(gpu)), (*controller, "single_controller_remote"))

    rank_of = {(h, int(p)): r for h, p, r in zip(p_host, p_pid, p_rank.tolist())}
    rows = []
    for host, gpu, uuid in zip(inv_host, inv_gpu.tolist(), inv_uuid):
        o = owner.get((host, int(gpu)))
        if o is None:
            rows.append((host, int(gpu), uuid, None, np.nan, np.nan, "none"))
        else:
            rank = rank_of.get((o[0], o[1]), np.nan)
            rows.append((host, int(gpu), uuid, o[0], float(o[1]), float(rank), o[2]))
    out = pd.DataFrame(rows, columns=_OWNER_COLUMNS)
    typed = {"gpu": np.int64, "pid": np.float64, "rank": np.float64}
    if all(out[c].dtype == t for c, t in typed.items()):  # as built (an astype would copy)
        return out
    return out.astype(typed)


def _controller(procs: dict[str, np.ndarray], among: Any) -> tuple[str, int] | None:
    """(host, pid) of the single controller among the span-recording processes at positions
    ``among`` (in host, pid order): the only one, or — when none of them has a rank — the
    one whose spans cover the most time (a driver's spans span the step; helper processes
    record short ones); of equal ones the lowest pid, then the first."""
    among = list(among)
    if not among:
        return None
    if len(among) == 1 or np.isnan(procs["rank"][among]).all():
        span_s, pid = procs["span_s"], procs["pid"]
        # most time first (NaN last), then lowest pid; ``min`` keeps the first of ties
        best = min(among, key=lambda i: (-span_s[i] if span_s[i] == span_s[i] else np.inf,
                                         pid[i]))  # fmt: skip
        return str(procs["host"][best]), int(pid[best])
    return None


def _nvml_owners(
    run: Run, recording: set[tuple[str, int]], events: pd.DataFrame | None = None
) -> dict[tuple[str, int], tuple[str, int, str]]:
    """Rule (a): for each GPU, the span-recording process NVML saw on it.

    A pid NVML lists that recorded no spans is followed up its parents (``run.procs`` and the
    ``process`` events give ppid) to the nearest recording ancestor. Several candidates on one
    GPU — typically every rank leaving a small context on GPU 0 — are ranked by direct match,
    then peak device memory, then how often NVML listed them.
    """
    gp = run.gpu_procs
    if gp is None or gp.empty or not recording:
        return {}
    host_code, hosts = pd.factorize(gp["host"].astype(object))
    gpu, pid, mem = _num(gp, "gpu"), _num(gp, "pid"), _num(gp, "gpu_mem_bytes")
    # "seen with memory": a listed pid holding 0 bytes has no context worth owning the GPU;
    # NaN means NVML could not tell (containers), which still proves a context exists
    rows = np.flatnonzero((host_code >= 0) & ~np.isnan(gpu) & ~np.isnan(pid) & ~(mem <= 0))
    if len(rows) == 0:
        return {}
    # one candidate per (host, gpu, pid), in order of appearance: peak memory, times listed
    group = appearance_codes([host_code[rows], gpu[rows], pid[rows]])
    first = rows[first_rows(group)]
    peak = np.full(len(first), np.nan)
    np.fmax.at(peak, group, mem[rows])  # NaN only where no listing had a reading
    cand_host = np.asarray(hosts, dtype=object)[host_code[first]]
    cand_gpu, cand_pid = gpu[first], pid[first]
    seen = np.bincount(group, minlength=len(first))
    parents = _parent_map(run, events)
    found = []  # (candidate, owner pid, direct): one per (gpu, process), not per sample
    for i, (host, p) in enumerate(zip(cand_host, cand_pid.tolist())):
        owner_pid, is_direct = _recording_ancestor(host, int(p), recording, parents)
        if owner_pid == owner_pid:  # not NaN: a recording process
            found.append((i, owner_pid, is_direct))
    if not found:
        return {}
    mem_rank = np.where(np.isnan(peak), -1.0, peak)
    # direct first, then the most memory, the most listings, the lowest pid (a stable sort:
    # the first candidate of equal ones); the first of each GPU wins
    found.sort(key=lambda c: (not c[2], -mem_rank[c[0]], -seen[c[0]], c[1]))
    best: dict[tuple[str, int], tuple[str, int, str]] = {}
    for i, owner_pid, is_direct in found:
        key = (cand_host[i], cand_gpu[i])
        if key not in best:
            best[key] = (cand_host[i], int(owner_pid), "nvml" if is_direct else "nvml_ancestor")
    return {(h, int(g)): value for (h, g), value in best.items()}


def _parent_map(run: Run, events: pd.DataFrame | None = None) -> dict[tuple[str, int], int]:
    """(host, pid) → ppid from the watcher's process samples and the hooks' process events."""
    parents: dict[tuple[str, int], int] = {}
    procs = run.procs
    if procs is not None and len(procs) and "ppid" in procs:
        host_code, hosts = pd.factorize(procs["host"].astype(object))
        pid, ppid = _num(procs, "pid"), _num(procs, "ppid")
        rows = np.flatnonzero((host_code >= 0) & ~np.isnan(pid) & ~np.isnan(ppid))
        # the last sample of each (host, pid): first rows of the reversed order
        key = appearance_codes([host_code[rows][::-1], pid[rows][::-1]])
        last = rows[::-1][first_rows(key)]
        names = np.asarray(hosts, dtype=object)[host_code[last]]
        parents.update({(h, int(c)): int(q) for h, c, q in zip(names, pid[last], ppid[last])})
    ev = (events if events is not None else _process_events(run)).dropna(subset=["ppid"])
    parents.update({(h, int(c)): int(q) for h, c, q in zip(ev["host"], ev["pid"], ev["ppid"])})
    return parents


def _recording_ancestor(
    host: str, pid: int, recording: set[tuple[str, int]], parents: dict[tuple[str, int], int]
) -> tuple[float, bool]:
    """The pid itself when it recorded spans (direct), else its nearest recording ancestor."""
    if (host, pid) in recording:
        return float(pid), True
    seen = {pid}
    for _ in range(_MAX_ANCESTRY):
        pid = parents.get((host, pid), -1)
        if pid <= 1 or pid in seen:  # init / unknown / a cycle in bad data
            return np.nan, False
        if (host, pid) in recording:
            return float(pid), False
        seen.add(pid)
    return np.nan, False
