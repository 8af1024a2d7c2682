"""The data-parallel launcher's plan, without starting anything: which devices each replica gets, the command
line each replica runs (the launcher's flags stripped, everything else passed on), and the router's."""

from __future__ import annotations

import argparse

import pytest

from jaxinfer.server import data_parallel as dp
from jaxinfer.server import launch


def _parse(argv):
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    return parser, parser.parse_args(argv)


def test_cpu_cores_split_evenly_and_disjoint():
    plans = dp.plan_replicas(2, [9001, 9002], devices_per_replica=None, tensor_parallel_size=1, gpus=[],
                             cpus=[0, 1, 2, 3, 4])
    assert [p.cpus for p in plans] == [(0, 1), (2, 3)]
    assert [p.url for p in plans] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert all(p.cuda_visible_devices is None for p in plans)


def test_gpus_per_replica_default_to_the_tp_size():
    plans = dp.plan_replicas(2, [1, 2], devices_per_replica=None, tensor_parallel_size=2, gpus=list("0123"),
                             cpus=[0])
    assert [p.cuda_visible_devices for p in plans] == ["0,1", "2,3"] and all(p.cpus is None for p in plans)
    with pytest.raises(ValueError, match="need 6 GPUs; 4 are visible"):
        dp.plan_replicas(3, [1, 2, 3], devices_per_replica=2, tensor_parallel_size=1, gpus=list("0123"), cpus=[0])


def test_more_replicas_than_cores_is_refused():
    with pytest.raises(ValueError, match="at least 3 CPU cores"):
        dp.plan_replicas(3, [1, 2, 3], devices_per_replica=None, tensor_parallel_size=1, gpus=[], cpus=[0, 1])


def test_replica_argv_passes_engine_and_server_flags_but_not_the_launchers():
    parser, args = _parse(["random:llama-tiny", "--data-parallel-size", "2", "--port", "8000", "--host", "0.0.0.0",
                           "--router-policy", "round_robin", "--max-num-seqs", "8", "--no-enable-prefix-caching",
                           "--strict-fields", "--api-key", "k", "--speculative-config", '{"method": "ngram"}',
                           "--router-args", "--cache-threshold 0.5"])
    plan = dp.ReplicaPlan(rank=1, port=9002, cpus=(1,))
    argv = dp.replica_argv(parser, args, plan)
    assert argv[1:5] == ["-m", "jaxinfer.cli", "serve", "random:llama-tiny"]
    rest = argv[5:]
    assert rest[-6:] == ["--host", "127.0.0.1", "--port", "9002", "--data-parallel-rank", "1"]
    for flag in ("--max-num-seqs", "--no-enable-prefix-caching", "--strict-fields", "--api-key",
                 "--speculative-config"):
        assert flag in rest
    assert rest[rest.index("--max-num-seqs") + 1] == "8"
    assert rest[rest.index("--speculative-config") + 1] == '{"method": "ngram"}'
    for flag in ("--data-parallel-size", "--router-policy", "--router-args", "0.0.0.0", "8000"):
        assert flag not in rest
    # what the replica would parse is the launcher's configuration, on its own port and rank
    _, replica = _parse(rest)
    assert replica.max_num_seqs == 8 and replica.enable_prefix_caching is False and replica.port == 9002
    assert replica.data_parallel_size == 1 and not dp.uses_router(replica)


def test_router_argv():
    argv = dp.router_argv("/bin/smg", "0.0.0.0", 8000, ["http://127.0.0.1:1", "http://127.0.0.1:2"], "cache_aware",
                          "--cache-threshold 0.5", graceful_s=30)
    assert argv == ["/bin/smg", "launch", "--host", "0.0.0.0", "--port", "8000", "--worker-urls",
                    "http://127.0.0.1:1", "http://127.0.0.1:2", "--policy", "cache_aware",
                    "--shutdown-grace-period-secs", "30", *dp.ROUTER_DEFAULTS, "--cache-threshold", "0.5"]


def test_free_ports_are_distinct():
    ports = dp.free_ports(4)
    assert len(set(ports)) == 4 and all(p > 0 for p in ports)
