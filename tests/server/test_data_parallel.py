"""``jaxinfer serve --data-parallel-size 2``: two replicas (one core each) behind a real SMG router on loopback.
One launcher for the module: requests sharing a prefix land on one replica, SMG reads the replicas' load from
their ``vllm:`` gauges, each replica's KV-cache events (on the configured port plus its rank) hold the blocks of
the tenants routed to it and none of the other's, a replica killed mid-run costs no request that was not on it
and comes back, no KV block leaks on the survivor, and SIGTERM drains everything with exit status 0 (the last
test)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
from jaxinfer.core.block_manager import chain_hash  # noqa: E402
from jaxinfer.server import data_parallel as dp  # noqa: E402

kv = pytest.importorskip("tests.kv_events_client")

if not (Path(sys.executable).parent / "smg").exists():
    pytest.skip("SMG (PyPI smg, in the test extra) is not installed", allow_module_level=True)
if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("two replicas need two cores", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--max-model-len", "1024", "--seed", "0"]
DOCS = [Path(os.__file__).parent / name for name in ("textwrap.py", "csv.py", "heapq.py")]


def _subscribers() -> list:
    """SUB sockets on two consecutive free loopback ports: replica r's publisher connects to the base + r."""
    for _ in range(20):
        first = kv.Subscriber(b"kv-events")
        try:
            return [first, kv.Subscriber(b"kv-events", port=int(first.endpoint.rsplit(":", 1)[1]) + 1)]
        except kv.zmq.ZMQError:  # the next port is taken: try another pair
            first.close()
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    port = dp.free_ports(1)[0]
    subs = _subscribers()
    events = {"enable_kv_cache_events": True, "endpoint": subs[0].endpoint, "topic": "kv-events"}
    log_path = tmp_path_factory.mktemp("dp") / "launcher.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "jaxinfer.cli", "serve", "--data-parallel-size", "2",
                             "--port", str(port), "--router-args", "--load-monitor-interval 1",
                             "--kv-events-config", json.dumps(events), *ENGINE],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while "the router reports all 2 replicas healthy" not in log_path.read_text():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "the launcher did not become ready"
        time.sleep(0.5)
    replicas = dict(re.findall(r"replica (\d) \(pid \d+\): (http://127\.0\.0\.1:\d+)", log_path.read_text()))
    for sub in subs:
        sub.wait_connected()
    yield {"proc": proc, "url": url, "log": log_path, "replicas": [replicas["0"], replicas["1"]], "subs": subs,
           "tenants": {}}
    if proc.poll() is None:
        proc.kill()
        proc.wait(60)
    log.close()
    for sub in subs:
        sub.close()


def _served(replica: str) -> float:
    text = httpx.get(replica + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^vllm:request_success_total\{[^}]*\} (\S+)$', text, re.M))


def _gauge(replica: str, name: str) -> float:
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", httpx.get(replica + "/metrics", timeout=10).text, re.M)
    return float(m.group(1))


def _complete(url: str, prompt: str, max_tokens: int = 8, timeout: float = 120) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": "jaxinfer-default", "prompt": prompt,
                                                     "max_tokens": max_tokens, "temperature": 0.0,
                                                     "ignore_eos": True}, timeout=timeout)


def test_each_tenant_lands_on_one_replica(cluster):
    url, replicas = cluster["url"], cluster["replicas"]
    for k, doc in enumerate(DOCS):
        text = doc.read_text()[:1500]  # a few hundred tokens shared by the tenant's requests
        where = []
        for i in range(3):
            before = [_served(r) for r in replicas]
            r = _complete(url, f"{text}\n# question {k}.{i}: what does this do?\n")
            assert r.status_code == 200, r.text
            after = [_served(r) for r in replicas]
            where.append([b - a for a, b in zip(before, after)].index(1.0))
        assert len(set(where)) == 1, f"tenant {k} was served by replicas {where}"
        cluster["tenants"][text] = where[0]


def _prefix_hashes(replica: str, text: str, block_size: int = 16) -> list[bytes]:
    """The chain hashes of the full blocks of ``text``'s tokens, as the replica's prefix cache names them."""
    ids = httpx.post(replica + "/tokenize", json={"model": "jaxinfer-default", "prompt": text}, timeout=10).json()
    ids = ids["tokens"]
    hashes, parent = [], None
    for i in range(len(ids) // block_size):
        parent = chain_hash(parent, ids[i * block_size : (i + 1) * block_size], None)
        hashes.append(parent)
    return hashes


def test_each_replica_publishes_the_blocks_of_its_own_tenants(cluster):
    assert cluster["tenants"], "needs the routing test's tenants"
    streams = [sub.drain(idle=1.0) for sub in cluster["subs"]]
    cached = []
    for rank, stream in enumerate(streams):
        assert stream or rank not in cluster["tenants"].values(), f"replica {rank} served tenants, sent no event"
        assert [seq for _, seq, _ in stream] == list(range(len(stream)))  # from 0, nothing lost
        assert {kv.decode(p)[2] for _, _, p in stream} == {rank}  # stamped with the replica's rank
        cached.append(kv.rebuild(p for _, _, p in stream))
    for text, rank in cluster["tenants"].items():
        shared = _prefix_hashes(cluster["replicas"][rank], text)[:-1]  # the last block may hold the question
        assert len(shared) >= 8
        assert set(shared) <= cached[rank], f"replica {rank} served a tenant but did not publish its blocks"
        assert not set(shared) & cached[1 - rank], "the other replica published a tenant it never served"


def test_router_reads_the_replicas_load_from_their_vllm_gauges(cluster):
    url, replicas = cluster["url"], cluster["replicas"]
    with cf.ThreadPoolExecutor(1) as ex:
        long = ex.submit(_complete, url, "def long_answer():", 600)
        seen = 0
        deadline = time.monotonic() + 30
        while not long.done() and time.monotonic() < deadline and not seen:
            loads = httpx.get(url + "/get_loads", timeout=10).json()
            assert {entry["worker"] for entry in loads["loads"]} == set(replicas)
            seen = sum(entry.get("num_running_reqs", 0) for entry in loads["loads"])
            time.sleep(0.3)
        assert long.result().status_code == 200
    assert seen >= 1, "SMG never saw the running request in the replicas' gauges"


def test_a_killed_replica_is_routed_around_restarted_and_leaks_nothing(cluster):
    url, replicas, log = cluster["url"], cluster["replicas"], cluster["log"]
    pid = int(re.findall(r"replica 1 \(pid (\d+)\)", log.read_text())[-1])
    prompts = [f"{doc.read_text()[:800]}\n# request {i}\n" for i, doc in enumerate(DOCS * 2)]
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        futures = [ex.submit(_complete, url, p, 48) for p in prompts]
        time.sleep(1.0)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        results = [f.result() for f in futures]
    # a request on the killed replica is retried by SMG (its connection failed) or fails with a clear error
    for r in results:
        assert r.status_code == 200 or "error" in r.json(), r.text
    assert sum(r.status_code == 200 for r in results) >= len(results) // 2
    ok_after = [_complete(url, "import os\n").status_code for _ in range(4)]
    assert ok_after == [200] * 4 and time.monotonic() - killed_at < 60
    deadline = time.monotonic() + 600  # the launcher brings it back and SMG routes to it again
    while not (f"replica 1 restarted" in log.read_text() and dp.http_ok(replicas[1] + "/health")
               and dp.router_ready(url, 2)):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(1)
    assert _gauge(replicas[0], "kv_cache_usage_perc") == 0.0  # the survivor's blocks are all free again
    assert _gauge(replicas[0], "num_requests_running") == 0.0


def test_sigterm_drains_the_router_and_the_replicas_and_exits_0(cluster):
    proc, url = cluster["proc"], cluster["url"]
    with cf.ThreadPoolExecutor(1) as ex:
        inflight = ex.submit(_complete, url, "class Parser:", 200)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert inflight.result().status_code == 200
    assert proc.wait(180) == 0
    assert "stopped: exit statuses router 0, replicas [0, 0]" in cluster["log"].read_text()
