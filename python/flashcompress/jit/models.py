"""Model facts that decide which kernel variants a deployment needs.

Families turn these into prewarm presets (``register_family(..., presets=...)``):
a preset callable receives the model name and may call ``model_config(name)``
instead of hard-coding numbers.  Values from ``shared/spec/model-math.md`` §2
(configs) and ``shared/spec/store-and-jit.md`` §1 and §10 (page sizes, store formats);
DeepSeek-V4.1-Flash from ``shared/spec/v41.md`` §1 (layers 2-19 ratio 2, 20-39 ratio 1, no
ratio-4/128 layer; compressors on source layers 2, 8, 14 and 20 only).

The V4 families (``plan``, ``compress``, ``store``) serve ratios 4 and 128 only
(:attr:`ModelConfig.v4_ratios`); the ``v41`` family serves ratios 1 and 2
(:attr:`ModelConfig.low_ratios`).  A family's preset returns nothing for ratios it has no
variant of.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LOW_RATIOS", "MODELS", "ModelConfig", "V4_RATIOS", "model_config"]

V4_RATIOS = (4, 128)  # the C4 / C128 compressor (plan, compress, store families)
LOW_RATIOS = (1, 2)  # DeepSeek-V4.1's low-ratio layers (v41 family)


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
    kv_source_layers: tuple[int, ...] = ()  # ratio-1/2 layers that own a compressor (V4.1)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.compress_ratios) - set(V4_RATIOS) - set(LOW_RATIOS))
        if unknown:
            raise ValueError(f"{self.name}: compress ratios {unknown} are none of {V4_RATIOS + LOW_RATIOS}")

    @property
    def v4_ratios(self) -> tuple[int, ...]:
        """The ratios among 4 / 128 (what the V4 plan / compress / store families serve)."""
        return tuple(r for r in self.compress_ratios if r in V4_RATIOS)

    @property
    def low_ratios(self) -> tuple[int, ...]:
        """The ratios among 1 / 2 (what the ``v41`` family serves)."""
        return tuple(r for r in self.compress_ratios if r in LOW_RATIOS)


MODELS: dict[str, ModelConfig] = {
    "deepseek-v4-flash": ModelConfig("deepseek-v4-flash", compress_ratios=(4, 128)),
    "deepseek-v4-pro": ModelConfig("deepseek-v4-pro", compress_ratios=(4, 128)),
    "deepseek-v4.1-flash": ModelConfig("deepseek-v4.1-flash", compress_ratios=(2, 1), kv_source_layers=(2, 8, 14, 20)),
}


def model_config(name: str) -> ModelConfig:
    """Look up a model by its preset name; ``ValueError`` lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
