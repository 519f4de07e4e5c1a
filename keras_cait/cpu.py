"""What this machine's CPU computes with: its feature flags (Linux's /proc/cpuinfo), from which a run
picks its default precision and an int8 export says which OpenVINO path was measured fastest."""

BFLOAT16_UNITS = ("avx512_bf16", "amx_bf16")


def cpu_flags():
    """The CPU's feature flags (`avx512_bf16`, `amx_bf16`, ...); an empty set where they cannot be read
    (another OS)."""
    try:
        with open("/proc/cpuinfo") as file:
            return {flag for line in file if line.partition(":")[0].strip() == "flags"
                    for flag in line.partition(":")[2].split()}
    except OSError:
        return set()
