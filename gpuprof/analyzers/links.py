"""Interconnect rates the loss models compare traffic with.

PCIe: usable bytes per second per direction of one lane, by generation (the signalling rate
less line coding: 8b/10b up to Gen2, 128b/130b for Gen3–Gen5; PCI-SIG specifications), times
the lanes. A GPU's own link comes from its inventory (NVML ``nvmlDeviceGetMaxPcieLinkGeneration``
/ ``…Width``, or nvidia-smi's ``pcie.link.gen.max`` / ``pcie.link.width.max`` and their
``current`` forms); without one, a Gen4 x16 link is assumed (A100 hosts; the commonest in
public clusters) and the evidence says so.
"""

from __future__ import annotations

from typing import Any

PCIE_LANE_BYTES_S: dict[int, float] = {
    1: 0.25e9,
    2: 0.5e9,
    3: 0.985e9,
    4: 1.969e9,
    5: 3.938e9,
    6: 7.563e9,
}
"""Usable bytes/s per lane and direction, by PCIe generation."""

ASSUMED_PCIE = (4, 16)
"""(generation, lanes) assumed when the inventory does not say."""


def pcie_link(gpu: dict[str, Any] | None) -> tuple[int, int, bool]:
    """(generation, lanes, known) of a GPU's PCIe link from its inventory entry: the maximum
    where recorded (an idle GPU trains its link down), else the current one, else
    `ASSUMED_PCIE` with ``known`` False."""
    gpu = gpu or {}
    gen = _positive(gpu.get("pcie_link_gen_max")) or _positive(gpu.get("pcie_link_gen"))
    width = _positive(gpu.get("pcie_link_width_max")) or _positive(gpu.get("pcie_link_width"))
    if gen in PCIE_LANE_BYTES_S and width:
        return gen, width, True
    return ASSUMED_PCIE[0], ASSUMED_PCIE[1], False


def pcie_bytes_s(gen: int, lanes: int) -> float:
    """Usable bytes/s per direction of a PCIe link."""
    return PCIE_LANE_BYTES_S[gen] * lanes


def _positive(value: Any) -> int | None:
    try:
        out = int(value)
    except (TypeError, ValueError):
        return None
    return out if out > 0 else None
