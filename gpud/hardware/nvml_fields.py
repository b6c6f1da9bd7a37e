"""Decoding NVML's raw answers into the units and names of `gpud.model.snapshot`.

Pure functions, no NVML calls: bytes-or-str text, field values by their value type,
clock-event bitmasks, CUDA version integers, NVML's "not available" sentinels.
"""

from __future__ import annotations

from typing import Any

import pynvml

#: nvmlClocksEventReason* bits from nvml.h; the values are ABI, fixed across drivers
#: (older pynvml only names them nvmlClocksThrottleReason*).
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
_KNOWN_REASON_BITS = sum(bit for bit, _ in CLOCK_EVENT_REASONS)

#: nvmlValueType_t → the member of the nvmlValue_t union that holds the value.
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}

#: What NVML puts in a 64-bit field it cannot fill (NVML_VALUE_NOT_AVAILABLE).
NOT_AVAILABLE_U64 = 2**64 - 1


def text(value: Any) -> str | None:
    """A string NVML returned; pynvml gives str or bytes depending on its version."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return str(value) if value else None


def as_int(value: Any) -> int | None:
    return None if value is None else int(value)


def as_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


def milliwatts_to_w(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def memory_bytes(value: Any) -> int | None:
    """A process's GPU memory: None when NVML cannot tell (e.g. under WDDM or in a VM)."""
    if value is None or int(value) >= NOT_AVAILABLE_U64:
        return None
    return int(value)


def cuda_version(value: int) -> str:
    """NVML's CUDA version integer (12040) as people write it ("12.4")."""
    return f"{value // 1000}.{value % 1000 // 10}"


def clock_event_reasons(mask: int) -> list[str]:
    """The active clock-event (throttle) reasons in a bitmask, by snake_case name."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    unknown = mask & ~_KNOWN_REASON_BITS
    names += [f"unknown_0x{1 << b:x}" for b in range(unknown.bit_length()) if unknown >> b & 1]
    return names


def field_value_number(value: Any) -> float | None:
    """The number in one nvmlFieldValue_t; None when NVML could not fill that field."""
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    member = _VALUE_MEMBERS.get(value.valueType)
    return None if member is None else float(getattr(value.value, member))


#: Above this no memory sensor reads: DCGM drops such a value, and so does gpud.
MAX_MEMORY_TEMPERATURE_C = 200


def memory_temperature_c(value: Any) -> float | None:
    """NVML_FI_DEV_MEMORY_TEMP in °C, as DCGM reads it; None where NVML has no value.

    r545 drivers mark this field a double while writing an unsigned int (NVIDIA bug
    4300930), so DCGM always reads the int. Read as a double, such an int is a tiny
    denormal; a double is believed only when it is a temperature, else the int is read."""
    if value is None or value.nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    celsius = float(value.value.dVal)
    if value.valueType != pynvml.NVML_VALUE_TYPE_DOUBLE or celsius < 1.0:
        celsius = float(value.value.uiVal)
    return None if celsius > MAX_MEMORY_TEMPERATURE_C else celsius
