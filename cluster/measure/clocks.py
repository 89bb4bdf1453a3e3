"""GPU clocks and temperature around a measurement (NVML)."""

from __future__ import annotations

GPU_STATE_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "temp_c")


def gpu_state() -> dict[str, int | None]:
    """SM / memory clocks (MHz) and temperature (C) of the current GPU via
    NVML; None each where nvidia-ml-py or the GPU is absent."""
    try:
        import pynvml
        import torch
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)}
    except Exception:  # noqa: BLE001 - no NVML is "not read", not an error
        return dict.fromkeys(GPU_STATE_KEYS)


def gpu_columns(before: dict, after: dict, device_name: str | None) -> dict:
    """The results' GPU columns from :func:`gpu_state` before and after."""
    return {"sm_clock_mhz_before": before["sm_clock_mhz"],
            "sm_clock_mhz_after": after["sm_clock_mhz"],
            "mem_clock_mhz": before["mem_clock_mhz"], "temp_c_before": before["temp_c"],
            "temp_c_after": after["temp_c"], "gpu_model": device_name}
