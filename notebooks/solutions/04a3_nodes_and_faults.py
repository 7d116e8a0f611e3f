"""Solutions to lesson 04a3's exercises.

Run: python notebooks/solutions/04a3_nodes_and_faults.py"""
from trainup import distributed


def worker_envs(nnodes=2, nproc_per_node=4, master_addr="node0", master_port=29500):
    """Exercise 1: what torchrun sets for each worker of a static rendezvous on nodes of equal
    size. Its agents give node g the global ranks from g * nproc_per_node up to
    (g + 1) * nproc_per_node - 1, in the order of the local ranks
    (torch/distributed/elastic/agent/server/api.py, _assign_worker_ranks)."""
    envs = []
    for node in range(nnodes):
        for local in range(nproc_per_node):
            envs.append(dict(RANK=str(node * nproc_per_node + local), LOCAL_RANK=str(local),
                             GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(nnodes),
                             WORLD_SIZE=str(nnodes * nproc_per_node),
                             LOCAL_WORLD_SIZE=str(nproc_per_node), MASTER_ADDR=master_addr,
                             MASTER_PORT=str(master_port), TORCHELASTIC_RUN_ID="job"))
    return envs


def check_placement(nnodes=2, nproc_per_node=4):
    """Every worker read back by trainup.distributed.from_env: its rank, local rank and node; every
    rank of the job taken once. Returns the (rank, node, local rank) of each worker."""
    placed = []
    for env in worker_envs(nnodes, nproc_per_node):
        c = distributed.from_env(env)
        assert c.launcher == "torchrun" and c.world_size == nnodes * nproc_per_node, c
        assert (c.rank, c.local_rank, c.node_rank) == (
            int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["GROUP_RANK"])), c
        placed.append((c.rank, c.node_rank, c.local_rank))
    assert sorted(r for r, _, _ in placed) == list(range(nnodes * nproc_per_node))
    return placed


if __name__ == "__main__":
    for rank, node, local in check_placement():
        print(f"rank {rank}: node {node}, local rank {local}")
