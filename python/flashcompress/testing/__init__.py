"""Test helpers the package ships; the ops never import this package.

  oracle      the independent float64 model of the compressor (from DeepSeek's reference math)
  simulator   an engine simulation (requests, chunked prefill, decode, rolled-back verify steps)
  demo        ``python -m flashcompress demo``: the simulator checked against the oracle
  selftest    the JIT engine's own ``selftest`` kernel family (engine and CLI tests)
"""
