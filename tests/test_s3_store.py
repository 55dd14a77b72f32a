"""The S3 store over real HTTP: a moto server on 127.0.0.1, and a fault proxy in front of it."""
import hashlib
import uuid

import boto3
import pytest
from botocore.retries.standard import ExponentialBackoff
from moto.server import ThreadedMotoServer

from s3_faults import FOREVER, FaultProxy
from tailflow.engines.store import LocalStore, S3Store, StoreError, open_store

MIB = 1024 * 1024
PREFIX = "runs/exp"


@pytest.fixture(scope="module")
def moto_server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield server.get_host_and_port()
    server.stop()


@pytest.fixture(scope="module")
def proxy(moto_server):
    fault_proxy = FaultProxy(*moto_server).start()
    yield fault_proxy
    fault_proxy.stop()


@pytest.fixture
def aws_env(monkeypatch, moto_server, tmp_path):
    """Credentials and endpoint the standard way (env vars), and retries without their real back-off
    delays (up to 20 s each for a 503), so the fault tests take milliseconds."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://%s:%d" % moto_server)
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.01)


@pytest.fixture
def raw(aws_env):
    """A plain boto3 client straight to moto: the test's own view of what is stored."""
    return boto3.client("s3")


@pytest.fixture
def bucket(raw):
    name = f"tf-{uuid.uuid4().hex[:12]}"
    raw.create_bucket(Bucket=name)
    return name


def make_store(bucket, tmp_path, **options) -> S3Store:
    return S3Store(bucket, PREFIX, cache_dir=tmp_path / "cache", **options)


def stored(raw, bucket, key) -> bytes:
    return raw.get_object(Bucket=bucket, Key=f"{PREFIX}/{key}")["Body"].read()


def make_tree(root, files: dict[str, bytes]):
    for relative, data in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(data)
    return root


def test_objects_round_trip(bucket, raw, tmp_path):
    store = make_store(bucket, tmp_path)
    store.write_bytes("r1/blob.bin", b"\x00\x01binary")
    store.write_text("r1/config.yaml", "a: 1\n")
    store.write_text("r1/.hidden", "x")
    store.write_text("r1/checkpoints/iter-0000/model.bin", "m")
    assert store.read_bytes("r1/blob.bin") == b"\x00\x01binary"
    assert store.read_text("r1/config.yaml") == "a: 1\n"
    assert store.exists("r1/config.yaml") and store.exists("r1") and store.exists("r1/checkpoints")
    assert not store.exists("r1/missing.json") and not store.exists("r1/config")
    assert store.list_dir() == ["r1"]
    assert store.list_dir("r1") == ["blob.bin", "checkpoints", "config.yaml"]
    assert store.list_dir("r1/checkpoints") == ["iter-0000"]
    assert store.list_dir("nothing-here") == []
    assert store.list_files("r1") == ["blob.bin", "checkpoints/iter-0000/model.bin", "config.yaml"]
    assert store.list_files("nothing-here") == []
    store.append_line("r1/metrics.jsonl", '{"iteration": 0}')
    store.append_line("r1/metrics.jsonl", '{"iteration": 1}\n')
    assert store.read_text("r1/metrics.jsonl") == '{"iteration": 0}\n{"iteration": 1}\n'
    assert store.uri("r1/config.yaml") == f"s3://{bucket}/{PREFIX}/r1/config.yaml"
    assert store.uri() == f"s3://{bucket}/{PREFIX}"
    head = raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/config.yaml")
    assert head["Metadata"]["sha256"] == hashlib.sha256(b"a: 1\n").hexdigest()
    with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/{PREFIX}/r1/missing.json"):
        store.read_text("r1/missing.json")
    with pytest.raises(StoreError, match="escapes"):
        store.write_text("../outside", "x")


def test_put_dir_and_local_dir_round_trip(bucket, tmp_path):
    store = make_store(bucket, tmp_path)
    files = {"model.bin": b"weights" * 1000, "config.json": b"{}", "tokenizer/vocab.txt": b"a\nb\n",
             "tokenizer/deep/merges.txt": b"ab"}
    store.put_dir("r1/checkpoints/iter-0001", make_tree(tmp_path / "v1", files))
    assert store.list_dir("r1/checkpoints/iter-0001") == ["config.json", "model.bin", "tokenizer"]
    local = store.local_dir("r1/checkpoints/iter-0001")
    assert local == tmp_path / "cache" / bucket / PREFIX / "r1/checkpoints/iter-0001"
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()} == files

    downloads = []
    store.client.meta.events.register("before-call.s3.GetObject", lambda **kwargs: downloads.append(1))
    store.local_dir("r1/checkpoints/iter-0001")
    assert len(downloads) == 1  # only the manifest: cached files with the right sha256 stay
    (local / "model.bin").write_bytes(b"corrupted cache")
    assert (store.local_dir("r1/checkpoints/iter-0001") / "model.bin").read_bytes() == files["model.bin"]

    replacement = {"model.bin": b"new weights", "extra/notes.txt": b"n"}
    store.put_dir("r1/checkpoints/iter-0001", make_tree(tmp_path / "v2", replacement))  # replaces, never merges
    assert store.list_dir("r1/checkpoints/iter-0001") == ["extra", "model.bin"]
    local = store.local_dir("r1/checkpoints/iter-0001")
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()} == replacement
    assert not (local / "tokenizer").exists()


def test_directory_without_manifest_is_refused(bucket, raw, tmp_path):
    store = make_store(bucket, tmp_path)
    store.put_dir("r1/ckpt", make_tree(tmp_path / "src", {"model.bin": b"w", "sub/a.txt": b"a"}))
    raw.delete_object(Bucket=bucket, Key=f"{PREFIX}/r1/ckpt/.manifest.json")  # as if the upload died before the end
    assert store.exists("r1/ckpt/model.bin")
    with pytest.raises(StoreError, match=f"s3://{bucket}/{PREFIX}/r1/ckpt has no .manifest.json"):
        store.local_dir("r1/ckpt")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        store.local_dir("r1/never-written")


def test_large_payloads_go_multipart(bucket, raw, tmp_path):
    store = make_store(bucket, tmp_path, multipart_threshold=5 * MIB)
    payload = bytes(range(256)) * (11 * MIB // 256)  # 11 MiB: three 5 MiB parts
    store.write_bytes("r1/big.bin", payload)
    head = raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/big.bin")
    assert head["ETag"].strip('"').endswith("-3")
    assert head["Metadata"]["sha256"] == hashlib.sha256(payload).hexdigest()
    assert store.read_bytes("r1/big.bin") == payload
    store.put_dir("r1/ckpt", make_tree(tmp_path / "src", {"model.bin": payload}))
    assert raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/ckpt/model.bin")["ETag"].strip('"').endswith("-3")
    assert (store.local_dir("r1/ckpt") / "model.bin").read_bytes() == payload


def sent(store) -> list[str]:
    """The S3 operations `store`'s client sends from now on, in order."""
    calls: list[str] = []
    store.client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    return calls


def test_an_append_to_a_long_file_sends_only_its_line(bucket, raw, tmp_path):
    """From S3's 5 MiB smallest part on, an append copies the object on the server and uploads the line: no
    GET, and the same handful of requests at every length. A process that did not write the object last (a
    resumed run) reads it once; another writer in between is noticed, read and kept. ~1 s (moto, 6 MiB)."""
    key = "r1/metrics.jsonl"
    head = b"".join(b'{"row": %08d}\n' % i for i in range(6 * MIB // 16))  # 6 MiB of rows
    make_store(bucket, tmp_path).write_bytes(key, head)
    store = make_store(bucket, tmp_path)  # a resumed run's: it knows nothing of the object yet
    calls = sent(store)
    store.append_line(key, '{"row": "a"}')
    assert calls.count("GetObject") == 1  # read once, to learn its hash
    calls.clear()
    lines = [f'{{"row": "b{i}"}}' for i in range(3)]
    for line in lines:
        store.append_line(key, line)
    assert "GetObject" not in calls and "PutObject" not in calls
    assert calls.count("UploadPartCopy") == 3 and len(calls) == 3 * 5  # head, create, copy, the line, complete
    expected = head + b'{"row": "a"}\n' + "".join(line + "\n" for line in lines).encode()
    assert stored(raw, bucket, key) == expected
    assert raw.head_object(Bucket=bucket, Key=f"{PREFIX}/{key}")["Metadata"]["sha256"] == (
        hashlib.sha256(expected).hexdigest())
    assert store.read_bytes(key) == expected  # its checksum holds

    other = make_store(bucket, tmp_path)  # another writer: its ETag differs, the object is read again
    other.append_line(key, '{"row": "other"}')
    calls.clear()
    store.append_line(key, '{"row": "c"}')
    assert calls.count("GetObject") == 1
    assert stored(raw, bucket, key) == expected + b'{"row": "other"}\n{"row": "c"}\n'
    assert raw.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []  # none left unfinished

    store.write_text(key, '{"row": 0}\n')  # a rewrite (a resume cutting rows back) starts it small again
    store.append_line(key, '{"row": 1}')
    assert store.read_text(key) == '{"row": 0}\n{"row": 1}\n'


@pytest.mark.parametrize("size", [0, 6 * MIB], ids=["small", "past-5MiB"])
def test_an_append_whose_answer_was_lost_is_not_refused_by_its_own_retry(size, bucket, raw, proxy, monkeypatch,
                                                                        tmp_path):
    """The write lands on S3, its answer is lost, botocore sends it again: the retry meets the append's own
    write (a precondition refused; an upload already completed), which is read as done, not as another
    writer. Each line is in the object once. ~1 s (moto)."""
    key = "r1/metrics.jsonl"
    head = b"x" * size
    direct = make_store(bucket, tmp_path)
    direct.write_bytes(key, head)
    direct.append_line(key, "first")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = make_store(bucket, tmp_path)
    store.append_line(key, "second")  # learns the object
    # the write that ends the append: the whole object's PUT, or the multipart upload's completing POST
    proxy.inject("lost", 1, method="POST" if size else "PUT", path_part="metrics.jsonl" + ("?uploadId" if size else ""))
    try:
        store.append_line(key, "third")
        assert proxy.faults_served == 1
    finally:
        proxy.inject(None, 0)
    assert stored(raw, bucket, key) == head + b"first\nsecond\nthird\n"
    store.append_line(key, "fourth")
    assert store.read_bytes(key) == head + b"first\nsecond\nthird\nfourth\n"


def test_tampered_objects_fail_their_checksum(bucket, raw, tmp_path):
    store = make_store(bucket, tmp_path)
    store.write_text("r1/state.json", '{"iteration": 3}')
    old = raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/state.json")["Metadata"]
    raw.put_object(Bucket=bucket, Key=f"{PREFIX}/r1/state.json", Body=b'{"iteration": 9}', Metadata=old)
    with pytest.raises(StoreError, match=f"s3://{bucket}/{PREFIX}/r1/state.json: sha256 mismatch"):
        store.read_text("r1/state.json")

    store.put_dir("r1/ckpt", make_tree(tmp_path / "src", {"model.bin": b"good weights"}))
    old = raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/ckpt/model.bin")["Metadata"]
    raw.put_object(Bucket=bucket, Key=f"{PREFIX}/r1/ckpt/model.bin", Body=b"evil weights", Metadata=old)
    with pytest.raises(StoreError, match="r1/ckpt/model.bin: sha256 mismatch"):
        store.local_dir("r1/ckpt")

    raw.put_object(Bucket=bucket, Key=f"{PREFIX}/r1/foreign.txt", Body=b"written by another tool")
    assert store.read_text("r1/foreign.txt") == "written by another tool"  # no metadata: accepted unverified


def test_read_lines_streams_an_object_and_checks_it_at_the_end(bucket, raw, tmp_path, monkeypatch):
    import tailflow.engines.store.s3 as s3_module

    monkeypatch.setattr(s3_module, "LINE_CHUNK", 7)  # lines cut across chunks, and a chunk holding several
    lines = ['{"iteration": 0}\n', "\n", '{"iteration": 1, "name": "ü"}\n', "no newline at the end"]
    for store in (make_store(bucket, tmp_path), LocalStore(tmp_path / "local")):
        store.write_text("r1/metrics.jsonl", "".join(lines))
        assert list(store.read_lines("r1/metrics.jsonl")) == lines
        with pytest.raises(FileNotFoundError, match="r1/absent.jsonl"):
            list(store.read_lines("r1/absent.jsonl"))

    store = make_store(bucket, tmp_path)
    old = raw.head_object(Bucket=bucket, Key=f"{PREFIX}/r1/metrics.jsonl")["Metadata"]
    raw.put_object(Bucket=bucket, Key=f"{PREFIX}/r1/metrics.jsonl", Body=b"a\nb\n", Metadata=old)
    read = []
    with pytest.raises(StoreError, match=f"s3://{bucket}/{PREFIX}/r1/metrics.jsonl: sha256 mismatch"):
        read.extend(store.read_lines("r1/metrics.jsonl"))
    assert read == ["a\n", "b\n"]  # said at the end: what came before it was yielded


@pytest.mark.parametrize("fault", ["503", "reset"])
def test_transient_faults_are_retried(fault, bucket, raw, proxy, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = make_store(bucket, tmp_path)
    proxy.inject(fault, 3)
    store.write_text("r1/config.yaml", "a: 1\n")
    assert proxy.faults_served == 3
    assert stored(raw, bucket, "r1/config.yaml") == b"a: 1\n"
    proxy.inject(fault, 3)
    assert store.read_text("r1/config.yaml") == "a: 1\n"
    assert proxy.faults_served == 3

    files = {"model.bin": b"w" * 4096, "sub/a.txt": b"a"}
    proxy.inject(fault, 4)
    store.put_dir("r1/ckpt", make_tree(tmp_path / "src", files))
    proxy.inject(fault, 4)
    local = store.local_dir("r1/ckpt")
    assert proxy.faults_served == 4
    assert {p.relative_to(local).as_posix(): p.read_bytes() for p in local.rglob("*") if p.is_file()} == files
    assert stored(raw, bucket, "r1/ckpt/model.bin") == files["model.bin"]


@pytest.mark.parametrize("fault", ["503", "reset", "stall"])
def test_faults_that_never_stop_end_in_a_store_error(fault, bucket, proxy, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    store = make_store(bucket, tmp_path, max_attempts=2, connect_timeout=0.5, read_timeout=0.5)
    proxy.inject(fault, FOREVER)
    with pytest.raises(StoreError, match=f"s3://{bucket}/{PREFIX}/r1/config.yaml: "):
        store.write_text("r1/config.yaml", "a: 1\n")
    with pytest.raises(StoreError, match=f"s3://{bucket}/{PREFIX}/r1/config.yaml: "):
        store.read_text("r1/config.yaml")
    # bounded by count, not by the clock: each operation gives up after 1 try + max_attempts=2 retries
    assert proxy.faults_served == 2 * 3


def test_missing_bucket_and_unreachable_endpoint(aws_env, monkeypatch, tmp_path):
    store = make_store("tf-no-such-bucket", tmp_path)
    with pytest.raises(StoreError, match=f"s3://tf-no-such-bucket/{PREFIX}/x.txt: .*NoSuchBucket"):
        store.write_text("x.txt", "x")
    with pytest.raises(StoreError, match="NoSuchBucket"):
        store.exists("x.txt")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    store = make_store("tf-bucket", tmp_path, max_attempts=2, connect_timeout=0.5)
    with pytest.raises(StoreError, match=r"s3://tf-bucket/runs/exp/x.txt: Could not connect"):
        store.read_text("x.txt")


def test_s3_delete_prefix_stops_at_the_key(bucket, tmp_path):
    store = make_store(bucket, tmp_path)
    for key in ("r1/ckpt/iter-0/a", "r1/ckpt/iter-0/b/c", "r1/ckpt/iter-00/a", "r1/ckpt/iter-1/a"):
        store.write_text(key, "x")
    store.delete_prefix("r1/ckpt/iter-0")
    store.delete_prefix("r1/ckpt/never-written")
    assert store.list_dir("r1/ckpt") == ["iter-00", "iter-1"]
    with pytest.raises(StoreError, match="refusing"):
        store.delete_prefix("")


def test_open_store_reads_the_uri(aws_env, tmp_path):
    store = open_store("s3://bucket/some/prefix")
    assert isinstance(store, S3Store) and store.uri("k") == "s3://bucket/some/prefix/k"
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    with pytest.raises(StoreError, match="storage.uri"):
        open_store("s3://")


def test_local_delete_prefix(tmp_path):
    store = LocalStore(tmp_path / "root")
    store.write_text("r1/ckpt/iter-0/model.bin", "w")
    store.write_text("r1/ckpt/iter-1/model.bin", "w")
    store.delete_prefix("r1/ckpt/iter-0")
    store.delete_prefix("r1/ckpt/never-written")
    assert store.list_dir("r1/ckpt") == ["iter-1"]
    for root_key in ("", ".", "r1/.."):
        with pytest.raises(StoreError, match="refusing"):
            store.delete_prefix(root_key)
    with pytest.raises(StoreError, match="not a directory"):
        store.delete_prefix("r1/ckpt/iter-1/model.bin")
    assert store.exists("r1/ckpt/iter-1/model.bin")
