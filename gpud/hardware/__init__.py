"""Hardware samplers: NVML, simulated GPUs and the host (psutil, sysfs).

Nothing here imports the daemon, zmq or a UI; a sampler is a plain object that returns
frozen records from `gpud.model.snapshot`.
"""
