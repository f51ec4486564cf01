"""Quantizes a float matrix B [K, N] into any weight format, in numpy, by
the rules of the server's float quantizer (checkpoint/float_quantizer.h,
which `nibble import --quantize` uses), so that both give the same weight
bit for bit: per group of `group` rows of one column, absmax scaling, round
to nearest with ties to even, scales stepped up so that no code is clamped.

Example:
    w = nibble.quantize(b, "u4", group=128)   # b float [K, N]
    err = np.abs(w.dequantize() - b).max()
"""

import dataclasses

import numpy as np

from nibble import formats

_LARGEST_HALF = 65504.0
_HALF_INFINITY_BITS = 0x7C00
_LARGEST_E4M3_CODE = 0x7E
# The codes a scale may span without clamping, by zero point.
_SCALE_DIVISORS = {"none": 6.0, "eight": 7.0, "per_group": 15.0}
# E2M1 midpoints between neighbouring magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6;
# at a midpoint the code above counts only when it is even (ties to even).
_FP4_MIDPOINTS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                  (2.5, False), (3.5, True), (5.0, False))


@dataclasses.dataclass
class QuantizedWeight:
    """A weight in the canonical layout (see nibble.formats)."""
    format: str
    qweight: np.ndarray  # [K/8, N] uint32
    scales: np.ndarray  # [K/group, N] uint16
    zeros: object = None  # [K/group, N] uint8 for u4, else None
    global_scale: float = 1.0

    @property
    def group(self):
        return self.qweight.shape[0] * formats.CODES_PER_WORD // \
            self.scales.shape[0]

    def dequantize(self):
        """B [K, N] as float64."""
        return formats.dequantize(self.qweight, self.scales, self.zeros,
                                  self.format, self.global_scale)


def quantize(w, format, group=None):
    """B = `w` [K, N] (float16, float32 or float64; quantized from its
    float32 values) in `format` with `group` rows per scale, the format's own
    where it fixes one. ValueError for a shape, group or value that cannot be
    quantized (NaN, infinity, an fp16 scale beyond 65504)."""
    fmt = formats.format_named(format)
    w = np.asarray(w)
    if w.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"quantize takes a float16, float32 or float64 "
                        f"matrix, got {w.dtype}")
    if w.ndim != 2:
        raise ValueError(f"quantize takes B [K, N], got shape {w.shape}")
    group = _group_size(fmt, group, w.shape[0])
    w = w.astype(np.float32)
    bad = np.argwhere(~np.isfinite(w))
    if len(bad):
        k, n = bad[0]
        raise ValueError(f"w[{k}, {n}] is {w[k, n]}: only finite weights can "
                         f"be quantized")
    k, n = w.shape
    groups = w.reshape(k // group, group, n)
    lo = np.minimum(groups.min(axis=1), 0).astype(np.float64)
    hi = np.maximum(groups.max(axis=1), 0).astype(np.float64)
    absmax = np.maximum(hi, -lo)
    extent = hi - lo if fmt.has_zeros else absmax

    global_scale = np.float32(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if fmt.scale_type == "E8M0":
            slots, s = _e8m0_scales(extent)
        elif fmt.scale_type == "E4M3":
            global_scale = _e4m3_global_scale(absmax.max(initial=0.0))
            slots, s = _e4m3_scales(extent, global_scale)
        elif fmt.scale_type == "fp16":
            slots, s = _fp16_scales(fmt, lo, hi, absmax, extent, group)
        else:
            raise ValueError(f"this client cannot quantize to {fmt.name}'s "
                             f"{fmt.scale_type} scales")
        zero_group = extent == 0
        s[zero_group] = 0
        slots[zero_group] = 0
        zeros = None
        if fmt.has_zeros:
            zeros = np.where(zero_group, 0, np.rint(-lo / s)).astype(np.uint8)
            offset = np.repeat(zeros.astype(np.int32), group, axis=0)
        else:
            offset = 8 if fmt.zero_point == "eight" else 0
        scale = np.repeat(s, group, axis=0)
        # The server divides in float32 where the scale has at most 11
        # significant bits (fp16, E8M0), in float64 under a global scale.
        if fmt.global_scale:
            x = w.astype(np.float64) / scale
        else:
            x = w / scale.astype(np.float32)
        if fmt.code_kind == "fp4":
            codes = _nearest_fp4_codes(x)
        else:
            codes = np.rint(x).astype(np.int32) + offset
        codes = np.where(scale == 0, offset, codes)
    return QuantizedWeight(fmt.name, formats.pack_codes(codes),
                           slots.astype(np.uint16), zeros,
                           float(global_scale))


def _group_size(fmt, group, k):
    if group is None:
        if not fmt.fixed_group_size:
            raise ValueError(f"{fmt.name} needs a group size (group=...)")
        group = fmt.fixed_group_size
    group = int(group)
    if group <= 0 or k % group or k % formats.CODES_PER_WORD:
        raise ValueError(f"B has K = {k} rows, which must be a multiple of 8 "
                         f"and of the group size {group}")
    return group


def _fp16_scales(fmt, lo, hi, absmax, extent, group):
    """fp16 slots nearest to extent / divisor, one step up where that would
    clamp the group's extremes; ValueError beyond fp16's largest."""
    ideal = extent / _SCALE_DIVISORS[fmt.zero_point]
    too_large = ideal > _LARGEST_HALF
    slots = np.where(too_large, 0, ideal).astype(np.float16).view(np.uint16)
    slots = np.where(too_large, _HALF_INFINITY_BITS, slots).astype(np.int32)
    s = slots.astype(np.uint16).view(np.float16).astype(np.float64)
    if fmt.zero_point == "none":
        clamps = absmax > 6 * s
    elif fmt.zero_point == "eight":
        clamps = np.rint(absmax / s) > 7
    else:
        clamps = np.rint(hi / s) + np.rint(-lo / s) > 15
    clamps |= s == 0
    slots += (slots < _HALF_INFINITY_BITS) & clamps & (extent > 0)
    overflow = np.argwhere((slots >= _HALF_INFINITY_BITS) & (extent > 0))
    if len(overflow):
        g, col = overflow[0]
        raise ValueError(
            f"the values of rows {g * group}..{(g + 1) * group - 1}, column "
            f"{col} span [{lo[g, col]:g}, {hi[g, col]:g}], which need a "
            f"scale of {ideal[g, col]:g} for {fmt.name}, beyond fp16's "
            f"largest, 65504")
    return slots, slots.astype(np.uint16).view(np.float16).astype(np.float64)


def _e8m0_scales(extent):
    """The smallest power of two s = 2^e with extent / s <= 6, e >= -127."""
    _, exponent = np.frexp(extent / 6)
    exponent = exponent.astype(np.int64)
    while True:
        down = (exponent > -127) & (extent <= 6 * np.ldexp(1.0, exponent - 1))
        if not down.any():
            break
        exponent -= down
    while True:
        up = extent > 6 * np.ldexp(1.0, exponent)
        if not up.any():
            break
        exponent += up
    codes = np.maximum(exponent, -127) + 127
    return codes.astype(np.int32), np.ldexp(1.0, codes - 127)


def _e4m3_global_scale(amax):
    """amax / (6 * 448) in float32, stepped up until amax / g <= 6 * 448;
    1 for a tensor of zeros."""
    if amax == 0:
        return np.float32(1)
    g = max(np.float32(amax / (6 * 448)),
            np.finfo(np.float32).smallest_subnormal)
    while amax > 6 * 448 * float(g):
        g = np.nextafter(g, np.float32(np.inf))
    return np.float32(g)


def _e4m3_scales(extent, global_scale):
    """E4M3 codes nearest to extent / 6 / g, stepped up while the group's
    largest value would clip."""
    table = formats.scale_values(np.arange(0x7F), "nvfp4")
    g = float(global_scale)
    codes = formats.encode_e4m3(
        (extent / 6 / g).astype(np.float32)).astype(np.int32)
    while True:
        up = (codes < _LARGEST_E4M3_CODE) & (extent > 6 * (table[codes] * g))
        if not up.any():
            break
        codes += up
    return codes, table[codes] * g


def _nearest_fp4_codes(x):
    """The E2M1 codes nearest to x, ties to the even code, +0 for values that
    round to zero."""
    m = np.abs(x)
    code = np.zeros(x.shape, dtype=np.int32)
    for midpoint, inclusive in _FP4_MIDPOINTS:
        code += (m >= midpoint) if inclusive else (m > midpoint)
    return np.where((x < 0) & (code != 0), code | 8, code)
