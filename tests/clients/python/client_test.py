#!/usr/bin/python3
"""Tests of the Python client package `nibble` (clients/python) against real
nibbled processes started here on free loopback ports: uploads of every
format checked against the float64 reference of dequant(B), the quantizer
against the server's own (`nibble import --quantize`), errors, TLS and
tokens. Random data comes from fixed seeds, which failures print.

Run by ctest, with NIBBLE_BIN_DIR (nibbled, nibble) and PYTHONPATH (the
build's package folder) set:
    NIBBLE_BIN_DIR=build/bin PYTHONPATH=build/python \\
        tests/clients/python/client_test.py
"""

import json
import os
import re
import struct
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

import nibble
from nibble.v1 import nibble_pb2

BIN_DIR = os.environ.get("NIBBLE_BIN_DIR", "build/bin")
TLS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "..", "..", "testdata", "tls")
# Largest max relative error (max |C - ref| / max |ref|) accepted: the fp32
# kernels' bound, and that of outputs rounded to 16 bits (as the CLI's
# --check).
# With exact products (activation_precision="exact"); a server that may round
# f32 A to bf16 (its default on CPUs with bf16 kernels) is within 1e-2.
TOLERANCE = {np.float32: 1e-4, np.float16: 1e-2, np.uint16: 1e-2}


class Nibbled:
    """A nibbled on 127.0.0.1, port 0, with a scratch folder of its own,
    stopped with SIGTERM."""

    def __init__(self, *flags):
        self.scratch = tempfile.mkdtemp(
            prefix="python-client-", dir=os.environ.get("TEST_TMPDIR"))
        self.log_path = os.path.join(self.scratch, "nibbled.log")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [os.path.join(BIN_DIR, "nibbled"), "--listen=127.0.0.1:0",
                 "--threads=2", "--shutdown_grace_seconds=0.5", *flags],
                stdout=subprocess.PIPE, stderr=log, text=True)
        line = self.process.stdout.readline()
        self.process.stdout.close()
        match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if match is None:
            raise RuntimeError(f"nibbled did not start (exit "
                               f"{self.process.wait()}); see {self.log_path}")
        self.port = int(match.group(1))
        self.target = f"127.0.0.1:{self.port}"

    def stop(self):
        self.process.terminate()
        return self.process.wait(timeout=60)


def bfloat16_bits(values):
    """float32 values rounded to bfloat16 (to nearest, ties to even), as
    uint16 bits."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def as_float64(array):
    """Activations or outputs as float64; uint16 holds bfloat16 bits."""
    if array.dtype == np.uint16:
        return (array.astype(np.uint32) << 16).view(np.float32) \
            .astype(np.float64)
    return array.astype(np.float64)


def random_activations(rng, m, k, dtype):
    a = rng.uniform(-1, 1, size=(m, k)).astype(np.float32)
    return bfloat16_bits(a) if dtype == np.uint16 else a.astype(dtype)


def max_relative_error(got, want):
    scale = np.abs(want).max()
    return np.abs(got - want).max() / scale if scale else np.abs(got).max()


def random_scales(rng, fmt, shape):
    """Scale slots of `fmt` with values near 2^-6, so that products stay
    well inside fp16's range."""
    if fmt.scale_type == "fp16":
        values = rng.uniform(2.0**-8, 2.0**-4, size=shape)
        return values.astype(np.float16).view(np.uint16)
    if fmt.scale_type == "E8M0":
        return rng.integers(127 - 8, 127 - 4, size=shape, dtype=np.uint16)
    # E4M3 codes 0x08..0x3f: 2^-6 .. 1.875, times the global scale below.
    return rng.integers(0x08, 0x40, size=shape, dtype=np.uint16)


def write_safetensors(path, tensors):
    """A safetensors file of float32 tensors (name -> array)."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class ServerTestCase(unittest.TestCase):
    """Tests that share one plain nibbled."""

    @classmethod
    def setUpClass(cls):
        cls.server = Nibbled()
        cls.client = nibble.Client(cls.server.target, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.server.stop()
        assert code == 0, f"nibbled exited {code}; see {cls.server.log_path}"

    def check_matmuls(self, name, k, reference_b, seed):
        """Matmuls of every dtype, and of one row, against the float64
        reference A · reference_b."""
        rng = np.random.default_rng(seed)
        for dtype, tolerance in TOLERANCE.items():
            a = random_activations(rng, 3, k, dtype)
            c = self.client.matmul(name, a, activation_precision="exact")
            self.assertEqual(c.dtype, dtype)
            self.assertEqual(c.shape, (3, reference_b.shape[1]))
            error = max_relative_error(as_float64(c),
                                       as_float64(a) @ reference_b)
            self.assertLessEqual(error, tolerance,
                                 f"{name} {np.dtype(dtype)}, seed {seed}")
        row = random_activations(rng, 1, k, np.float32)[0]
        c = self.client.matmul(name, row, activation_precision="exact")
        self.assertEqual(c.shape, (reference_b.shape[1],))
        self.assertLessEqual(
            max_relative_error(c.astype(np.float64),
                               row.astype(np.float64) @ reference_b),
            TOLERANCE[np.float32], f"{name} one row, seed {seed}")


class FormatTableTest(ServerTestCase):

    def test_formats_are_the_protos(self):
        """Every format of the generated table is the nibble.v1 enum value
        of its name, and the enum has no other."""
        enum = nibble_pb2.WeightFormat
        self.assertEqual(
            {name: value for name, value in enum.items()
             if value != nibble_pb2.WEIGHT_FORMAT_UNSPECIFIED},
            {f"WEIGHT_FORMAT_{fmt.name.upper()}": fmt.wire_value
             for fmt in nibble.FORMATS.values()})

    def test_server_names_each_format_as_the_table_does(self):
        for seed, fmt in enumerate(nibble.FORMATS.values(), start=100):
            rng = np.random.default_rng(seed)
            group = fmt.fixed_group_size or 32
            codes = rng.integers(0, 16, size=(64, 8))
            scales = random_scales(rng, fmt, (64 // group, 8))
            zeros = (rng.integers(0, 16, size=scales.shape, dtype=np.uint8)
                     if fmt.has_zeros else None)
            info = self.client.upload(
                f"table.{fmt.name}", nibble.pack_codes(codes), scales, zeros,
                fmt.name, global_scale=0.5 if fmt.global_scale else None)
            self.assertEqual(info.format, fmt.name)
            self.assertEqual(info.group, group)
            self.assertEqual(self.client.get(f"table.{fmt.name}"), info)


class UploadTest(ServerTestCase):

    def test_every_format_against_the_float64_reference(self):
        for seed, fmt in enumerate(nibble.FORMATS.values(), start=200):
            # Per-channel scales (group K) where the format allows them.
            for group in ([fmt.fixed_group_size] if fmt.fixed_group_size
                          else [32, 128, 256]):
                with self.subTest(format=fmt.name, group=group, seed=seed):
                    rng = np.random.default_rng(seed)
                    k, n = 256, 96
                    codes = rng.integers(0, 16, size=(k, n))
                    scales = random_scales(rng, fmt, (k // group, n))
                    zeros = (rng.integers(0, 16, size=scales.shape,
                                          dtype=np.uint8)
                             if fmt.has_zeros else None)
                    global_scale = 0.75 if fmt.global_scale else 1.0
                    qweight = nibble.pack_codes(codes)
                    name = f"upload.{fmt.name}.{group}"
                    info = self.client.upload(
                        name, qweight, scales, zeros, fmt.name, group,
                        global_scale=global_scale if fmt.global_scale
                        else None)
                    self.assertEqual((info.k, info.n, info.group),
                                     (k, n, group))
                    self.assertEqual(info.global_scale, global_scale)
                    np.testing.assert_array_equal(
                        nibble.unpack_codes(qweight), codes)
                    self.check_matmuls(
                        name, k, nibble.dequantize(
                            qweight, scales, zeros, fmt.name, global_scale),
                        seed)

    def test_large_upload_goes_in_several_chunks(self):
        seed = 300
        rng = np.random.default_rng(seed)
        k, n, group = 2048, 1536, 128  # qweight 1.5 MiB: two chunks
        self.assertGreater(k // 8 * n * 4,
                           nibble.client.UPLOAD_CHUNK_BYTES)
        codes = rng.integers(0, 16, size=(k, n))
        scales = random_scales(rng, nibble.FORMATS["u4b8"], (k // group, n))
        qweight = nibble.pack_codes(codes)
        info = self.client.upload("upload.large", qweight, scales,
                                  format="u4b8")
        self.assertEqual(info.canonical_bytes, qweight.nbytes + scales.nbytes)
        self.check_matmuls("upload.large", k,
                           nibble.dequantize(qweight, scales, format="u4b8"),
                           seed)

    def test_activation_order(self):
        """Row r of B multiplies column order[r] of A."""
        seed = 302
        rng = np.random.default_rng(seed)
        k, n = 128, 16
        qweight = nibble.pack_codes(rng.integers(0, 16, (k, n)))
        scales = random_scales(rng, nibble.FORMATS["u4b8"], (k // 32, n))
        order = rng.permutation(k)
        info = self.client.upload("upload.ordered", qweight, scales,
                                  format="u4b8", activation_order=order)
        self.assertTrue(info.activation_order)
        b = nibble.dequantize(qweight, scales, format="u4b8")
        a = random_activations(rng, 2, k, np.float32)
        self.assertLessEqual(
            max_relative_error(
                self.client.matmul("upload.ordered", a,
                                   activation_precision="exact")
                .astype(np.float64),
                a[:, order].astype(np.float64) @ b),
            TOLERANCE[np.float32], f"seed {seed}")

    def test_checkpoint_dtypes_are_taken_bit_for_bit(self):
        """int32 qweight (GPTQ's), float16 scales and uint8 8-bit scale codes
        give the same weight as the canonical uint32 and uint16 arrays."""
        seed = 301
        rng = np.random.default_rng(seed)
        for fmt in (nibble.FORMATS["u4b8"], nibble.FORMATS["mxfp4"]):
            with self.subTest(format=fmt.name, seed=seed):
                group = fmt.fixed_group_size or 64
                qweight = nibble.pack_codes(rng.integers(0, 16, (128, 16)))
                scales = random_scales(rng, fmt, (128 // group, 16))
                other = (scales.view(np.float16) if fmt.scale_type == "fp16"
                         else scales.astype(np.uint8))
                self.client.upload(f"dtypes.{fmt.name}",
                                   qweight.view(np.int32), other,
                                   format=fmt.name)
                self.check_matmuls(
                    f"dtypes.{fmt.name}", 128,
                    nibble.dequantize(qweight, scales, format=fmt.name), seed)

    def test_list_get_delete(self):
        names = [f"list.{i:04d}" for i in range(1005)]  # past one page (1000)
        qweight = np.zeros((4, 1), np.uint32)
        scales = np.full((1, 1), 0x3C00, np.uint16)
        for name in reversed(names):
            self.client.upload(name, qweight, scales, format="u4b8")
        listed = [w.name for w in self.client.list()
                  if w.name.startswith("list.")]
        self.assertEqual(listed, names)
        self.assertEqual(self.client.get(names[7]).k, 32)
        for name in names:
            self.client.delete(name)
        self.assertFalse(any(w.name.startswith("list.")
                             for w in self.client.list()))
        with self.assertRaises(nibble.NibbleError) as caught:
            self.client.get(names[7])
        self.assertEqual(caught.exception.code, grpc.StatusCode.NOT_FOUND)

    def test_health(self):
        self.assertEqual(self.client.health(), "SERVING")


class QuantizeTest(ServerTestCase):
    """nibble.quantize against the server's quantizer: a float matrix
    quantized here and uploaded, and the same matrix imported from a
    safetensors file by `nibble import --quantize`, give bit-identical
    products."""

    def random_weight(self, rng, fmt, k, n, group):
        w = rng.standard_normal((k, n)).astype(np.float32)
        w *= np.exp2(rng.integers(-12, 6, size=(1, n)))  # columns of all sizes
        w[:group, 0] = 0  # a group of zeros
        w[:, 1] = -np.abs(w[:, 1])  # a column of negative values only
        w[:, 2] = np.abs(w[:, 2]) + 1  # one of positive values away from 0
        w[3, 3] = 1e-30  # a tiny value, below fp16's subnormals
        w[:, 4] = self.ties(fmt, k, group)
        return w

    @staticmethod
    def ties(fmt, k, group):
        """A column whose every group has the scale 2^-3 exactly (but for
        nvfp4's), and whose other values lie halfway between two codes."""
        if fmt.code_kind == "fp4":
            extremes = [6.0]
            ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
        elif fmt.zero_point == "eight":
            extremes, ties = [7.0], [0.5 + i for i in range(6)]
        else:  # the range [-8, 7] over 15 steps: the zero point is 8
            extremes, ties = [7.0, -8.0], [0.5 + i for i in range(7)]
        ties += [-t for t in ties]
        values = extremes + ties * group
        column = np.array([values[:group] for _ in range(k // group)])
        return column.ravel() * 2.0**-3

    def test_same_weight_as_the_server_quantizer(self):
        k, n = 256, 64
        for seed, fmt in enumerate(nibble.FORMATS.values(), start=400):
            for group in ([fmt.fixed_group_size] if fmt.fixed_group_size
                          else [32, 128]):
                with self.subTest(format=fmt.name, group=group, seed=seed):
                    rng = np.random.default_rng(seed)
                    w = self.random_weight(rng, fmt, k, n, group)
                    ours = f"quantized.{fmt.name}.{group}"
                    theirs = f"imported.{fmt.name}.{group}"
                    info = self.client.quantize_and_upload(ours, w, fmt.name,
                                                           group)
                    self.import_float_layer(theirs, w, f"{fmt.name}:{group}")
                    self.assertEqual(self.client.get(theirs).global_scale,
                                     info.global_scale)
                    a = random_activations(rng, 4, k, np.float32)
                    np.testing.assert_array_equal(
                        self.client.matmul(ours, a),
                        self.client.matmul(theirs, a), f"seed {seed}")
                    weight = nibble.quantize(w, fmt.name, group)
                    self.check_matmuls(ours, k, weight.dequantize(), seed)
                    self.check_error_bound(w, weight, fmt, group, seed)

    def check_error_bound(self, w, weight, fmt, group, seed):
        """No code was clamped: every element lies within half a step of its
        code's neighbours (1/2 for INT4; up to 1, between 4 and 6, for
        E2M1)."""
        scale = np.repeat(nibble.formats.scale_values(weight.scales, fmt),
                          group, axis=0) * weight.global_scale
        half_step = 0.5 if fmt.code_kind == "int4" else 1.0
        error = np.abs(weight.dequantize() - w.astype(np.float64))
        self.assertTrue(np.all(error <= half_step * scale * (1 + 1e-6)),
                        f"{fmt.name}, seed {seed}")

    def import_float_layer(self, name, w, quantize):
        path = os.path.join(self.server.scratch, f"{name}.safetensors")
        # nn.Linear's layout: weight [N, K].
        write_safetensors(path, {f"{name}.weight": w.T})
        result = subprocess.run(
            [os.path.join(BIN_DIR, "nibble"), "import",
             f"--target={self.server.target}", f"--file={path}",
             f"--quantize={quantize}"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_refusals(self):
        w = np.ones((64, 4), np.float32)
        cases = [
            (dict(w=w.astype(np.int32), format="u4b8", group=32), TypeError,
             "float16, float32 or float64"),
            (dict(w=w, format="q8", group=32), ValueError,
             "the formats are fp4, u4b8, u4, mxfp4, nvfp4"),
            (dict(w=w, format="u4b8"), ValueError, "needs a group size"),
            (dict(w=w, format="u4b8", group=48), ValueError,
             "multiple of 8 and of the group size 48"),
            (dict(w=np.where(w > 0, np.nan, w), format="fp4", group=32),
             ValueError, "only finite weights"),
            (dict(w=w * 1e6, format="u4b8", group=32), ValueError,
             "beyond fp16's largest"),
        ]
        for arguments, error, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(error, re.escape(message)):
                    nibble.quantize(**arguments)


class ErrorTest(ServerTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.weight = nibble.quantize(
            np.random.default_rng(500).standard_normal((96, 8)), "u4b8", 32)
        cls.client.upload_quantized("errors.w", cls.weight)

    def assert_refused(self, call, code, message):
        with self.assertRaises(nibble.NibbleError) as caught:
            call()
        self.assertEqual(caught.exception.code, code)
        self.assertIn(message, caught.exception.message)
        self.assertIn(code.name, str(caught.exception))

    def test_unknown_weight(self):
        a = np.zeros((1, 96), np.float32)
        for call in (lambda: self.client.matmul("errors.none", a),
                     lambda: self.client.get("errors.none"),
                     lambda: self.client.delete("errors.none")):
            self.assert_refused(call, grpc.StatusCode.NOT_FOUND,
                                'no weight named "errors.none"')

    def test_wrong_k(self):
        self.assert_refused(
            lambda: self.client.matmul("errors.w", np.zeros((2, 64),
                                                            np.float32)),
            grpc.StatusCode.INVALID_ARGUMENT,
            'k=64 does not match weight "errors.w", which has k=96')

    def test_bad_dtype(self):
        for dtype in (np.float64, np.int32, np.uint8):
            with self.subTest(dtype=np.dtype(dtype).name):
                with self.assertRaisesRegex(
                        TypeError, "float32, float16 or uint16 .bfloat16"):
                    self.client.matmul("errors.w", np.zeros((1, 96), dtype))

    def test_activation_precision(self):
        """The server's default may round f32 A to bf16; "exact" never does,
        and an unknown value is refused before anything is sent."""
        rng = np.random.default_rng(410)
        a = random_activations(rng, 2, 96, np.float32)
        exact = self.client.matmul("errors.w", a, activation_precision="exact")
        default = self.client.matmul("errors.w", a)
        self.assertLessEqual(
            max_relative_error(default.astype(np.float64),
                               exact.astype(np.float64)), 1e-2)
        with self.assertRaisesRegex(ValueError,
                                    "exact, bf16, int8 or None, got 'fp8'"):
            self.client.matmul("errors.w", a, activation_precision="fp8")

    def test_server_refuses_the_weight(self):
        w = self.weight
        cases = [
            (dict(name="bad name"), "may only contain letters"),
            (dict(scales=np.zeros((2, 8), np.uint16)),
             "group size 48 is not supported"),
            (dict(scales=np.full(w.scales.shape, 0x7C00, np.uint16)),
             "is infinite"),
        ]
        for change, message in cases:
            arguments = dict(name="errors.new", qweight=w.qweight,
                             scales=w.scales, format="u4b8")
            arguments.update(change)
            with self.subTest(message=message):
                self.assert_refused(lambda: self.client.upload(**arguments),
                                    grpc.StatusCode.INVALID_ARGUMENT, message)

    def test_arrays_that_do_not_fit_are_refused_before_sending(self):
        w = self.weight
        cases = [
            (dict(scales=w.scales[:, :4]), "do not fit qweight"),
            (dict(group=64), "group=64, but scales"),
            (dict(zeros=np.zeros(w.scales.shape, np.uint8)),
             "u4b8 has no zero points"),
            (dict(format="u4"), "u4 needs zeros"),
            (dict(qweight=w.qweight.astype(np.int64)), "qweight must be"),
            (dict(scales=w.scales.astype(np.uint8)), "scales must be"),
        ]
        for change, message in cases:
            arguments = dict(name="errors.new", qweight=w.qweight,
                             scales=w.scales, format="u4b8")
            arguments.update(change)
            with self.subTest(message=message):
                with self.assertRaisesRegex(ValueError, re.escape(message)):
                    self.client.upload(**arguments)
        self.assertNotIn("errors.new", [i.name for i in self.client.list()])


class TlsAndTokenTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.token_file = tempfile.NamedTemporaryFile(
            "w", dir=os.environ.get("TEST_TMPDIR"), suffix=".tokens")
        cls.token_file.write("# the test's token\nsecret-token\n")
        cls.token_file.flush()
        cls.server = Nibbled(
            f"--tls_cert={TLS_DIR}/server.pem",
            f"--tls_key={TLS_DIR}/server.key",
            f"--auth_token_file={cls.token_file.name}")
        with open(os.path.join(TLS_DIR, "ca.pem"), "rb") as file:
            cls.ca = file.read()

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        cls.token_file.close()
        assert code == 0, f"nibbled exited {code}; see {cls.server.log_path}"

    def client(self, **options):
        return nibble.Client(self.server.target, timeout=30, **options)

    def test_tls_with_the_token(self):
        with self.client(tls=True, root_certificates=self.ca,
                         token="secret-token") as client:
            self.assertEqual(client.health(), "SERVING")
            w = np.random.default_rng(600).standard_normal((64, 8))
            info = client.quantize_and_upload("tls.w", w, "u4b8", 64)
            self.assertEqual(info.name, "tls.w")
            a = np.ones((1, 64), np.float32)
            self.assertLessEqual(
                max_relative_error(
                    client.matmul("tls.w", a).astype(np.float64),
                    a @ nibble.quantize(w, "u4b8", 64).dequantize()),
                TOLERANCE[np.float32], "seed 600")

    def test_tls_without_a_token_or_with_another(self):
        for token in (None, "wrong-token"):
            with self.subTest(token=token), \
                    self.client(tls=True, root_certificates=self.ca,
                                token=token) as client:
                # Health checks need no token, so that probes keep working.
                self.assertEqual(client.health(), "SERVING")
                with self.assertRaises(nibble.NibbleError) as caught:
                    client.list()
                self.assertEqual(caught.exception.code,
                                 grpc.StatusCode.UNAUTHENTICATED)

    def test_plain_client_cannot_reach_a_tls_server(self):
        with self.client(token="secret-token") as client:
            with self.assertRaises(nibble.NibbleError) as caught:
                client.health()
            self.assertEqual(caught.exception.code,
                             grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
