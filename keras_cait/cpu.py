"""What this machine's CPU computes with: its feature flags (Linux's /proc/cpuinfo), from which a run
picks its default precision and an int8 export says which OpenVINO path was measured fastest."""

BFLOAT16_UNITS = ("avx512_bf16", "amx_bf16")


def cpu_flags():
    """The CPU's feature flags (`avx512_bf16`, `amx_bf16`, ...); an empty set where they cannot be read
    (another OS)."""
    try:
        with open("/proc/cpuinfo") as file:
            return {flag for line in file if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    except OSError:
        return set()
