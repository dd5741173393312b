"""The memory measures' names: one home for the vocabulary the sampler writes and every reader plots.

Pure constants (no sqlalchemy import), so the memory sampler and `loopeval profile` can use them on
a machine where only torch is installed. Bytes are reported in decimal GB (1e9 bytes).
"""

from __future__ import annotations

# The peaks stored per run (`memory_peaks`), in this order.
PEAK_MEASURES: tuple[str, ...] = (
    "weights_bytes",
    "kv_bytes_allocated",
    "kv_bytes_used",
    "kv_bytes_peak",
    "kv_bytes_reserved",
    "torch_allocated_peak",
    "torch_reserved_peak",
    "nvml_process_peak",
    "nvml_device_peak",
    "rss_peak",
)
# The per-tick readings (columns of `memory_samples`), in the order the memory-over-a-run figure draws them.
SERIES_MEASURES: tuple[str, ...] = (
    "kv_bytes_used", "kv_bytes_allocated", "kv_bytes_reserved", "torch_allocated", "torch_reserved", "nvml_process", "nvml_device", "rss",
)
# The sampled series whose maximum is the peak measure of the same meaning.
PEAK_OF_SERIES: dict[str, str] = {
    "kv_bytes_used": "kv_bytes_used",
    "kv_bytes_allocated": "kv_bytes_allocated",
    "kv_bytes_reserved": "kv_bytes_reserved",
    "torch_allocated": "torch_allocated_peak",
    "torch_reserved": "torch_reserved_peak",
    "nvml_process": "nvml_process_peak",
    "nvml_device": "nvml_device_peak",
    "rss": "rss_peak",
}
# The peaks `loopeval profile` records per context length (profile points), measured ones only.
PROFILE_MEASURES: tuple[str, ...] = (
    "kv_bytes_allocated", "kv_bytes_used", "torch_allocated_peak", "torch_reserved_peak",
    "nvml_process_peak", "nvml_device_peak", "rss_peak",
)
# Decimal byte units, largest first: every view scales bytes with these (1 GB = 1e9 bytes).
BYTE_UNITS: tuple[tuple[str, float], ...] = (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1.0))


def byte_text(value: float | None) -> str:
    """Bytes in the largest decimal unit that keeps them at or above 1, 3 significant digits: '1.28 MB'.

    None (and NaN) is an unavailable source and reads "n/a", never "0".
    """
    if value is None or value != value:
        return "n/a"
    unit, scale = next(((u, s) for u, s in BYTE_UNITS if abs(value) >= s), BYTE_UNITS[-1])
    return f"{int(value)} B" if unit == "B" else f"{value / scale:.3g} {unit}"
