"""Scratch measurement (issue 27): the machine's CPU to start the multinode tests' Ray
cluster (two emulated nodes of 2 CPUs, as tests/multinode/conftest.py) and over 30 s of it
idle, from /proc/stat (all processes). Prints one JSON line. Run on a quiet machine:
`.venv/bin/python docs/results/ray_idle_cpu.py`."""

import json
import time


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return sum(x for i, x in enumerate(fields) if i not in (3, 4)) / 100  # all but idle, iowait


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2, "object_store_memory": 100 * 2**20}
    c0, t0 = machine_cpu_s(), time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False, "_system_config": {"worker_niceness": 0}},
    )
    ray.init(address=cluster.address, include_dashboard=False)
    cluster.add_node(**node)
    cluster.wait_for_nodes()
    c1, t1 = machine_cpu_s(), time.monotonic()
    time.sleep(30)
    c2 = machine_cpu_s()
    ray.shutdown()
    cluster.shutdown()
    print(
        json.dumps(
            {
                "start_wall_s": round(t1 - t0, 1),
                "start_cpu_s": round(c1 - c0, 1),
                "idle_cores": round((c2 - c1) / 30, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
