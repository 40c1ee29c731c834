"""A real local multi-node Ray cluster for tests: a head without sandbox capacity and `nodes`
nodes with one `sandbox_host` each (Ray's `cluster_utils.Cluster`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray.cluster_utils import Cluster


@contextmanager
def local_cluster(nodes: int) -> Iterator[tuple[Cluster, list]]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    added = [c.add_node(num_cpus=1, resources={"sandbox_host": 1}) for _ in range(nodes)]
    ray.init(address=c.address, log_to_driver=False)
    try:
        c.wait_for_nodes()
        yield c, added
    finally:
        ray.shutdown()
        c.shutdown()
