"""``jaxinfer-bench gpu-compile``: GPU machine code without a GPU — every Pallas kernel and the engine's real
executables compiled by XLA for A100 (sm_80) and H100/H200 (sm_90) on a CPU machine, with ptxas's registers
and spills and the shared memory of each launch (``cli`` has the verdicts; ``targets`` the GPUs)."""
