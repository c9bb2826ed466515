"""Drop-in integrations: switch an inference engine's compressor ops to flashcompress in place.

  flashcompress.integrations.sglang   ``apply()`` / ``Handle.revert()`` for SGLang's DeepSeek-V4 and V4.1 code

Importing this package (or an integration module) imports neither the engine
nor torch and compiles nothing; the engine is imported by ``apply()``.
"""
