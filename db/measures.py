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
    "kv_bytes_used", "kv_bytes_allocated", "torch_allocated", "torch_reserved", "nvml_process", "nvml_device", "rss",
)
# The sampled series whose maximum is the peak measure of the same meaning.
PEAK_OF_SERIES: dict[str, str] = {
    "kv_bytes_used": "kv_bytes_used",
    "kv_bytes_allocated": "kv_bytes_allocated",
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
