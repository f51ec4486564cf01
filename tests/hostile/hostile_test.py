#!/usr/bin/python3
"""Hostile clients against a nibbled of their own, one scenario per attack
of issue 27 (its row numbers in brackets).

Each scenario starts nibbled in a memory- and pids-limited cgroup (where this
process may make one), uploads a bystander weight, attacks while a
bystander client calls Matmul at a steady rate, and asserts: nibbled is
alive and SERVING, the bystander's p99 during and after the attack stayed
within --p99_ms of what the machine gave it just before the attack
(BUSY_MACHINE_FACTOR) with no failed or wrong reply, nibbled's peak RSS
stayed within the weight budget plus a margin, and every acknowledged
weight is still served.

    tests/hostile/hostile_test.py --bin_dir=build/bin \\
        --proto_py=build/tests/hostile/proto_py [--full] [SCENARIO...]

Without --full each attack is a short form for ctest; --full (make hostile)
runs each longer and larger. Scenarios of gRPC's own weaknesses run through
HAProxy (deploy/haproxy/nibble-front.cfg); --bare runs them without it, to
show what nibbled alone does not survive. --list prints the scenarios.
--target=ADDRESS attacks a nibbled already serving there instead, the
container image behind its front (make container-test), with the scenarios
that need no nibbled of their own (--list --target names them); its memory
is neither limited nor measured there.

Uses Debian's python3 (its python3-h2 and python3-protobuf).
"""

import argparse
import dataclasses
import os
import random
import re
import resource
import shutil
import socket
import sys
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FRONT_CONFIG = os.path.join(HERE, "..", "..", "deploy", "haproxy",
                            "nibble-front.cfg")
sys.path.insert(0, HERE)
from harness import (CANCEL, CONTINUATION, DATA, END_HEADERS, HEADERS, MIB,
                     RST_STREAM, Bystander, Nibbled, ProcessLimits,
                     RawGrpcConnection, RunningServer, frame, grpc_frame,
                     in_background, require, run_for)

# nibbled's limits in every scenario: the weight budget the RSS bound is
# stated against (a scenario may set its own), a message size that keeps
# gRPC's buffers small, and a receive quota that one fast upload fits in:
# gRPC 1.51 buffers up to ~40 MiB for it on loopback (its flow-control
# windows and socket reads), and resets it now and then with
# RESOURCE_EXHAUSTED in a quota of 4 x MAX_MESSAGE_BYTES, nibbled's default.
WEIGHT_BUDGET_BYTES = 64 * MIB
MAX_MESSAGE_BYTES = 4 * MIB
RECEIVE_BUFFER_BYTES = 64 * MIB
UPLOAD_IDLE_SECONDS = 2
# What nibbled may hold besides its weights: its own ~20 MiB, gRPC's
# receive quota, the replies it holds for clients (twice the 16 MiB of
# --max_held_reply_bytes at most) and the buffers of a few hundred
# connections.
RSS_MARGIN_BYTES = 128 * MIB
# The bystander's p99 during and after an attack must stay under --p99_ms
# plus this many times its p99 alone just before the attack: on a quiet
# machine that is about --p99_ms (the bystander alone takes 1-5 ms), while
# other work on the same cores, which slows the bystander with or without
# an attacker, raises the bound with it. Twice, since during an attack the
# attacker's client and nibbled's work for it take their share of those
# cores too.
BUSY_MACHINE_FACTOR = 2
# nibbled's cgroup takes the budget plus the margin, and this many threads.
MAX_PIDS = 512
COMMON_FLAGS = [
    f"--max_message_bytes={MAX_MESSAGE_BYTES}",
    f"--max_receive_buffer_bytes={RECEIVE_BUFFER_BYTES}",
    f"--upload_idle_seconds={UPLOAD_IDLE_SECONDS}",
]
BYSTANDER_WEIGHT = "bystander"
BYSTANDER_SHAPE = dict(k=512, n=512)
BYSTANDER_SEED = 1
# A weight whose replies are large: 16 KiB per f32 row.
WIDE_WEIGHT = dict(k=256, n=4096)
MATMUL = "/nibble.v1.NibbleService/Matmul"
UPLOAD = "/nibble.v1.NibbleService/UploadWeight"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
RESOURCE_EXHAUSTED, UNIMPLEMENTED, CANCELLED, UNAUTHENTICATED = 8, 12, 1, 16
# The bearer tokens of --auth_token_file and --metrics_auth_token_file.
TOKEN = "hostile-test-token"
METRICS_TOKEN = "scrape-token"

v1 = None  # nibble.v1's generated messages, imported in main().


@dataclasses.dataclass
class Attack:
    """What a scenario's attack gets: the server, how long and how hard to
    attack, and the weights acknowledged so far, which must survive it."""
    server: Nibbled
    seconds: float
    full: bool
    acknowledged: list
    report: dict = dataclasses.field(default_factory=dict)

    def scale(self, short, full):
        return full if self.full else short


@dataclasses.dataclass
class Scenario:
    name: str
    rows: str
    attack: object
    flags: list = dataclasses.field(default_factory=list)
    token: bool = False
    data_dir: bool = False
    # Given the Attack, before nibbled restarts on its data directory
    # (data_dir only).
    prepare: object = None
    # Clients, the bystander included, reach nibbled through the HAProxy
    # front of the container image (deploy/haproxy/nibble-front.cfg).
    front: bool = False
    # nibbled's RLIMIT_NOFILE, where the attack is on file descriptors.
    max_open_files: int = None
    # --max_weight_bytes; the memory limit and the RSS bound are this plus
    # RSS_MARGIN_BYTES.
    weight_budget_bytes: int = WEIGHT_BUDGET_BYTES


SCENARIOS = {}


def scenario(rows, **options):

    def register(attack):
        name = attack.__name__
        SCENARIOS[name] = Scenario(name=name, rows=rows, attack=attack,
                                   **options)
        return attack

    return register


def matmul_request(weight, m, k):
    return v1.MatmulRequest(weight_name=weight, m=m, k=k, dtype=v1.DTYPE_F32,
                            a=bytes(4 * m * k)).SerializeToString()


def upload_header(name, k, n):
    return v1.UploadWeightRequest(header=v1.WeightHeader(
        name=name, format=v1.WEIGHT_FORMAT_U4B8, k=k, n=n,
        group_size=128)).SerializeToString()


def scrape(address, token=None, timeout=10):
    """GET /metrics; (status code, seconds it took, body)."""
    started = time.monotonic()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as peer:
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        peer.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
                     .encode())
        reply = b""
        while chunk := peer.recv(1 << 16):
            reply += chunk
    return (int(reply.split(b" ", 2)[1]), time.monotonic() - started,
            reply.partition(b"\r\n\r\n")[2])


@scenario("14")
def oversized_replies(attack):
    """Matmuls whose reply would pass --max_message_bytes, sent as fast as
    they are answered over 4 connections: each is refused before C is
    computed, so they cost the bystander nothing."""
    attack.server.upload("wide", **WIDE_WEIGHT, seed=2)
    attack.acknowledged.append("wide")
    rows = MAX_MESSAGE_BYTES // (4 * WIDE_WEIGHT["n"]) + 1
    request = matmul_request("wide", rows, WIDE_WEIGHT["k"])
    refused = 0

    def flood():
        nonlocal refused
        with RawGrpcConnection(attack.server.target) as attacker:

            def volley():
                nonlocal refused
                streams = [attacker.start_call(MATMUL, request)
                           for _ in range(8)]
                for answer in attacker.wait_answers(streams, timeout=30):
                    require(answer.status == RESOURCE_EXHAUSTED,
                            f"an oversized reply got {answer}, not "
                            "RESOURCE_EXHAUSTED")
                    refused += 1

            run_for(attack.seconds, volley)

    for flooder in [in_background(flood) for _ in range(4)]:
        flooder.join()
    attack.report["refused"] = refused


def unread_replies(attack, connections, reply_rows):
    """Connections whose flow-control window is 0 send Matmuls with replies
    of `reply_rows` rows of WIDE_WEIGHT, then as many with replies the size
    of the bystander's to fill what is left, and never read them: past the
    reply budget, their connection's share or what the budget keeps free
    for others, nibbled refuses more with RESOURCE_EXHAUSTED instead of
    holding them, and the bystander's replies still fit while they hold
    theirs."""
    attack.server.upload("wide", **WIDE_WEIGHT, seed=2)
    attack.acknowledged.append("wide")
    requests = [matmul_request("wide", reply_rows, WIDE_WEIGHT["k"]),
                matmul_request(BYSTANDER_WEIGHT, 1, BYSTANDER_SHAPE["k"])]
    # Each request that many times: 256 streams a connection in the full
    # run, nibbled's --max_concurrent_streams.
    per_connection = attack.scale(64, 128)
    attackers = [RawGrpcConnection(attack.server.target, initial_window=0)
                 for _ in range(connections)]
    try:
        streams = [[attacker.start_call(MATMUL, request)
                    for request in requests for _ in range(per_connection)]
                   for attacker in attackers]
        refused = 0
        for attacker, started in zip(attackers, streams):
            answers = attacker.wait_answers(started, timeout=attack.seconds /
                                            connections)
            refused += sum(a.status == RESOURCE_EXHAUSTED for a in answers)
        require(refused > 0, "no unread Matmul was refused: nibbled holds "
                f"{connections * per_connection} replies of "
                f"{reply_rows * WIDE_WEIGHT['n'] * 4} bytes and as many small")
        attack.report["sent"] = connections * len(requests) * per_connection
        attack.report["refused"] = refused
        attack.report["held_mib"] = round(
            held_reply_bytes(attack.server) / MIB, 1)
        time.sleep(attack.seconds / 2)
    finally:
        for attacker in attackers:
            attacker.close()
    released = time.monotonic() + 10
    while held_reply_bytes(attack.server) and time.monotonic() < released:
        time.sleep(0.1)
    require(held_reply_bytes(attack.server) == 0,
            "the replies of the attacker's closed connections are still held")


def held_reply_bytes(server):
    return int(float(re.search(rb"^nibble_held_reply_bytes (\S+)$",
                               scrape(server.metrics_address, METRICS_TOKEN)[2],
                               re.MULTILINE).group(1)))


@scenario("3", flags=["--metrics_listen=127.0.0.1:0"])
def unread_replies_few_connections(attack):
    # Replies just under --max_message_bytes.
    unread_replies(attack, connections=2,
                   reply_rows=MAX_MESSAGE_BYTES // (4 * WIDE_WEIGHT["n"]) - 1)


@scenario("3", flags=["--metrics_listen=127.0.0.1:0"])
def unread_replies_many_connections(attack):
    # Replies of 256 KiB, small enough for 8 connections to fill the whole
    # budget (4 x MAX_MESSAGE_BYTES) were each let hold its share.
    unread_replies(attack, connections=8, reply_rows=16)


@scenario("4")
def gzip_bombs(attack):
    """gzip bombs to the health service, which needs no token: each is
    refused with UNIMPLEMENTED before a byte of it is inflated."""
    inflated = attack.scale(128 * MIB, 1024 * MIB)
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    zeros = bytes(MIB)
    bomb = b"".join(compressor.compress(zeros)
                    for _ in range(inflated // MIB)) + compressor.flush()
    refused = 0

    def volley():
        nonlocal refused
        with RawGrpcConnection(attack.server.target) as attacker:
            streams = [attacker.start_call(
                HEALTH_CHECK, bomb, compressed=True,
                extra_headers=[("grpc-encoding", "gzip")]) for _ in range(4)]
            for answer in attacker.wait_answers(streams, timeout=30):
                require(answer.status == UNIMPLEMENTED,
                        f"a gzip bomb got {answer}, not UNIMPLEMENTED")
                refused += 1

    run_for(attack.seconds, volley)
    attack.report["bombs"] = refused
    attack.report["bomb_bytes"] = len(bomb)
    attack.report["inflated_bytes"] = inflated


@scenario("8")
def stalled_upload(attack):
    """An upload header that reserves most of the weight budget, then
    silence on an open connection: another upload that does not fit beside
    it is refused at first, and succeeds once the stalled one has been idle
    for --upload_idle_seconds, the attacker still connected."""
    with RawGrpcConnection(attack.server.target) as attacker:
        stalled = attacker.start_call(UPLOAD, upload_header("hog", 8192, 12288),
                                      end_stream=False)
        attacker.wait_answers([stalled], timeout=0.5)
        code, output = attack.server.cli(
            "upload", "--name=late", "--format=u4b8", "--k=4096", "--n=8192",
            "--group=128", "--random=3")
        require(code != 0 and "RESOURCE_EXHAUSTED" in output,
                f"an upload beside the stalled one was not refused: {output}")
        started = time.monotonic()
        [answer] = attacker.wait_answers([stalled],
                                         timeout=UPLOAD_IDLE_SECONDS + 30)
        require(answer.status == CANCELLED,
                f"the stalled upload ended with {answer}, not CANCELLED")
        attack.report["cancelled_after_s"] = round(
            time.monotonic() - started, 1)
        attack.server.upload("late", k=4096, n=8192, seed=3)
        attack.acknowledged.append("late")
        time.sleep(max(0, attack.seconds - (time.monotonic() - started)))


# Row 9's stalled uploads stay idle this long before nibbled cancels them,
# time enough to open them all and to upload and list beside them.
STALLED_IDLE_SECONDS = 10


@scenario("9", flags=[f"--upload_idle_seconds={STALLED_IDLE_SECONDS}"])
def many_stalled_uploads(attack):
    """More stalled uploads than nibbled's cgroup allows threads, on
    connections that each open one more than --max_uploads_per_connection:
    one of them (whichever nibbled reads last) is refused at once on each;
    none holds a thread, so a client on a connection of its own uploads and
    lists while they stall; all are cancelled once idle."""
    cap = 8
    connections = MAX_PIDS // cap + 8
    attackers = [RawGrpcConnection(attack.server.target)
                 for _ in range(connections)]
    try:
        streams = [[attacker.start_call(UPLOAD, upload_header(f"s{c}x{i}", 128,
                                                              16),
                                        end_stream=False)
                    for i in range(cap + 1)]
                   for c, attacker in enumerate(attackers)]
        refused = 0
        for attacker, started in zip(attackers, streams):
            finished = [answer for answer in
                        attacker.wait_any_answer(started, timeout=10)
                        if answer.finished]
            refused += (len(finished) == 1
                        and finished[0].status == RESOURCE_EXHAUSTED)
        require(refused == connections,
                f"{refused} of {connections} connections had exactly one "
                "upload past the cap refused")
        attack.server.upload("meanwhile", k=512, n=512, seed=4)
        attack.acknowledged.append("meanwhile")
        code, output = attack.server.cli("list")
        require(code == 0 and "meanwhile" in output,
                f"a list beside the stalled uploads failed: {output}")
        still_stalled = sum(
            not answer.finished
            for attacker, started in zip(attackers, streams)
            for answer in attacker.wait_answers(started, timeout=0))
        require(still_stalled == connections * cap,
                f"only {still_stalled} of {connections * cap} uploads still "
                "stalled when the bystander's upload and list were answered")
        cancelled = 0
        for attacker, started in zip(attackers, streams):
            cancelled += sum(
                answer.status == CANCELLED for answer in attacker.wait_answers(
                    started, timeout=STALLED_IDLE_SECONDS + 30))
        require(cancelled == connections * cap,
                f"{cancelled} of {connections * cap} stalled uploads cancelled")
        attack.report["stalled"] = connections * cap
    finally:
        for attacker in attackers:
            attacker.close()


@scenario("10", flags=["--metrics_listen=127.0.0.1:0"])
def metrics_slow_clients(attack):
    """Idle and trickling connections to /metrics past its connection cap:
    scrapes are answered within a few seconds, and one without the token
    gets 401."""
    address = attack.server.metrics_address
    host, port = address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)))
            for _ in range(attack.scale(100, 400))]
    tricklers = [socket.create_connection((host, int(port))) for _ in range(2)]
    slowest = 0.0
    try:

        def trickle_and_scrape():
            nonlocal slowest
            for trickler in tricklers:
                try:
                    trickler.send(b"G")
                except OSError:
                    pass
            code, seconds, _ = scrape(address, METRICS_TOKEN)
            require(code == 200, f"a scrape with the token got {code}")
            slowest = max(slowest, seconds)
            time.sleep(0.2)

        run_for(attack.seconds, trickle_and_scrape)
        require(scrape(address)[0] == 401, "a scrape without the token was "
                "answered")
    finally:
        for peer in idle + tricklers:
            peer.close()
    require(slowest < 5, f"a scrape took {slowest:.1f} s")
    attack.report["slowest_scrape_s"] = round(slowest, 2)


@scenario("15", token=True)
def matmul_without_token(attack):
    """With a token file, Matmuls that would read the weight back (A = I)
    without a valid token are refused, however the header is spelled."""
    k = 512
    identity = bytearray(4 * k * k)
    for row in range(k):
        identity[4 * (row * k + row) + 2:4 * (row * k + row) + 4] = b"\x80\x3f"
    request = v1.MatmulRequest(weight_name=BYSTANDER_WEIGHT, m=k, k=k,
                               dtype=v1.DTYPE_F32,
                               a=bytes(identity)).SerializeToString()
    credentials = [[], [("authorization", "Bearer wrong")],
                   [("authorization", "Bearer ")], [("authorization", "")],
                   [("authorization", f"Basic {TOKEN}")],
                   [("authorization", f"bearer  {TOKEN}x")],
                   [("x-authorization", f"Bearer {TOKEN}")]]
    tries = 0

    def volley():
        nonlocal tries
        with RawGrpcConnection(attack.server.target) as attacker:
            streams = [attacker.start_call(MATMUL, request, extra_headers=c)
                       for c in credentials]
            for answer, sent in zip(
                    attacker.wait_answers(streams, timeout=30), credentials):
                require(answer.status == UNAUTHENTICATED and not answer.data,
                        f"a Matmul with {sent} got {answer}")
                tries += 1

    run_for(attack.seconds, volley)
    attack.report["refused"] = tries


def plant_traps(attack):
    """What nibbled must leave alone or refuse at start: a FIFO and a link
    to /dev/zero named like weights, and a user's file that looks like an
    unfinished upload."""
    data_dir = os.path.join(attack.server.scratch, "data")
    os.mkfifo(os.path.join(data_dir, "fifo.nibble"))
    os.symlink("/dev/zero", os.path.join(data_dir, "zero.nibble"))
    with open(os.path.join(data_dir, "precious.nibble.tmp-notes"), "w") as f:
        f.write("notes\n")


@scenario("12, 13", data_dir=True, prepare=plant_traps)
def data_dir_traps(attack):
    """nibbled started on a data directory with traps in it (plant_traps)
    serves its weights and leaves the user's file and the FIFO in place
    (run_scenario restarts it on the directory once more at the end)."""
    data_dir = os.path.join(attack.server.scratch, "data")
    with open(os.path.join(data_dir, "precious.nibble.tmp-notes")) as kept:
        require(kept.read() == "notes\n", "the user's file was changed")
    require(os.path.exists(os.path.join(data_dir, "fifo.nibble")),
            "the FIFO was removed")
    time.sleep(attack.seconds)


def upload_large_weight_and_plant_sparse_file(attack):
    """A weight of 49.5 of the 64 MiB budget, acknowledged, and a 10 GiB
    sparse file named like a weight."""
    attack.server.upload("large", k=8192, n=12288, seed=5)
    attack.acknowledged.append("large")
    sparse = os.path.join(attack.server.scratch, "data", "sparse.nibble")
    with open(sparse, "w"):
        pass
    os.truncate(sparse, 10 << 30)


@scenario("6", data_dir=True,
          prepare=upload_large_weight_and_plant_sparse_file)
def restart_with_large_weight(attack):
    """nibbled restarts on the directory (upload_large_weight_and_plant_...)
    within its memory limit: it serves the large weight, and skips the
    sparse file without reading it."""
    with open(attack.server.log_path) as log:
        require("sparse.nibble, not serving it" in log.read(),
                "the 10 GiB sparse file was not skipped")
    time.sleep(attack.seconds)


# Row 7's budget: so large that a second copy of an upload near it would
# not fit in RSS_MARGIN_BYTES.
LARGE_BUDGET_BYTES = 160 * MIB


@scenario("7", data_dir=True, weight_budget_bytes=LARGE_BUDGET_BYTES)
def upload_near_the_budget(attack):
    """With --data_dir, an upload of 154.7 of the 160 MiB budget, which
    nibbled packs and writes to its file as it arrives: it never holds a
    second copy, and it restarts on the file within the same limit
    (run_scenario)."""
    attack.server.upload("large", k=16384, n=19200, seed=6)
    attack.acknowledged.append("large")
    time.sleep(attack.seconds)


@scenario("7", data_dir=True, weight_budget_bytes=LARGE_BUDGET_BYTES)
def upload_columns_near_the_budget(attack):
    """With --data_dir, an MXFP4 upload of 144 of the 160 MiB budget in the
    column layout its checkpoints store: nibbled packs the columns as they
    arrive and writes its file's canonical layout from the panels at the
    end, never holding a second copy, and restarts on the file within the
    same limit (run_scenario)."""
    k, n = 16384, 16384
    header = v1.UploadWeightRequest(header=v1.WeightHeader(
        name="columns", format=v1.WEIGHT_FORMAT_MXFP4, k=k, n=n,
        group_size=32, code_layout=v1.CODE_LAYOUT_COLUMNS))
    codes = random.Random(7).randbytes(MIB)
    # E8M0 scale codes: 2^-7 to 2^8.
    scale_codes = bytes(120 + i % 16 for i in range(MIB))
    with RawGrpcConnection(attack.server.target) as uploader:
        stream = uploader.start_call(UPLOAD, header.SerializeToString(),
                                     end_stream=False)
        for tensor, piece, size in (
                (v1.WEIGHT_TENSOR_QWEIGHT, codes, k // 2 * n),
                (v1.WEIGHT_TENSOR_SCALES, scale_codes, k // 32 * n)):
            for offset in range(0, size, len(piece)):
                chunk = v1.UploadWeightRequest(chunk=v1.WeightChunk(
                    tensor=tensor, offset=offset, data=piece[:size - offset]))
                uploader.send(stream, grpc_frame(chunk.SerializeToString()))
        uploader.send(stream, b"", end_stream=True)
        [answer] = uploader.wait_answers([stream], timeout=120)
    attack.server.require_running()
    require(answer.status == 0, f"the column-layout upload got {answer}")
    attack.acknowledged.append("columns")
    time.sleep(attack.seconds)


# The rows below are gRPC 1.51's own (Debian's, unpatched), so they run
# through the front. nibbled alone does not survive 1, 2 and 5 (--bare); 11
# harms the calls that share the attacker's connection, which behind a front
# that shared its connections to nibbled would be everyone's.
NIBBLED_OPEN_FILES = 1024


@scenario("1", front=True, max_open_files=NIBBLED_OPEN_FILES)
def idle_connections(attack):
    """Idle TCP connections from many addresses, more than nibbled's 1,024
    file descriptors (gRPC 1.51 never accepts again once accept4 fails,
    CVE-2023-4785), then closed: the front holds them, 64 per address, and
    new clients are served during and after."""
    addresses = attack.scale(18, 48)
    host, port = attack.server.target.rsplit(":", 1)
    held = []
    try:
        for address in range(addresses):
            for _ in range(70):
                try:
                    held.append(socket.create_connection(
                        (host, int(port)), timeout=5,
                        source_address=(f"127.0.1.{address + 2}", 0)))
                except OSError:
                    pass
        attack.report["connections"] = len(held)
        require(len(held) > NIBBLED_OPEN_FILES,
                f"only {len(held)} connections opened, not more than "
                f"nibbled's {NIBBLED_OPEN_FILES} files (this process's "
                "RLIMIT_NOFILE?)")
        time.sleep(attack.seconds)
    finally:
        for peer in held:
            peer.close()


def raw_floods(attack, send, source="127.0.0.1"):
    """`send(attacker, deadline)` on two raw HTTP/2 connections at once from
    address `source`, each reopened whenever the server (or the front)
    closes it, until the attack's time is up; the sum of what the sends
    returned."""
    deadline = time.monotonic() + attack.seconds
    totals = [0, 0]

    def flood(index):

        def connection():
            try:
                attacker = RawGrpcConnection(attack.server.target,
                                             source=source)
            except OSError:  # the front refused the connection
                time.sleep(0.01)
                return
            with attacker:
                attacker.go_raw()
                totals[index] += send(attacker, deadline)

        run_for(attack.seconds, connection)

    for flooder in [in_background(flood, index) for index in range(2)]:
        flooder.join()
    return sum(totals)


@scenario("2", front=True)
def rapid_reset(attack):
    """HEADERS and at once RST_STREAM, streams after streams, as fast as two
    connections carry them (CVE-2023-44487)."""

    def reset_streams(attacker, deadline):
        block = attacker.header_block(MATMUL)
        stream = 1
        reset = 0
        while time.monotonic() < deadline:
            burst = b"".join(
                frame(HEADERS, END_HEADERS, s, block) +
                frame(RST_STREAM, 0, s, CANCEL.to_bytes(4, "big"))
                for s in range(stream, stream + 400, 2))
            if not attacker.send_raw(burst):
                break
            reset += 200
            stream += 400
        return reset

    attack.report["streams_reset"] = raw_floods(attack, reset_streams)


# The rapid-reset attacker with data comes from an address of its own: the
# front's answer to it closes every connection from that address.
ATTACKER_ADDRESS = "127.0.1.2"


@scenario("2", front=True, flags=["--metrics_listen=127.0.0.1:0"])
def rapid_reset_with_data(attack):
    """Rapid reset past the front's wait for the message prefix: HEADERS and
    a DATA frame with the gRPC prefix and the first bytes of a Matmul for 50
    streams, then RST_STREAM for the 50 before, so that each stream reaches
    nibbled before it is reset. The front closes the connections of an
    address with over 2,000 calls a second forwarded and not answered."""
    start = grpc_frame(matmul_request(BYSTANDER_WEIGHT, 1,
                                      BYSTANDER_SHAPE["k"]))[:21]
    reset_code = CANCEL.to_bytes(4, "big")
    before = matmuls_not_ok(attack.server)

    def open_then_reset(attacker, deadline):
        block = attacker.header_block(MATMUL)
        stream = 1
        opened = []
        reset = 0
        while time.monotonic() < deadline:
            streams = range(stream, stream + 100, 2)
            burst = b"".join(frame(HEADERS, END_HEADERS, s, block) +
                             frame(DATA, 0, s, start) for s in streams)
            burst += b"".join(frame(RST_STREAM, 0, s, reset_code)
                              for s in opened)
            if not attacker.send_raw(burst):
                break
            reset += len(opened)
            opened = streams
            stream += 100
            # Time for the front to forward the streams before their reset
            # arrives; at once, it drops them unforwarded (as rapid_reset).
            time.sleep(0.001)
        return reset

    attack.report["streams_reset"] = raw_floods(attack, open_then_reset,
                                                source=ATTACKER_ADDRESS)
    attack.server.require_running()
    reached = matmuls_not_ok(attack.server) - before
    attack.report["reached_nibbled"] = reached
    require(reached > 0, "no reset stream reached nibbled: the attack did "
            "not get past the front's wait for the message prefix")


def matmuls_not_ok(server):
    """Matmuls nibbled has ended with a status other than OK."""
    text = scrape(server.metrics_address, METRICS_TOKEN)[2].decode()
    return sum(int(float(count)) for count in re.findall(
        r'^nibble_rpc_requests_total\{method="/nibble\.v1\.NibbleService/'
        r'Matmul",code="(?!OK")[A-Z_]+"\} (\S+)$', text, re.MULTILINE))


@scenario("5", front=True)
def continuation_flood(attack):
    """One header value trickled over CONTINUATION frames without end, on
    two connections, each reopened when closed (CVE-2023-33953)."""

    def trickle_header(attacker, deadline):
        # A literal header (new name, never indexed) whose value claims
        # 2^30 bytes: 0x10, the name, then the length.
        start = (attacker.header_block(HEALTH_CHECK) + b"\x10\x07x-flood" +
                 b"\x7f" + bytes([0x81, 0x80, 0x80, 0x80, 0x04]))
        if not attacker.send_raw(frame(HEADERS, 0, 1, start)):
            return 0
        filler = frame(CONTINUATION, 0, 1, b"a" * 16384)
        sent = 0
        while time.monotonic() < deadline and attacker.send_raw(filler):
            sent += len(filler)
        return sent

    attack.report["sent_mib"] = round(
        raw_floods(attack, trickle_header) / MIB, 1)


@scenario("11", front=True)
def invalid_binary_header(attack):
    """Calls whose `-bin` header is not base64 (CVE-2023-32732: gRPC then
    ends every stream of the connection). The front answers them itself
    with INVALID_ARGUMENT, and behind it each client connection has its own
    connection to nibbled, so only the attacker's own calls fail."""
    failed = 0

    def volley():
        nonlocal failed
        with RawGrpcConnection(attack.server.target) as attacker:
            try:
                streams = [attacker.start_call(
                    HEALTH_CHECK, b"", extra_headers=[("x-trace-bin", "!!!")])
                    for _ in range(8)]
                failed += sum(not answer.finished or answer.status != 0
                              for answer in attacker.wait_answers(streams, 10))
            except OSError:  # the server closed the attacker's connection
                failed += 8

    run_for(attack.seconds, volley)
    attack.report["attacker_calls_failed"] = failed


def require_none_lost(server, acknowledged):
    lost = [name for name in acknowledged if not server.holds(name)]
    require(not lost, f"acknowledged weights lost: {lost}")


def require_peak_rss(server, chosen, report, key):
    """nibbled's peak RSS, reported under `key`, within the scenario's
    budget plus RSS_MARGIN_BYTES."""
    peak = server.peak_rss_bytes()
    report[key] = round(peak / MIB, 1)
    require(peak <= chosen.weight_budget_bytes + RSS_MARGIN_BYTES,
            f"peak RSS {peak / MIB:.0f} MiB over the budget "
            f"{chosen.weight_budget_bytes // MIB} MiB + margin "
            f"{RSS_MARGIN_BYTES // MIB} MiB")


def attack_beside_bystander(chosen, attack, options):
    """The bystander alone, then the scenario's attack while the bystander
    calls Matmul, then the bystander alone again: alive and SERVING, no
    error and no wrong reply, and the bystander's p99 during and after the
    attack under --p99_ms more than the machine gave it before the attack
    (p99_bound_ms)."""
    server = attack.server
    bystander = Bystander(server, BYSTANDER_WEIGHT, BYSTANDER_SEED)
    before = bystander.run(options.after_seconds)
    bound = options.p99_ms + BUSY_MACHINE_FACTOR * before.p99_ms
    attack.report["p99_before_ms"] = round(before.p99_ms, 1)
    attack.report["p99_bound_ms"] = round(bound, 1)
    during = bystander.start(options.seconds)
    chosen.attack(attack)
    results = {"during": during.join()}
    server.require_running()
    results["after"] = bystander.run(options.after_seconds)
    require(server.alive(), "nibbled is not SERVING after the attack")
    for when, result in {"before": before, **results}.items():
        require(not result.errors and result.verified > 0,
                f"bystander {when} the attack: errors {result.errors}, "
                f"{result.verified} replies verified")
    for when, result in results.items():
        require(result.p99_ms < bound,
                f"bystander p99 {when} the attack {result.p99_ms:.1f} ms,"
                f" over {bound:.1f} ms (--p99_ms={options.p99_ms} + "
                f"{BUSY_MACHINE_FACTOR} x {before.p99_ms:.1f} ms before it)")
        attack.report[f"p99_{when}_ms"] = round(result.p99_ms, 1)


def runs_against_target(chosen):
    """Whether `chosen` can attack a nibbled it did not start (--target):
    one of gRPC's rows, which the front is for, needing no flags, token,
    data directory or file limit of its own."""
    return chosen.front and not (chosen.flags or chosen.token or
                                 chosen.data_dir or chosen.max_open_files)


def run_against_target(chosen, options):
    """`chosen` against the nibbled at --target (RunningServer), whose
    memory this cannot limit or measure, and which it never restarts."""
    scratch = os.path.join(options.scratch, chosen.name)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    server = RunningServer(options.bin_dir, scratch, target=options.target)
    attack = Attack(server=server, seconds=options.seconds, full=options.full,
                    acknowledged=[BYSTANDER_WEIGHT])
    if not server.holds(BYSTANDER_WEIGHT):
        server.upload(BYSTANDER_WEIGHT, **BYSTANDER_SHAPE, seed=BYSTANDER_SEED)
    attack_beside_bystander(chosen, attack, options)
    require_none_lost(server, attack.acknowledged)
    return attack.report


def run_scenario(chosen, options):
    scratch = os.path.join(options.scratch, chosen.name)
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    flags = (COMMON_FLAGS + [f"--max_weight_bytes={chosen.weight_budget_bytes}"]
             + chosen.flags)
    token_file = None
    if chosen.token:
        token_file = os.path.join(scratch, "tokens")
        with open(token_file, "w") as out:
            out.write(TOKEN + "\n")
        flags.append(f"--auth_token_file={token_file}")
    if any(flag.startswith("--metrics_listen") for flag in flags):
        metrics_tokens = os.path.join(scratch, "metrics-tokens")
        with open(metrics_tokens, "w") as out:
            out.write(METRICS_TOKEN + "\n")
        flags.append(f"--metrics_auth_token_file={metrics_tokens}")
    if chosen.data_dir:
        data_dir = os.path.join(scratch, "data")
        os.makedirs(data_dir)
        flags.append(f"--data_dir={data_dir}")
    limits = ProcessLimits(
        memory_bytes=chosen.weight_budget_bytes + RSS_MARGIN_BYTES,
        max_pids=MAX_PIDS)
    server = Nibbled(options.bin_dir, scratch, flags, limits, token_file,
                     front_config=(FRONT_CONFIG if chosen.front and
                                   not options.bare else None),
                     max_open_files=chosen.max_open_files)
    server.start()
    attack = Attack(server=server, seconds=options.seconds, full=options.full,
                    acknowledged=[BYSTANDER_WEIGHT])
    try:
        server.upload(BYSTANDER_WEIGHT, **BYSTANDER_SHAPE, seed=BYSTANDER_SEED)
        if chosen.prepare is not None:
            chosen.prepare(attack)
            require(server.stop() == 0, "nibbled did not exit 0 on SIGTERM")
            server.start()
        attack_beside_bystander(chosen, attack, options)
        if server.front is not None:
            attack.report["front_peak_rss_mib"] = round(
                server.peak_rss_bytes(server.front) / MIB, 1)
        require_peak_rss(server, chosen, attack.report, "peak_rss_mib")
        require_none_lost(server, attack.acknowledged)
        if chosen.data_dir:
            require(server.stop() == 0, "nibbled did not exit 0 on SIGTERM")
            server.start()
            require_none_lost(server, attack.acknowledged)
            require_peak_rss(server, chosen, attack.report,
                             "restart_peak_rss_mib")
    finally:
        oom_kills = server.cgroups.oom_kills()
        skipped = server.cgroups.skipped
        if server.process.poll() is None:
            exit_code = server.stop()
        else:
            exit_code = server.process.returncode
            server.stop()
    require(oom_kills == 0, f"the memory limit killed nibbled ({oom_kills})")
    require(exit_code == 0, f"nibbled exited {exit_code}, not 0")
    if skipped:
        attack.report["limits"] = skipped
    return attack.report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin_dir")
    parser.add_argument("--proto_py")
    parser.add_argument("--scratch", default=os.environ.get(
        "TEST_TMPDIR", "/tmp") + "/hostile")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--p99_ms", type=float, default=50)
    parser.add_argument("--bare", action="store_true",
                        help="run every scenario without the front, to see "
                        "what nibbled alone does not survive")
    parser.add_argument("--target",
                        help="attack the nibbled serving at this address "
                        "(the container image's front) instead of starting "
                        "one; only the scenarios --list --target names")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("scenarios", nargs="*")
    options = parser.parse_args()
    available = {name: chosen for name, chosen in SCENARIOS.items()
                 if not options.target or runs_against_target(chosen)}
    if options.list:
        print("\n".join(available))
        return 0
    unknown = set(options.scenarios) - set(available)
    if unknown:
        parser.error(f"no scenario {sorted(unknown)}"
                     f"{' for --target' if options.target else ''}; --list "
                     "names them")
    if not options.target and not options.proto_py:
        parser.error("--proto_py is needed without --target")
    # Attacks hold thousands of sockets.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The scenarios --target runs build no message of nibble.v1.
    if options.proto_py:
        sys.path.insert(0, options.proto_py)
        global v1
        from nibble.v1 import nibble_pb2 as v1
    options.seconds = 15 if options.full else 3
    options.after_seconds = 5 if options.full else 2
    failed = []
    for name in options.scenarios or available:
        chosen = available[name]
        started = time.monotonic()
        try:
            report = (run_against_target(chosen, options) if options.target
                      else run_scenario(chosen, options))
            outcome = "survived"
        except Exception as error:  # any failure fails this scenario alone
            report = {"failure": str(error)}
            outcome = "FAILED"
            failed.append(name)
            traceback.print_exc()
        figures = " ".join(f"{key}={value}" for key, value in report.items())
        print(f"{name} (row {chosen.rows}): {outcome} in "
              f"{time.monotonic() - started:.0f} s; {figures}", flush=True)
    if failed:
        print(f"failed: {' '.join(failed)} (bystander seed {BYSTANDER_SEED};"
              f" nibbled's logs under {options.scratch})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
