"""The CPU backend: C++ kernels for XLA:CPU (``ffi``: matrix products of decode and prefill, paged and ragged
attention), the quantized-matmul formulations XLA:CPU runs otherwise (``quantized_matmul``), and the host
allocator setting that keeps a step's temporaries in the heap (``host_allocator``)."""
