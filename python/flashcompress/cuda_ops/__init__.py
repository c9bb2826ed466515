"""CUDA kernels of flashcompress, one module per JIT family.

Each submodule registers its family with ``flashcompress.jit`` when imported and
exposes plain Python launchers that take torch tensors (outputs pre-allocated in
Python, launched on the caller's current stream).  ``flashcompress.jit``
imports every submodule here to enumerate families (``prewarm --all``), so this
package itself stays empty and cheap to import.

  plans   the ``plan`` family: decode / prefill plan builders on the GPU (same functions as torch_backend.plans)
"""
