"""CUDA kernels of flashcompress, one module per JIT family.

Each submodule registers its family with ``flashcompress.jit`` when imported and
exposes plain Python launchers that take torch tensors (outputs pre-allocated in
Python, launched on the caller's current stream).  ``flashcompress.jit``
imports every submodule here to enumerate families (``prewarm --all``), so this
package itself stays empty and cheap to import.

  v41     the ``v41`` family: DeepSeek-V4.1's low-ratio ops (c1, c2 decode / prefill, index-K; same functions as torch_backend.v41)
  plans   the ``plan`` family: decode / prefill plan builders on the GPU (same functions as torch_backend.plans)
"""
