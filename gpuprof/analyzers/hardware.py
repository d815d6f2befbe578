"""The GPUs' data-sheet figures: dense peak tensor FLOP/s per dtype, memory bandwidth and memory
size, and matching a driver's product name to its row.

Every row names the vendor document its figures come from (the comment above it). NVIDIA data
sheets print tensor figures "with sparsity" (marked * below) for Ampere and later; the dense
figure, used here, is half of it. Memory bandwidth is the data sheet's peak (HBM or GDDR) per
device as the driver lists it; MI250/MI250X packages are two devices, so half the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GPU_TABLE", "GpuSpec", "match_gpu"]


@dataclass(frozen=True)
class GpuSpec:
    """Data-sheet figures of one GPU (one device as the driver lists it): dense peak throughput
    in FLOP/s per dtype (None where the GPU has no such tensor path or the data sheet gives no
    figure), peak memory bandwidth ``hbm_bytes_s`` (bytes/s) and memory ``memory_bytes``."""

    model: str
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float | None
    fp8: float | None
    source: str
    hbm_bytes_s: float
    memory_bytes: float

    def flops(self, dtype: str) -> float | None:
        """Peak FLOP/s at ``dtype`` (``bf16``, ``fp16``, ``tf32``, ``fp32``, ``fp8``)."""
        return getattr(self, dtype, None)

    def training_dtype(self) -> str | None:
        """bf16 where the GPU has it, else fp16 (V100, T4 train in fp16 mixed precision)."""
        for dtype in ("bf16", "fp16"):
            if self.flops(dtype):
                return dtype
        return None


def _row(model: str, bf16, fp16, tf32, fp32, fp8, source: str, tb_s: float, gb: float) -> GpuSpec:
    scale = 1e12  # the table below is in TFLOP/s, TB/s (10^12 bytes/s) and GB (10^9 bytes)
    values = [None if v is None else float(v) * scale for v in (bf16, fp16, tf32, fp32, fp8)]
    return GpuSpec(model, *values, source=source, hbm_bytes_s=tb_s * scale, memory_bytes=gb * 1e9)


# Dense TFLOP/s at boost clock (bf16, fp16, tf32, fp32, fp8), then memory TB/s and GB. Memory:
# H100 SXM/H800 SXM HBM3 3.35 TB/s 80 GB, PCIe HBM2e 2 TB/s 80 GB, H100 NVL 3.9 TB/s 94 GB;
# H200 HBM3e 4.8 TB/s 141 GB; GH200 HBM3 4 TB/s 96 GB (the 144 GB HBM3e board: 4.9 TB/s);
# H20 4.0 TB/s 96 GB; A100 40 GB 1,555 GB/s, SXM4 80 GB 2,039 GB/s, PCIe 80 GB 1,935 GB/s (A800
# alike); A10/A10G 600 GB/s 24 GB; A40 696 GB/s 48 GB; L4 300 GB/s 24 GB; L40/L40S 864 GB/s
# 48 GB; V100 900 GB/s 16/32 GB, V100S 1,134 GB/s; T4 320 GB/s 16 GB; RTX 4090 1,008 GB/s;
# RTX 3090 936 GB/s; RTX A6000 768 GB/s 48 GB; HGX B200 64 TB/s, 1.4 TB for 8 GPUs; GB200
# NVL72 576 TB/s, 13.4 TB for 72; MI250/MI250X 3.2 TB/s 128 GB per package; MI300X 5.3 TB/s
# 192 GB.
GPU_TABLE: dict[str, GpuSpec] = {
    # NVIDIA H100 Tensor Core GPU data sheet (H100 SXM column): BF16/FP16 1,979*, TF32 989*,
    # FP8 3,958*, FP32 67.
    "H100 SXM": _row(
        "H100 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H100 data sheet, SXM", 3.35, 80
    ),
    # same data sheet, H100 PCIe column: BF16/FP16 1,513*, TF32 756*, FP8 3,026*, FP32 51.
    "H100 PCIe": _row(
        "H100 PCIe", 756.5, 756.5, 378, 51, 1513, "NVIDIA H100 data sheet, PCIe", 2.0, 80
    ),
    # same data sheet, H100 NVL column (per GPU): BF16/FP16 1,671*, TF32 835*, FP8 3,341*,
    # FP32 60.
    "H100 NVL": _row(
        "H100 NVL", 835.5, 835.5, 417.5, 60, 1670.5, "NVIDIA H100 data sheet, NVL", 3.9, 94
    ),
    # NVIDIA H200 Tensor Core GPU data sheet, H200 SXM column: same tensor figures as H100 SXM.
    "H200 SXM": _row(
        "H200 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H200 data sheet, SXM", 4.8, 141
    ),
    # same data sheet, H200 NVL column: BF16/FP16 1,671*, TF32 835*, FP8 3,341*, FP32 60.
    "H200 NVL": _row(
        "H200 NVL", 835.5, 835.5, 417.5, 60, 1670.5, "NVIDIA H200 data sheet, NVL", 4.8, 141
    ),
    # NVIDIA GH200 Grace Hopper Superchip data sheet (the Hopper GPU): BF16 1,979*, TF32 989*,
    # FP8 3,958*, FP32 67.
    "GH200": _row("GH200", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA GH200 data sheet", 4.0, 96),
    # NVIDIA H800 SXM5 / PCIe product briefs: the H100's tensor throughput (FP64 and NVLink
    # reduced).
    "H800 SXM": _row(
        "H800 SXM", 989.5, 989.5, 494.5, 67, 1979, "NVIDIA H800 SXM5 product brief", 3.35, 80
    ),
    "H800 PCIe": _row(
        "H800 PCIe", 756.5, 756.5, 378, 51, 1513, "NVIDIA H800 PCIe product brief", 2.0, 80
    ),
    # NVIDIA HGX H20 product brief: BF16/FP16 148, TF32 74, FP8 296, FP32 44 (dense).
    "H20": _row("H20", 148, 148, 74, 44, 296, "NVIDIA HGX H20 product brief", 4.0, 96),
    # NVIDIA A100 Tensor Core GPU data sheet: BF16/FP16 312 (624*), TF32 156 (312*), FP32 19.5;
    # the same for the 40 GB and 80 GB, SXM4 and PCIe boards. No FP8.
    "A100 SXM4 40GB": _row(
        "A100 SXM4 40GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet", 1.555, 40
    ),
    "A100 SXM4 80GB": _row(
        "A100 SXM4 80GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet", 2.039, 80
    ),
    "A100 PCIe 40GB": _row(
        "A100 PCIe 40GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet", 1.555, 40
    ),
    "A100 PCIe 80GB": _row(
        "A100 PCIe 80GB", 312, 312, 156, 19.5, None, "NVIDIA A100 data sheet", 1.935, 80
    ),
    # NVIDIA A800 40GB/80GB product briefs: the A100's tensor throughput (NVLink reduced).
    "A800 SXM4": _row(
        "A800 SXM4", 312, 312, 156, 19.5, None, "NVIDIA A800 product brief", 2.039, 80
    ),
    "A800 PCIe": _row(
        "A800 PCIe", 312, 312, 156, 19.5, None, "NVIDIA A800 product brief", 1.935, 80
    ),
    # NVIDIA A10 Tensor Core GPU data sheet: BF16/FP16 125 (250*), TF32 62.5 (125*), FP32 31.2.
    "A10": _row("A10", 125, 125, 62.5, 31.2, None, "NVIDIA A10 data sheet", 0.6, 24),
    # A10G (AWS EC2 G5 only; NVIDIA publishes no data sheet): AWS's figures as tabulated by
    # Baseten, "NVIDIA A10 vs A10G for ML model inference": FP16/BF16 tensor 70, FP32 35
    # (80 SMs at 1.71 GHz, GA102 tensor rate with FP32 accumulate).
    "A10G": _row("A10G", 70, 70, 35, 35, None, "AWS G5 / Baseten A10 vs A10G", 0.6, 24),
    # NVIDIA A40 data sheet: BF16 149.7 (299.4*), TF32 74.8 (149.6*), FP32 37.4.
    "A40": _row("A40", 149.7, 149.7, 74.8, 37.4, None, "NVIDIA A40 data sheet", 0.696, 48),
    # NVIDIA L4 Tensor Core GPU data sheet: BF16/FP16 242*, TF32 120*, FP8 485*, FP32 30.3.
    "L4": _row("L4", 121, 121, 60, 30.3, 242.5, "NVIDIA L4 data sheet", 0.3, 24),
    # NVIDIA L40 data sheet: BF16/FP16 181.05 (362.1*), TF32 90.5 (181*), FP8 362 (724*),
    # FP32 90.5.
    "L40": _row("L40", 181.05, 181.05, 90.5, 90.5, 362, "NVIDIA L40 data sheet", 0.864, 48),
    # NVIDIA L40S data sheet: BF16/FP16 362.05 (733*), TF32 183 (366*), FP8 733 (1,466*),
    # FP32 91.6.
    "L40S": _row("L40S", 362.05, 362.05, 183, 91.6, 733, "NVIDIA L40S data sheet", 0.864, 48),
    # NVIDIA V100 Tensor Core GPU data sheet: tensor (FP16) 125 SXM2 / 112 PCIe / 130 V100S;
    # FP32 15.7 / 14 / 16.4. No BF16, TF32 or FP8.
    "V100 SXM2": _row(
        "V100 SXM2", None, 125, None, 15.7, None, "NVIDIA V100 data sheet, SXM2", 0.9, 32
    ),
    "V100 PCIe": _row(
        "V100 PCIe", None, 112, None, 14, None, "NVIDIA V100 data sheet, PCIe", 0.9, 32
    ),
    "V100S PCIe": _row(
        "V100S PCIe", None, 130, None, 16.4, None, "NVIDIA V100S data sheet", 1.134, 32
    ),
    # NVIDIA T4 data sheet: mixed precision (FP16/FP32) 65, FP32 8.1.
    "T4": _row("T4", None, 65, None, 8.1, None, "NVIDIA T4 data sheet", 0.32, 16),
    # NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090: FP16/BF16 tensor with FP32
    # accumulate 165.2 (330.4*), TF32 82.6 (165.2*), FP8 with FP32 accumulate 330.3 (660.6*),
    # FP32 82.6.
    "RTX 4090": _row(
        "RTX 4090", 165.2, 165.2, 82.6, 82.6, 330.3, "NVIDIA Ada whitepaper", 1.008, 24
    ),
    # NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090: FP16/BF16 tensor with FP32 accumulate
    # 71 (142*), TF32 35.6 (71*), FP32 35.6.
    "RTX 3090": _row("RTX 3090", 71, 71, 35.6, 35.6, None, "NVIDIA GA102 whitepaper", 0.936, 24),
    # NVIDIA RTX A6000 data sheet: tensor 309.7* (FP16/BF16 dense 154.8), TF32 77.4, FP32 38.7.
    "RTX A6000": _row(
        "RTX A6000", 154.8, 154.8, 77.4, 38.7, None, "NVIDIA RTX A6000 data sheet", 0.768, 48
    ),
    # NVIDIA HGX B200 data sheet, per GPU: FP16/BF16 4.5 PF*, TF32 2.2 PF*, FP8 9 PF*; no FP32
    # figure.
    "B200": _row("B200", 2250, 2250, 1100, None, 4500, "NVIDIA HGX B200 data sheet", 8.0, 180),
    # NVIDIA GB200 NVL72 data sheet, rack figures / 72 GPUs: FP16/BF16 360 PF*, TF32 180 PF*,
    # FP8 720 PF*; no FP32 figure.
    "GB200": _row(
        "GB200", 2500, 2500, 1250, None, 5000, "NVIDIA GB200 NVL72 data sheet / 72", 8.0, 186
    ),
    # AMD Instinct MI250X / MI250 data sheets (no sparsity figures): FP16/BF16 383 / 362.1,
    # FP32 matrix 95.7 / 90.5 per package. The package is two GCDs that the driver lists as two
    # devices: per device, half. No TF32 or FP8.
    "MI250X": _row(
        "MI250X", 191.5, 191.5, None, 47.85, None, "AMD MI250X data sheet / 2 GCDs", 1.6, 64
    ),
    "MI250": _row(
        "MI250", 181.05, 181.05, None, 45.25, None, "AMD MI250 data sheet / 2 GCDs", 1.6, 64
    ),
    # AMD Instinct MI300X data sheet (dense): FP16/BF16 1,307.4, TF32 653.7, FP8 2,614.9,
    # FP32 163.4.
    "MI300X": _row(
        "MI300X", 1307.4, 1307.4, 653.7, 163.4, 2614.9, "AMD MI300X data sheet", 5.3, 192
    ),
}
"""Data-sheet figures per GPU model (see the comment above each row for its data sheet)."""

_NAME_NOISE = re.compile(r"\b(NVIDIA|TESLA|GEFORCE|AMD|INSTINCT|QUADRO|GRAPHICS)\b")

_MATCHERS: tuple[tuple[re.Pattern[str], str | None], ...] = tuple(
    (re.compile(pattern), key)
    for pattern, key in (
        (r"\bGH200\b", "GH200"),
        (r"\bGB200\b", "GB200"),
        (r"\bB200\b", "B200"),
        (r"\bH200\b.*\bNVL\b", "H200 NVL"),
        (r"\bH200\b", "H200 SXM"),
        (r"\bH100\b.*\bNVL\b", "H100 NVL"),
        (r"\bH100\b.*\b(PCIE|HBM2E)\b", "H100 PCIe"),
        (r"\bH100\b", "H100 SXM"),
        (r"\bH800\b.*\bPCIE\b", "H800 PCIe"),
        (r"\bH800\b", "H800 SXM"),
        (r"\bH20\b", "H20"),
        (r"\bA100\b.*\bPCIE\b.*\b80 ?GB\b|\bA100\b.*\b80 ?GB\b.*\bPCIE\b", "A100 PCIe 80GB"),
        (r"\bA100\b.*\bPCIE\b", "A100 PCIe 40GB"),
        (r"\bA100\b.*\b80 ?GB\b", "A100 SXM4 80GB"),
        (r"\bA100\b", "A100 SXM4 40GB"),
        (r"\bA800\b.*\bPCIE\b", "A800 PCIe"),
        (r"\bA800\b", "A800 SXM4"),
        (r"\bA10G\b", "A10G"),
        (r"\bA10\b", "A10"),
        (r"\bA40\b", "A40"),
        (r"\bL40S\b", "L40S"),
        (r"\bL40\b", "L40"),
        (r"\bL4\b", "L4"),
        (r"\bV100S\b", "V100S PCIe"),
        (r"\bV100\b.*\bSXM2\b", "V100 SXM2"),
        (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
        (r"\bV100\b", None),  # SXM3 / DGXS boards: clocks differ, no data-sheet row here
        (r"^T4\b", "T4"),
        (r"^RTX 4090$", "RTX 4090"),
        (r"^RTX 3090$", "RTX 3090"),
        (r"^RTX A6000$", "RTX A6000"),
        (r"\bMI250X\b.*\bMI250\b", None),  # "MI250X/MI250": ROCm's name for either board
        (r"\bMI250X\b", "MI250X"),
        (r"\bMI250\b", "MI250"),
        (r"\bMI300X\b", "MI300X"),
    )
)
"""Product-name patterns (on `_normalise_name`), most specific first; a ``None`` key stops the
search: the name is known to be ambiguous."""


def _normalise_name(name: str) -> str:
    text = re.sub(r"[-_/(),]+", " ", str(name).upper())
    text = _NAME_NOISE.sub(" ", text)
    return re.sub(r"\s+", " ", text).strip()


def match_gpu(name: str | None) -> GpuSpec | None:
    """The `GPU_TABLE` row of an NVML / nvidia-smi / ROCm product name (``"NVIDIA H100 80GB
    HBM3"`` → H100 SXM, ``"Tesla V100-SXM2-16GB"`` → V100 SXM2); None when the name is unknown
    or ambiguous (figures that need a peak then read "not available")."""
    if not name:
        return None
    text = _normalise_name(name)
    for pattern, key in _MATCHERS:
        if pattern.search(text):
            return GPU_TABLE[key] if key is not None else None
    return None
