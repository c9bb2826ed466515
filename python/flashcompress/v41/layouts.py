"""Cache layouts of the DeepSeek-V4.1 low-ratio compressor layers (ratio 1 and 2).

One compressed-KV entry is the 512-dim latent of a token (ratio 1) or of a
position pair (ratio 2).  Six byte layouts exist; they differ in the encoding
of the 512 values and in where a token's scale bytes sit inside a page:

==============  ==========  ===========  ==============  ==========  ============  ===========
layout          C++ value   data bytes   scale bytes     bytes/tok   page align    arrangement
==============  ==========  ===========  ==============  ==========  ============  ===========
``v4``          0           576          8 (7 + pad)     584         576           block-split
``v41``         1           512          16              528         512           block-split
``v41_fp4``     2           256          32              288         256           block-split
``uniform_fp8`` 3           512          0               512         512           block-split
``v41_new``     4           512          16              528         none          interleaved
``v41_fp4_new`` 5           256          32              288         none          interleaved
==============  ==========  ===========  ==============  ==========  ============  ===========

Encodings (what the data / scale bytes hold):

* ``v4``: dims 0-447 as e4m3 with one ue8m0 exponent per 64 dims (7 scale
  bytes; byte 7 of a token's scales is padding, never written), dims 448-511 as
  little-endian bf16 (bytes 448-575).
* ``v41`` / ``v41_new``: all 512 dims as e4m3, one ue8m0 exponent per 32 dims.
* ``v41_fp4`` / ``v41_fp4_new``: e2m1 codes, dim ``2j`` in the low nibble of
  data byte ``j`` and ``2j + 1`` in the high nibble; one e4m3 scale per 16 dims.
* ``uniform_fp8``: 512 e4m3 values with unit scale (no scale bytes).

Sizing a cache (``P`` = slots per page, a power of two; ``pages`` of them)::

    k_cache = torch.zeros(pages, layout.page_bytes(P), dtype=torch.uint8)

``page_bytes(P) = ceil(P * bytes_per_token / page_align) * page_align``; e.g. at
``P = 256`` (the ratio-1 pool): v4 149760, v41 / v41_new 135168, v41_fp4 /
v41_fp4_new 73728, uniform_fp8 131072; at ``P = 128`` (ratio 2): 74880, 67584,
36864, 65536.

Addressing slot ``loc`` (``page = loc // P``, ``s = loc % P``, ``PB`` = page bytes):

* block-split: data at ``page*PB + s*data_bytes``, scales at
  ``page*PB + P*data_bytes + s*scale_bytes`` (all data rows of a page first);
* interleaved: data at ``page*PB + s*bytes_per_token``, scales right after the
  token's data (``+ data_bytes``).

:meth:`KVLayout.row_addressing` returns these as one :class:`RowAddressing`.

Index keys (``index_k_norm_rope_pack_store``) use a separate pool with
68-byte slots: ``cache = zeros(pages, 68 * P, uint8)``; slot ``s`` of page
``g`` has 64 payload bytes (e2m1 pairs of 128 dims) at ``g*68P + s*64`` and 4
ue8m0 bytes (one per 32 dims) at ``g*68P + 64P + s*4``
(:func:`index_k_addressing`).

The ratio-2 pair ring (``kv_state``) is fp32 ``[rows, 1024]`` (``kv ‖ score``),
``rows >= num_req_slots * ring_size`` (SGLang allocates
``num_req_slots * ring + ring + 1`` rounded up to even), cleared to kv = 0 and
score = -inf; see :func:`pair_ring_rows`.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

LATENT_DIM: Final = 512  # D: head / latent width
ROPE_DIM: Final = 64  # the last 64 dims are rotated
INDEX_K_DIM: Final = 128  # index-key width
INDEX_K_PAYLOAD_BYTES: Final = 64
INDEX_K_SCALE_BYTES: Final = 4
INDEX_K_SLOT_BYTES: Final = INDEX_K_PAYLOAD_BYTES + INDEX_K_SCALE_BYTES  # 68
PAIR_STATE_WIDTH: Final = 2 * LATENT_DIM  # fp32 kv ‖ score per ring row
LOW_RATIOS: Final = (1, 2)


class RowAddressing(NamedTuple):
    """Byte offsets of one slot in a paged cache whose rows are pages of ``page_bytes`` bytes.

    For slot ``loc`` with ``page = loc // P`` and ``s = loc % P``, the token's
    data bytes start at ``page * page_bytes + s * data_stride`` and its scale
    bytes at ``page * page_bytes + scale_base + s * scale_stride``.
    """

    page_bytes: int
    data_bytes: int
    data_stride: int
    scale_bytes: int
    scale_base: int
    scale_stride: int


class KVLayout(str, enum.Enum):
    """Byte layout of a V4.1 compressed-KV cache entry (values as SGLang's ``KVLayout`` strings)."""

    V4 = "v4"
    V41 = "v41"
    V41_FP4 = "v41_fp4"
    UNIFORM_FP8 = "uniform_fp8"
    V41_NEW = "v41_new"
    V41_FP4_NEW = "v41_fp4_new"

    @classmethod
    def parse(cls, layout: object) -> "KVLayout":
        """A ``KVLayout``, its value or its name in any case (``"v41_fp4"``, ``"V41_FP4"``).

        Raises ``TypeError`` for a non-string and ``ValueError`` naming the valid values.
        """
        if isinstance(layout, cls):
            return layout
        if not isinstance(layout, str):
            raise TypeError(f"layout: expected a KVLayout or one of {_VALUES}, got {type(layout).__name__}")
        try:
            return cls(layout.lower())
        except ValueError:
            raise ValueError(f"layout: expected one of {_VALUES}, got {layout!r}") from None

    @property
    def cpp_value(self) -> int:
        """The C++ ``KVLayout`` enumerator value (V4 0 ... V41_FP4_NEW 5)."""
        return _TRAITS[self][0]

    @property
    def data_bytes(self) -> int:
        """Data bytes per token."""
        return _TRAITS[self][1]

    @property
    def scale_bytes(self) -> int:
        """Scale bytes per token (V4: 7 ue8m0 + 1 pad byte)."""
        return _TRAITS[self][2]

    @property
    def bytes_per_token(self) -> int:
        """``data_bytes + scale_bytes``: 584, 528, 288, 512, 528, 288."""
        return self.data_bytes + self.scale_bytes

    @property
    def is_interleaved(self) -> bool:
        """``_NEW`` layouts keep each token's scales right after its data, unpadded pages."""
        return self in (KVLayout.V41_NEW, KVLayout.V41_FP4_NEW)

    @property
    def is_fp4(self) -> bool:
        """e2m1 payload with per-16 e4m3 scales (V41_FP4, V41_FP4_NEW)."""
        return self.encoding == "v41_fp4"

    @property
    def encoding(self) -> str:
        """What the bytes hold: ``"v4"``, ``"v41_fp8"``, ``"v41_fp4"`` or ``"uniform_fp8"``."""
        return _TRAITS[self][3]

    @property
    def page_align(self) -> int:
        """Pages are padded to a multiple of this many bytes (interleaved: bytes_per_token, i.e. none)."""
        return self.bytes_per_token if self.is_interleaved else self.data_bytes

    def page_bytes(self, page_size: int) -> int:
        """Bytes of one cache page of ``page_size`` slots: ``ceil(P * bytes_per_token / align) * align``."""
        align = self.page_align
        return -(-page_size * self.bytes_per_token // align) * align

    def scale_offset(self, page_size: int) -> int:
        """Block-split: where the page's scale region starts; interleaved: offset of the scales in a slot."""
        return self.data_bytes if self.is_interleaved else page_size * self.data_bytes

    def row_addressing(self, page_size: int) -> RowAddressing:
        """Offsets of a slot's data and scale bytes in a cache of ``page_size``-slot pages."""
        stride = self.bytes_per_token
        if self.is_interleaved:
            return RowAddressing(self.page_bytes(page_size), self.data_bytes, stride,
                                 self.scale_bytes, self.data_bytes, stride)
        return RowAddressing(self.page_bytes(page_size), self.data_bytes, self.data_bytes,
                             self.scale_bytes, page_size * self.data_bytes, self.scale_bytes)


# layout -> (C++ value, data bytes, scale bytes, encoding)
_TRAITS: Final = {
    KVLayout.V4: (0, 576, 8, "v4"),
    KVLayout.V41: (1, 512, 16, "v41_fp8"),
    KVLayout.V41_FP4: (2, 256, 32, "v41_fp4"),
    KVLayout.UNIFORM_FP8: (3, 512, 0, "uniform_fp8"),
    KVLayout.V41_NEW: (4, 512, 16, "v41_fp8"),
    KVLayout.V41_FP4_NEW: (5, 256, 32, "v41_fp4"),
}
_VALUES: Final = tuple(m.value for m in KVLayout)


def index_k_addressing(page_size: int) -> RowAddressing:
    """Offsets of a 68-byte index-key slot in a cache of ``[pages, 68 * page_size]`` bytes."""
    return RowAddressing(INDEX_K_SLOT_BYTES * page_size, INDEX_K_PAYLOAD_BYTES, INDEX_K_PAYLOAD_BYTES,
                         INDEX_K_SCALE_BYTES, INDEX_K_PAYLOAD_BYTES * page_size, INDEX_K_SCALE_BYTES)


def pair_ring_size(num_draft_tokens: int = 0) -> int:
    """Ring rows per request of the ratio-2 pair state: 2 without speculation, else the
    smallest power of two >= ``num_draft_tokens + 2`` (4 for 1-2 drafts, 8 for 3-6, 16 for 7-14)."""
    return 2 if num_draft_tokens <= 0 else 1 << (num_draft_tokens + 1).bit_length()


def pair_ring_rows(num_req_slots: int, ring_size: int) -> int:
    """Rows of SGLang's pair-state pool: ``num_req_slots * ring + ring + 1``, rounded up to even."""
    rows = num_req_slots * ring_size + ring_size + 1
    return rows + (rows & 1)
