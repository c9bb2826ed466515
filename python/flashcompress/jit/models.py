"""Model facts that decide which kernel variants a deployment needs.

Families turn these into prewarm presets (``register_family(..., presets=...)``):
a preset callable receives the model name and may call ``model_config(name)``
instead of hard-coding numbers.  Values from ``shared/spec/model-math.md`` §2
(configs) and ``shared/spec/store-and-jit.md`` §1 and §10 (page sizes, store formats).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODELS", "ModelConfig", "model_config"]


@dataclass(frozen=True)
class ModelConfig:
    """The compressor-relevant shape of one model."""

    name: str
    compress_ratios: tuple[int, ...]  # distinct non-zero ratios used by some layer
    head_dim: int = 512  # main compressed KV width
    index_head_dim: int = 128  # indexer compressor width (ratio-4 layers only)
    indexer_ratio: int = 4
    rope_head_dim: int = 64
    page_size: int = 256  # global KV page size in tokens (fixed for DeepSeek-V4)


MODELS: dict[str, ModelConfig] = {
    "deepseek-v4-flash": ModelConfig("deepseek-v4-flash", compress_ratios=(4, 128)),
    "deepseek-v4-pro": ModelConfig("deepseek-v4-pro", compress_ratios=(4, 128)),
}


def model_config(name: str) -> ModelConfig:
    """Look up a model by its preset name; ``ValueError`` lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
