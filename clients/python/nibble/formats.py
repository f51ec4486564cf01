"""nibble's weight formats and their canonical layout, in numpy.

Every format's facts come from format/'s weight-format table, written into
_format_table.py at build time. A weight B [K, N] travels as
  qweight [K/8, N] uint32: the code of row k = 8i + j, column n, in bits
                           4j..4j+3 of word [i, n];
  scales  [K/group, N] uint16: fp16 bits, or an 8-bit scale code (E8M0 for
                       mxfp4, E4M3 for nvfp4) in the low byte;
  zeros   [K/group, N] uint8, 0..15, for formats with per-group zero points
                       (u4) only;
and nvfp4 also has a global scale (fp32). See docs/formats.md.

Example:
    fmt = nibble.FORMATS["u4b8"]
    qweight = nibble.pack_codes(codes)              # codes [K, N], 0..15
    b = nibble.dequantize(qweight, scales, format="u4b8")  # float64 [K, N]
"""

import dataclasses

import numpy as np

from nibble import _format_table

CODES_PER_WORD = _format_table.CODES_PER_WORD
MAX_DIMENSION = _format_table.MAX_DIMENSION


@dataclasses.dataclass(frozen=True)
class Format:
    """One row of the format table."""
    name: str
    # The nibble.v1.WeightFormat value.
    wire_value: int
    # "fp4" (FP4 E2M1 values) or "int4" (0..15 less the zero point).
    code_kind: str
    # "fp16", "E8M0" or "E4M3".
    scale_type: str
    # "none", "eight" or "per_group" (the zeros array).
    zero_point: str
    # The one group size the format allows; 0 when it takes 32, 64, 128 or K.
    fixed_group_size: int
    # Whether checkpoints store it by column (not used by this client).
    column_layout: bool
    # Whether a weight carries one fp32 scale of its own.
    global_scale: bool
    # What an element is, e.g. "(q - 8) * s".
    math: str
    origin: str

    @property
    def has_zeros(self):
        return self.zero_point == "per_group"

    @property
    def eight_bit_scales(self):
        return self.scale_type != "fp16"


# Every format by name, in the table's order.
FORMATS = {row["name"]: Format(**row) for row in _format_table.ROWS}
_BY_WIRE_VALUE = {fmt.wire_value: fmt for fmt in FORMATS.values()}

FP4_VALUES = np.array([float.fromhex(v) for v in _format_table.FP4_VALUES])
_SCALE_CODE_VALUES = {
    scale_type: np.array([float.fromhex(v) for v in values])
    for scale_type, values in _format_table.SCALE_CODE_VALUES.items()
}


def format_named(name):
    """The Format called `name`; ValueError listing the formats otherwise."""
    if isinstance(name, Format):
        return name
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown weight format {name!r}: the formats are "
                         f"{', '.join(FORMATS)}") from None


def format_of_wire_value(wire_value):
    """The Format of a nibble.v1.WeightFormat value, or None."""
    return _BY_WIRE_VALUE.get(wire_value)


def pack_codes(codes):
    """Codes [K, N] (0..15, K a multiple of 8) as qweight [K/8, N] uint32."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[0] % CODES_PER_WORD != 0:
        raise ValueError(f"codes must be [K, N] with K a multiple of "
                         f"{CODES_PER_WORD}, got shape {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError("codes must be 0..15")
    rows = codes.astype(np.uint32).reshape(
        codes.shape[0] // CODES_PER_WORD, CODES_PER_WORD, codes.shape[1])
    shifts = (4 * np.arange(CODES_PER_WORD, dtype=np.uint32))[:, None]
    return np.bitwise_or.reduce(rows << shifts, axis=1)


def unpack_codes(qweight):
    """qweight [K/8, N] uint32 as codes [K, N] uint8."""
    qweight = np.asarray(qweight, dtype=np.uint32)
    shifts = (4 * np.arange(CODES_PER_WORD, dtype=np.uint32))[:, None]
    codes = (qweight[:, None, :] >> shifts) & 0xF
    return codes.reshape(-1, qweight.shape[1]).astype(np.uint8)


def scale_values(scales, format):
    """The values of scale slots [K/group, N] of `format` as float64 (without
    a global scale); ValueError for an 8-bit scale slot whose high byte is
    not zero."""
    fmt = format_named(format)
    scales = np.asarray(scales, dtype=np.uint16)
    if not fmt.eight_bit_scales:
        return scales.view(np.float16).astype(np.float64)
    if np.any(scales > 0xFF):
        raise ValueError(f"{fmt.name}'s {fmt.scale_type} scales sit in the "
                         f"low byte of their slot: the high byte must be 0")
    return _SCALE_CODE_VALUES[fmt.scale_type][scales]


def dequantize(qweight, scales, zeros=None, format="u4b8", global_scale=1.0):
    """B [K, N] as float64, exactly as the server's float64 reference reads
    the canonical layout; the group size follows from the shapes."""
    fmt = format_named(format)
    codes = unpack_codes(qweight)
    group = codes.shape[0] // np.shape(scales)[0]
    if fmt.code_kind == "fp4":
        values = FP4_VALUES[codes]
    else:
        zero = (np.repeat(np.asarray(zeros, dtype=np.float64), group, axis=0)
                if fmt.has_zeros else 8.0)
        values = codes.astype(np.float64) - zero
    scale = np.repeat(scale_values(scales, fmt), group, axis=0)
    return values * scale * float(global_scale)


def encode_e4m3(values):
    """The E4M3 codes nearest to non-negative float32 `values`, ties to the
    even code, clamped at 448: what the server's FloatToE4m3 gives."""
    table = _SCALE_CODE_VALUES["E4M3"][:0x7F]  # codes 0..0x7e, increasing
    x = np.minimum(np.asarray(values, dtype=np.float64), table[-1])
    upper = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
    lower = upper - 1
    below, above = x - table[lower], table[upper] - x
    take_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    return np.where(take_upper, upper, lower).astype(np.uint8)
